"""Small user-style workloads for the tuner's tests: fast, off the CPU, stalling, short epochs,
leaky, ramping, settling, hanging, raising, dying.

They are real workloads (real datasets, real DataLoader workers); each misbehaves the way user
code does in the field, so the supervisor and the guard are tested against the real thing.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import shutil
import signal
import time
from typing import ClassVar

import torch
from torch.utils.data import Dataset

from objectives import Workload


class Vectors(Dataset):
    """Cheap samples with a little CPU work per item, so workers matter a bit."""

    def __init__(self, size: int = 512, width: int = 64, work: int = 0) -> None:
        self.size, self.width, self.work = size, width, work

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        generator = torch.Generator().manual_seed(index)
        sample = torch.rand(self.width, generator=generator)
        for _ in range(self.work):
            sample = torch.tanh(sample * 1.01)
        return sample, index % 10


class Slow(Vectors):
    """5 ms a sample: a batch takes a visible while, so a test can catch each phase of a study."""

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        time.sleep(0.005)
        return super().__getitem__(index)


class Stalling(Vectors):
    """Every ``every``-th sample a process fetches waits ``stall_s`` first, as a storage hiccup
    does: an uneven fetch, which a deeper prefetch queue can ride out."""

    def __init__(self, every: int = 40, stall_s: float = 0.1, size: int = 512) -> None:
        super().__init__(size=size)
        self.every, self.stall_s = every, stall_s
        self._fetched = 0

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        self._fetched += 1
        if self._fetched % self.every == 0:
            time.sleep(self.stall_s)
        return super().__getitem__(index)


class Leaky(Vectors):
    """Each worker keeps 4 MiB more for every sample it loads (64 MiB per batch of 16): a leak
    like a growing cache. With ``blocks``, it keeps only its first ``blocks`` samples' worth:
    memory climbs fast for a moment, as a worker's start and first batches do, then holds."""

    def __init__(self, blocks: int | None = None, sleep_s: float = 0.005) -> None:
        super().__init__(size=10_000)
        self.blocks, self.sleep_s = blocks, sleep_s
        self._kept: list[bytearray] = []

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        if self.blocks is None or len(self._kept) < self.blocks:
            block = bytearray(4 * 2**20)
            block[::4096] = b"x" * len(block[::4096])
            self._kept.append(block)
        time.sleep(self.sleep_s)
        return super().__getitem__(index)


class Settling(Vectors):
    """Keeps a block for each sample, each 1.5% smaller than the last, from 4 MiB down to 64 KiB:
    memory climbs fast, slows down and holds (about 250 MiB after 2 s), as a first large batch
    being built in the main process does."""

    def __init__(self) -> None:
        super().__init__(size=10_000)
        self._kept: list[bytearray] = []
        self._block_bytes = 4.0 * 2**20

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        if self._block_bytes >= 64 * 2**10:
            block = bytearray(int(self._block_bytes))
            block[::4096] = b"x" * len(block[::4096])
            self._kept.append(block)
            self._block_bytes *= 0.985
        time.sleep(0.01)
        return super().__getitem__(index)


class Hanging(Vectors):
    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        time.sleep(3600)
        return super().__getitem__(index)


class Raising(Vectors):
    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        raise OSError(f"cannot read sample {index}: corrupt file")


class SelfKilling(Vectors):
    """A worker that SIGKILLs itself, as the kernel's OOM killer would."""

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        info = torch.utils.data.get_worker_info()
        if info is not None and index % 7 == 3:
            os.kill(os.getpid(), signal.SIGKILL)
        return super().__getitem__(index)


def _sum_step(batch: tuple[torch.Tensor, torch.Tensor], device: torch.device) -> None:
    batch[0].sum().item()


def fast() -> Workload:
    return Workload(
        name="fast",
        dataset=Vectors(),
        step=_sum_step,
        default_batch_size=32,
        batch_size_range=(8, 64),
    )


SPIKE_BYTES = 512 * 2**20


class _SpikeOnceStep:
    """A step whose third call holds ``spike_bytes`` of activations for a few milliseconds, then
    calls that take 20 ms: a peak the guard's readings, 0.2 s apart, can miss (they held 161,
    161, 192 and 186 MiB of a 192 MiB spike in four runs; the trial's own peak, 192 each). The
    spike stacks on the process at rest, 16 MiB under its startup's peak in CI: 512 MiB keeps
    that within the test's margin."""

    def __init__(self, device: torch.device, spike_bytes: int = SPIKE_BYTES) -> None:
        self.spike_bytes = spike_bytes
        self.calls = 0

    def __call__(self, batch: object) -> None:
        self.calls += 1
        if self.calls == 3 and self.spike_bytes:
            activations = torch.ones(self.spike_bytes // 4)  # written whole: resident
            activations.sum().item()
            del activations
        time.sleep(0.02)

    def optimizer_step(self) -> None:
        return None


def spiking() -> Workload:
    return dataclasses.replace(
        _one_batch_size("spiking", Vectors(), batch=8), step=None, make_step=_SpikeOnceStep
    )


def spiking_twin() -> Workload:
    """:func:`spiking` without its spike."""
    return dataclasses.replace(
        spiking(), make_step=functools.partial(_SpikeOnceStep, spike_bytes=0)
    )


def _sleeping_step(batch: tuple[torch.Tensor, torch.Tensor], device: torch.device) -> None:
    """A step that leaves the CPU idle, as a CUDA step does while the host waits on the device
    (or a remote service's call): 2 ms a batch and 0.1 ms a sample of wall time, no CPU."""
    time.sleep(0.002 + 0.0001 * len(batch[0]))


def off_cpu() -> Workload:
    """Samples decoded on the CPU in the workers (a little arithmetic per sample), a step off the
    CPU: the workers should get the cores, the main process's threads have nothing to do."""
    return Workload(
        name="off_cpu",
        dataset=Vectors(size=2048, work=200),
        step=_sleeping_step,
        default_batch_size=32,
        batch_size_range=(16, 64),
    )


def slow() -> Workload:
    return Workload(
        name="slow",
        dataset=Slow(),
        step=_sum_step,
        default_batch_size=32,
        batch_size_range=(8, 64),
    )


def deaf_to_sigterm() -> Workload:
    """:func:`slow` in a trial child that ignores SIGTERM: the supervisor's kill then waits its
    whole grace for SIGKILL, a clean-up that lasts while a test signals the study again."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    return slow()


def _one_batch_size(name: str, dataset: Dataset, batch: int = 8) -> Workload:
    """A workload that runs at one batch size: what it tests is the process, not the search."""
    return Workload(
        name=name,
        dataset=dataset,
        step=_sum_step,
        default_batch_size=batch,
        batch_size_range=(batch, batch),
    )


def short_epochs() -> Workload:
    """256 samples of 5 ms each at one batch size: workers pay, and an epoch of 16 batches lasts
    a fraction of a second, so starting its workers again each epoch costs a material share of
    it: ``persistent_workers`` can change the result."""
    return _one_batch_size("short_epochs", Slow(size=256), batch=16)


def leaky() -> Workload:
    return _one_batch_size("leaky", Leaky(), batch=16)


def ramping() -> Workload:
    """96 MiB kept per worker, in its first 24 samples."""
    return _one_batch_size("ramping", Leaky(blocks=24, sleep_s=0.002))


def settling() -> Workload:
    """Memory that ramps for about 2 s in the main process (no workers), then holds."""
    return _one_batch_size("settling", Settling())


def hanging() -> Workload:
    return _one_batch_size("hanging", Hanging())


def raising() -> Workload:
    return _one_batch_size("raising", Raising())


def self_killing() -> Workload:
    return _one_batch_size("self_killing", SelfKilling())


SHM_FILE_PREFIX = "tuner-tests-shm-fill-"
"""Files :class:`ShmFilling` leaves in /dev/shm; whoever runs it removes them afterwards."""


SHM_FILL_SHARE = 8
"""Each process of :class:`ShmFilling` writes at most this fraction (1/8) of what was free."""


class ShmFilling(Vectors):
    """Each worker writes 2 MiB into /dev/shm per sample, as a leaking shared-memory cache would.

    It stops at 256 MiB per process, or an eighth of what /dev/shm had free when the dataset was
    built (Docker's default is 64 MiB), so a guard that fails to act cannot fill the tmpfs.
    """

    def __init__(self, directory: str = "/dev/shm", cap_bytes: int = 256 * 2**20) -> None:
        super().__init__(size=10_000)
        free = shutil.disk_usage(directory).free
        self.directory, self.cap_bytes = directory, min(cap_bytes, free // SHM_FILL_SHARE)
        self._written = 0

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        if self._written < self.cap_bytes:
            name = f"{SHM_FILE_PREFIX}{os.getpid()}-{index}"
            with open(os.path.join(self.directory, name), "wb") as file:
                file.write(b"s" * 2**21)
            self._written += 2**21
        time.sleep(0.01)
        return super().__getitem__(index)


def shm_filling() -> Workload:
    return Workload(
        name="shm_filling", dataset=ShmFilling(), step=_sum_step, batch_size_range=(8, 8)
    )


class Heavy(Vectors):
    """8 MiB samples: a batch of 64 needs over a GiB once collated, so the probe meets a wall."""

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return torch.full((2 * 2**20,), float(index)), index % 10


def heavy() -> Workload:
    return Workload(
        name="heavy",
        dataset=Heavy(size=256),
        step=_sum_step,
        default_batch_size=8,
        batch_size_range=(4, 128),
    )


def stacking_collate(batch: list[tuple[torch.Tensor, int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """What the ``collate=stacked`` knob of :func:`knobbed` collates with."""
    return torch.stack([sample for sample, _ in batch]), torch.tensor([y for _, y in batch])


def sleepy_collate(batch: list[tuple[torch.Tensor, int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """The default of :func:`knobbed`'s knob: 0.1 s per batch, far slower than the other."""
    time.sleep(0.1)
    return stacking_collate(batch)


_COLLATES = {"sleepy": sleepy_collate, "stacked": stacking_collate}


def _knobbed(*, collate: str) -> Workload:
    return Workload(
        name="knobbed",
        dataset=Vectors(),
        collate_fn=_COLLATES[collate],
        step=_sum_step,
        default_batch_size=32,
        batch_size_range=(8, 64),
        knobs={"collate": tuple(_COLLATES)},
        configure=_knobbed,
    )


def knobbed() -> Workload:
    """The fast workload with a knob of its own, applied by ``configure`` as the image one is.

    Its knob's default is ``sleepy``; a study fixing ``collate=stacked`` runs every trial, the
    baselines too, with the other value, so its best is away from the default.
    """
    return _knobbed(collate="sleepy")


# --- bad input: workloads that are wrong rather than unlucky (tests/test_bad_input.py) ---------


def _raising_step(batch: tuple[torch.Tensor, torch.Tensor], device: torch.device) -> None:
    raise RuntimeError("loss is NaN at step 1")


def raising_step() -> Workload:
    return Workload(
        name="raising_step", dataset=Vectors(), step=_raising_step, batch_size_range=(8, 8)
    )


def empty() -> Workload:
    return Workload(name="empty", dataset=Vectors(size=0), step=_sum_step, batch_size_range=(8, 8))


class Words(Vectors):
    """Samples that are strings: the default collate makes lists of str, not tensors."""

    def __getitem__(self, index: int) -> str:  # type: ignore[override]
        return f"sample-{index}"


def _ignore_step(batch: object, device: torch.device) -> None:
    pass


def not_tensors() -> Workload:
    return Workload(name="not_tensors", dataset=Words(), step=_ignore_step, batch_size_range=(8, 8))


class Nothing(torch.utils.data.IterableDataset):
    """An iterable dataset whose epochs are empty: the DataLoader never yields a batch."""

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(())


def no_batch() -> Workload:
    return Workload(name="no_batch", dataset=Nothing(), step=_sum_step, batch_size_range=(8, 8))


def not_a_workload() -> None:
    """A factory that forgot to return its Workload."""


# --- ranks per node (tests/tuner_tests/test_ranks.py) ------------------------------------------


def _rank_one_raising_step(batch: tuple[torch.Tensor, torch.Tensor], device: torch.device) -> None:
    if os.environ.get("RANK") == "1":
        raise RuntimeError("rank 1's loss is NaN")


def rank_one_raising() -> Workload:
    """A step that fails in rank 1 only: the whole multi-rank trial fails with its error."""
    return Workload(
        name="rank_one_raising", dataset=Vectors(), step=_rank_one_raising_step,
        batch_size_range=(8, 8),
    )  # fmt: skip


def _rank_one_dying_step(batch: tuple[torch.Tensor, torch.Tensor], device: torch.device) -> None:
    if os.environ.get("RANK") == "1":
        os.kill(os.getpid(), signal.SIGKILL)  # as the OOM killer would


def rank_one_dying() -> Workload:
    """A step that SIGKILLs rank 1: the trial is pruned as a killed process is."""
    return Workload(
        name="rank_one_dying", dataset=Vectors(), step=_rank_one_dying_step,
        batch_size_range=(8, 8),
    )  # fmt: skip


def own_sampler() -> Workload:
    """A workload with its own sampler, which the tuner cannot shard over ranks."""
    dataset = Vectors()
    return Workload(
        name="own_sampler", dataset=dataset, step=_sum_step,
        sampler=torch.utils.data.SequentialSampler(dataset),
    )  # fmt: skip


# --- the model under DDP in each rank (tests/tuner_tests/test_ddp.py) ---------------------------


class LinearStep:
    """Cross entropy and SGD on ``model``; every module a step trains in this process is kept
    in :attr:`trained`, so a rank can report its parameters after the measurement."""

    trained: ClassVar[list[torch.nn.Module]] = []

    def __init__(self, device: torch.device, model: torch.nn.Module) -> None:
        self.model = model.to(device)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)
        LinearStep.trained.append(model)

    def __call__(self, batch: tuple[torch.Tensor, torch.Tensor]) -> None:
        features, labels = batch
        if os.environ.get("RANK") == "1" and os.environ.get("TUNER_TEST_RANK_ONE") == "raise":
            raise RuntimeError("rank 1's loss is NaN")
        if os.environ.get("RANK") == "1" and os.environ.get("TUNER_TEST_RANK_ONE") == "die":
            os.kill(os.getpid(), signal.SIGKILL)
        torch.nn.functional.cross_entropy(self.model(features), labels).backward()

    def optimizer_step(self) -> None:
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)


def _linear_model() -> torch.nn.Module:
    return torch.nn.Linear(64, 10)


def linear() -> Workload:
    """A model handed over: each rank trains it under DDP."""
    return Workload(
        name="linear", dataset=Vectors(), make_step=LinearStep, model=_linear_model(),
        batch_size_range=(8, 64),
    )  # fmt: skip


def _own_linear_step(model: torch.nn.Module, device: torch.device) -> LinearStep:
    return LinearStep(device, model)


def linear_step_only() -> Workload:
    """The same model kept inside the step: each rank trains its own copy, no all-reduce."""
    return Workload(
        name="linear_step_only", dataset=Vectors(),
        make_step=functools.partial(_own_linear_step, _linear_model()), batch_size_range=(8, 64),
    )  # fmt: skip
