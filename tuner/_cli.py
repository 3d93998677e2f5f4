"""What every ``python -m tuner.<verb>`` shares: flag names, one-line errors, exit codes.

Exit codes follow Optuna's CLI habits: 2 for a usage error (bad flag, unknown profile, storage
that cannot be opened), 1 for "nothing to show" (no study, no finished trial).
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

import optuna

from objectives import WorkloadError
from storage import LostConnectionFilter, StorageError, default_storage_url, mask_password
from tuner.machine import ProfileError
from tuner.search._space import SpaceError

__all__ = ["ArgumentParser", "UsageError", "add_common", "run_cli"]

USAGE_ERRORS: tuple[type[Exception], ...] = (StorageError, ProfileError, WorkloadError, SpaceError)


class UsageError(ValueError):
    """A bad argument found after parsing; exit code 2."""


class ArgumentParser(argparse.ArgumentParser):
    """argparse, but an error is one line (no usage dump) and exit code 2."""

    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        raise SystemExit(2)


def add_common(parser: argparse.ArgumentParser, objective: bool = True) -> None:
    """--hardware, --objective, --storage, --study-name, --profiles, as every verb names them."""
    parser.add_argument(
        "--hardware", required=True, help="a profile name from the catalog, or 'auto'"
    )
    if objective:
        parser.add_argument(
            "--objective",
            default="image",
            help="image, text, storage, pkg.module:attr or file.py:attr "
            "(user code: it is imported and run)",
        )
    parser.add_argument(
        "--storage",
        default=None,
        help="database URL (default: $TUNER_STORAGE, else sqlite:///tuner.db)",
    )
    parser.add_argument("--study-name", default=None, help="default: <objective>@<hardware>")
    parser.add_argument("--profiles", default=None, help="a JSON catalog of more hardware profiles")


def add_artifact_dir(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """--artifact-dir: the trials' artifact store, where the study writes it and readers look."""
    parser.add_argument(
        "--artifact-dir",
        default=None,
        help="the trials' artifact store (default: tuner-artifacts/ beside an SQLite file, "
        "else ./tuner-artifacts)",
    )


def storage_url(value: str | None) -> str:
    return value or default_storage_url()


def run_cli(
    prog: str, main: Callable[[Sequence[str] | None], int], argv: Sequence[str] | None = None
) -> NoReturn:
    """Run ``main`` and turn the known errors into one line on stderr and an exit code."""
    from tuner.insight._best import NoResultError
    from tuner.run._config import ConfigError

    logging.basicConfig(level=logging.WARNING, format=f"{prog}: %(message)s")
    for handler in logging.getLogger().handlers:
        handler.addFilter(LostConnectionFilter())  # a server restart: one line, no traceback
    # A CLI's own choice: Optuna's per-trial INFO lines would drown the progress bar.
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        code = main(argv)
    except NoResultError as error:
        print(f"{prog}: {error}", file=sys.stderr)
        code = 1
    except (*USAGE_ERRORS, UsageError, ConfigError) as error:
        print(f"{prog}: error: {mask_password(str(error))}", file=sys.stderr)
        code = 2
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        code = 130
    raise SystemExit(code)
