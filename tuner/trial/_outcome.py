"""How a trial ended, and the classification of the ways a DataLoader setting dies.

The reasons are the ``pruned_reason`` user attr's vocabulary (see the README's table).
"""

from __future__ import annotations

import dataclasses
import signal
from typing import Any, Literal

__all__ = ["TrialOutcome", "classify_error", "classify_exit", "one_line"]

State = Literal["complete", "pruned", "failed"]


@dataclasses.dataclass
class TrialOutcome:
    state: State
    attrs: dict[str, Any] = dataclasses.field(default_factory=dict)
    reason: str | None = None
    error: str | None = None
    artifacts: dict[str, str] = dataclasses.field(default_factory=dict)
    """File name -> text (the telemetry CSVs), attached to the trial before it is told."""


def one_line(error: BaseException) -> str:
    """``Type: message`` on one line, for the ``error`` user attr.

    An exception re-raised from a DataLoader worker carries the worker's whole traceback in
    its message ("Caught OSError in DataLoader worker process 0. Original Traceback ..."); its
    last line, the original ``Type: message``, is what the user needs.
    """
    text = str(error)
    if "Original Traceback" in text and text.strip():
        return " ".join(text.strip().splitlines()[-1].split())
    text = " ".join(text.split())
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def classify_error(error: BaseException) -> str | None:
    """The pruned reason for an exception raised in a trial, or None when it is a real failure."""
    text = str(error)
    lowered = text.lower()
    name = type(error).__name__
    if name == "OutOfMemoryError" or "cuda out of memory" in lowered:
        return "cuda_oom"
    if isinstance(error, MemoryError) or "defaultcpuallocator: can't allocate memory" in lowered:
        return "host_oom"
    shared_memory = "/dev/shm" in lowered or "</torch_" in lowered or "shared memory" in lowered
    if "bus error" in lowered or (shared_memory and "no space left on device" in lowered):
        return "shm_full"
    if "is killed by signal" in lowered or "exited unexpectedly" in lowered:
        return "worker_killed"
    if "dataloader timed out" in lowered:
        return "timeout"
    return None


def classify_exit(exitcode: int | None) -> str:
    """Why a child that sent no result ended: killed by a signal, or exited."""
    if exitcode is not None and exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        if -exitcode == signal.SIGBUS:
            return "shm_full"
        return f"trial_killed: {name}"
    return f"trial_exited: code {exitcode}"
