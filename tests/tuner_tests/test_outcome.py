"""How trial errors and exits are classified: on the texts PyTorch really raises.

The literal messages are PyTorch's own formats (``torch/utils/data/dataloader.py`` and the C++
worker signal handler in ``libtorch_python``); where this CPU-only machine can make PyTorch raise
the error for real, cheaply, the test does that too.
"""

from __future__ import annotations

import contextlib
import faulthandler
import multiprocessing
import os
import resource
import signal
import time
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

from tests.tuner_tests.workloads import Raising, SelfKilling, Vectors
from tuner.trial._outcome import classify_error, classify_exit, one_line

CUDA_OOM = (
    "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 15.77 GiB of "
    "which 1.12 GiB is free. Including non-PyTorch memory, this process has 14.64 GiB memory in "
    "use. Of the allocated memory 13.90 GiB is allocated by PyTorch, and 312.00 MiB is reserved "
    "by PyTorch but unallocated."
)
KILLED = "DataLoader worker (pid 123) is killed by signal: Killed. "
BUS_ERROR = (
    "DataLoader worker (pid 123) is killed by signal: Bus error. It is possible that "
    "dataloader's workers are out of shared memory. Please try to raise your shared memory limit."
)


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (RuntimeError("DataLoader worker (pid(s) 123) exited unexpectedly"), "worker_killed"),
        (RuntimeError("DataLoader worker (pid(s) 123, 124) exited unexpectedly"), "worker_killed"),
        (RuntimeError(KILLED), "worker_killed"),
        (
            RuntimeError("DataLoader worker (pid 123) is killed by signal: Segmentation fault. "),
            "worker_killed",
        ),
        (RuntimeError("DataLoader timed out after 5 seconds"), "timeout"),
        (torch.cuda.OutOfMemoryError(CUDA_OOM), "cuda_oom"),
        (RuntimeError(CUDA_OOM), "cuda_oom"),  # PyTorch before 1.13 raised a plain RuntimeError
        (torch.cuda.OutOfMemoryError(""), "cuda_oom"),
        (
            RuntimeError("unable to write to file </torch_123_456>: No space left on device (28)"),
            "shm_full",
        ),
        (RuntimeError(BUS_ERROR), "shm_full"),  # a bus error, not just any killed worker
        (
            RuntimeError(
                "[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't "
                "allocate memory: you tried to allocate 1125899906842624 bytes. "
                "Error code 12 (Cannot allocate memory)"
            ),
            "host_oom",
        ),
        (MemoryError(), "host_oom"),
        (OSError("cannot read sample 3: corrupt file"), None),
        (ValueError("the DataLoader yields no batch in an epoch"), None),
        (KeyError("label"), None),
    ],
    ids=lambda value: type(value).__name__ if isinstance(value, BaseException) else str(value),
)
def test_classify_error_on_pytorch_messages(error: BaseException, reason: str | None) -> None:
    assert classify_error(error) == reason


def test_a_real_host_allocation_failure_is_host_oom() -> None:
    with pytest.raises(RuntimeError) as raised:
        torch.empty(2**50, dtype=torch.uint8)  # 1 PiB: refused at once, nothing is touched
    assert classify_error(raised.value) == "host_oom"


class _Slow(Vectors):
    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        time.sleep(0.5)
        return super().__getitem__(index)


@contextlib.contextmanager
def workers_shut_down(loader: DataLoader) -> Iterator[Iterator[Any]]:
    """The loader's iterator, its workers shut down on the way out.

    Left to the garbage collector (the raised error's traceback holds it in a cycle), the
    iterator is shut down after its queues' feeders have stopped, so its workers never get
    their stop message and the collector waits 5 s on them, in whichever test runs then.
    """
    iterator = iter(loader)
    try:
        yield iterator
    finally:
        iterator._shutdown_workers()  # type: ignore[attr-defined]


def test_a_real_dataloader_timeout_is_timeout() -> None:
    loader = DataLoader(_Slow(size=4), batch_size=2, num_workers=1, timeout=0.1)
    with workers_shut_down(loader) as batches, pytest.raises(RuntimeError) as raised:
        next(batches)
    assert str(raised.value) == "DataLoader timed out after 0.1 seconds"
    assert classify_error(raised.value) == "timeout"


def test_a_real_worker_that_kills_itself_is_worker_killed() -> None:
    # timeout: the iterator notices the dead worker when a wait ends (else after 5 s).
    loader = DataLoader(SelfKilling(size=64), batch_size=8, num_workers=1, timeout=0.5)
    with workers_shut_down(loader) as batches, pytest.raises(RuntimeError) as raised:
        for _ in batches:
            pass
    # Either the SIGCHLD handler's text or the iterator's, depending on which sees it first.
    assert "DataLoader worker (pid" in str(raised.value)
    assert classify_error(raised.value) == "worker_killed"


def test_a_real_workload_error_is_a_failure_with_its_message() -> None:
    loader = DataLoader(Raising(size=8), batch_size=4, num_workers=1)
    with workers_shut_down(loader) as batches, pytest.raises(OSError) as raised:
        next(batches)
    assert classify_error(raised.value) is None
    line = one_line(raised.value)
    assert line.startswith("OSError: ") and "corrupt file" in line and "\n" not in line


@pytest.mark.parametrize(
    ("exitcode", "reason"),
    [
        (-9, "trial_killed: SIGKILL"),
        (-7, "shm_full"),  # SIGBUS: what touching a full /dev/shm does
        (-15, "trial_killed: SIGTERM"),
        (-11, "trial_killed: SIGSEGV"),
        (1, "trial_exited: code 1"),
        (0, "trial_exited: code 0"),
        (None, "trial_exited: code None"),
    ],
)
def test_classify_exit(exitcode: int | None, reason: str) -> None:
    assert classify_exit(exitcode) == reason


def _die_by(signum: int) -> None:
    faulthandler.disable()  # pytest's, inherited through fork: no traceback for SIGBUS
    if signum != signal.SIGKILL:
        signal.signal(signum, signal.SIG_DFL)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no core file from SIGBUS
    os.kill(os.getpid(), signum)
    time.sleep(10)


@pytest.mark.parametrize(
    ("signum", "reason"), [(signal.SIGKILL, "trial_killed: SIGKILL"), (signal.SIGBUS, "shm_full")]
)
def test_classify_exit_of_a_real_process(signum: int, reason: str) -> None:
    process = multiprocessing.get_context("fork").Process(target=_die_by, args=(signum,))
    process.start()
    process.join(timeout=10)
    assert process.exitcode == -signum
    assert classify_exit(process.exitcode) == reason
