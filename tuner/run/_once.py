"""Facts measured once per study, whichever worker of a fleet gets there first.

The batch-size probe and the ceiling each cost seconds and must agree across a fleet, so each is
a study user attr, measured only where it is missing and written under the study lock after a
fresh read: two workers that measured at the same time keep the first value written, and both
go on with it. The measurement runs outside the lock, so the fleet does not queue behind it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import optuna

from storage import storage_lock, with_retry

__all__ = ["once_per_study"]

T = TypeVar("T")


def once_per_study(
    study: optuna.Study, storage_url: str, key: str, measure: Callable[[], T | None]
) -> Any:
    """The study's ``key`` attr; measured with ``measure()`` and stored when it is missing.

    ``measure`` returning None stores nothing (the fact could not be measured; the next worker
    tries again).
    """
    stored = with_retry(lambda: study.user_attrs, "reading the study")
    if key in stored:
        return stored[key]
    value = measure()
    if value is None:
        return None

    def store() -> Any:
        with storage_lock(storage_url, study.study_name):
            attrs = study.user_attrs  # a fresh read: another worker may have stored it meanwhile
            if key in attrs:
                return attrs[key]
            study.set_user_attr(key, value)
            return value

    return with_retry(store, f"recording {key}")
