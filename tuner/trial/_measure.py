"""The measurement loop: samples/sec of the workload's real training loop under one setting.

Runs inside the trial's child process. What it does is what training does: build the
DataLoader, take a batch, move it to the device (``non_blocking`` when pinned), run the step,
step the optimizer every ``accumulation_steps`` micro-batches, and start a new iterator at each
epoch end, so ``persistent_workers`` pays off exactly as it would. The clock runs over a window
after a warm-up, with the device synchronised at the window's edges; over short epochs the
window counts whole ones (:func:`_run_window`). With a batch sampler,
samples/sec counts each batch at its epoch's mean size (:func:`epoch_mean_batch`). Where the
dataset gives its samples' lengths, the warm-up starts with the epoch's heaviest batch, so the
trial's peak memory is the epoch's (:mod:`tuner.trial._heaviest`). Where the workers are not
persistent and the run crossed no epoch's end, a new epoch starts after the window, so the
peak holds part of what training's second epoch holds (:data:`REFORK_STEPS`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader

from objectives import TrainStep, Workload, move_to_device
from tuner._lifeline import die_with_parent
from tuner.machine import own_peak_memory_bytes
from tuner.search import LoaderSettings
from tuner.trial._heaviest import heaviest_batch
from tuner.trial._telemetry import StepTimeline

__all__ = [
    "Measurement",
    "check_batch",
    "count_samples",
    "epoch_mean_batch",
    "measure",
    "synchronize",
]

REFORK_STEPS = 2
"""Steps run after workers that are not persistent are forked again for a new epoch, for the
peak: the workers fork from a main process whose heap holds the step's batch and activations,
and keep the old pages as the next steps write them again. The window's rate is not changed.
It reads only part of the copies (about half to four fifths on the text workload; more steps
read no more), since they grow with how long the main process ran before the fork. So such a
setting's recorded peak is under what training's later epochs reach, and the memory model does
not fit its copies from it (:mod:`tuner.search._memory_model`)."""

ProgressCallback = Callable[[float, float, float], None]
"""``progress(elapsed_s, samples_per_sec_so_far, data_wait_fraction_so_far)`` in the window."""


@dataclasses.dataclass(frozen=True)
class Measurement:
    samples_per_sec: float
    time_to_first_batch_s: float
    batches: int
    samples: int
    window_s: float
    data_wait_fraction: float
    epochs: int
    device: str
    window_started_at: float
    """The window's start on the supervisor's clock (``time.monotonic``), to align telemetry."""
    timeline: list[list[float]]
    """Per step (merged when long): seconds from the window's first step, data wait, step time
    (over short epochs the counted window starts at an epoch's start, later)."""
    epoch_starts: int = 0
    """New epochs the loader started in the run after its first, window or not, one started
    after the window included (:data:`REFORK_STEPS`): from the second on, workers that are not
    persistent are forked again and copy the step's memory
    (:attr:`~tuner.search.LoaderSettings.reforks_workers`)."""
    epoch_batches: int | None = None
    """Batches in one epoch (``len(loader)``; None for a dataset of unknown length): workers
    beyond it wait idle, since each fetches whole batches (the diagnosis reads it)."""
    own_peak_host_memory_bytes: int | None = None
    """The trial's tree after the window plus how far the main process's RSS has been above
    where it is then (the kernel's high-water mark): a step's transient peak, which the guard's
    readings 0.05-0.2 s apart can fall between (text's 16,384-token step: 521-616 MiB read)."""

    def to_attrs(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def synchronize(device: torch.device) -> None:
    """Wait for queued device work, so a window's edges are real times."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def epoch_mean_batch(workload: Workload, settings: LoaderSettings, seed: int) -> float | None:
    """Mean samples per batch over the first epoch of the workload's batch sampler, or None.

    A batch sampler packs a varying number of samples per batch (the text workload's token
    budget: 16 long sequences or 256 short ones), so which batches fall in a short window would
    decide samples/sec: measured here, 1.5 s windows read 25% above a 12 s run. Counting each
    batch of the window at the epoch's mean size measures what a training run sees over an
    epoch. The plan comes from a second sampler with the same seed, so the measured one is
    untouched.
    """
    if workload.batch_sampler is None:
        return None
    plan = [len(batch) for batch in workload.batch_sampler(workload.dataset, settings.batch, seed)]
    return sum(plan) / len(plan) if plan else None


def _holds_tensor(batch: Any) -> bool:
    if isinstance(batch, torch.Tensor):
        return True
    if isinstance(batch, dict):
        return any(_holds_tensor(value) for value in batch.values())
    if isinstance(batch, list | tuple):
        return any(_holds_tensor(value) for value in batch)
    return False


def check_batch(batch: Any) -> None:
    """Refuse a batch with no tensor in it: there is nothing to move or count, and a
    samples/sec measured on it would mean nothing (strings need a ``collate_fn`` that encodes)."""
    if not _holds_tensor(batch):
        kind = type(batch).__name__
        if isinstance(batch, list | tuple) and batch:
            kind += f" of {type(batch[0]).__name__}"
        raise TypeError(f"the batch holds no tensor ({kind}); give the workload a collate_fn")


def count_samples(batch: Any) -> int:
    """Samples in a batch: the leading dimension of its first tensor."""
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() else 1
    if isinstance(batch, dict):
        return count_samples(next(iter(batch.values()))) if batch else 0
    if isinstance(batch, list | tuple) and batch:
        return count_samples(batch[0])
    return 1


class _EpochLoop:
    """Endless batches, a new iterator at each epoch end, as training does."""

    def __init__(self, loader: DataLoader) -> None:
        self._loader = loader
        self._iterator: Iterator[Any] | None = None
        self.epochs = 0
        self.wait_s = 0.0

    def next(self) -> Any:
        started = time.perf_counter()
        try:
            fresh = False
            while True:
                if self._iterator is None:
                    self._iterator, fresh = iter(self._loader), True
                try:
                    return next(self._iterator)
                except StopIteration:
                    if fresh:
                        raise ValueError("the DataLoader yields no batch in an epoch") from None
                    self._iterator = None
                    self.epochs += 1
        finally:
            self.wait_s += time.perf_counter() - started

    def start_epoch(self) -> None:
        """End this epoch's iterator here, as its end would: the next batch starts a new one."""
        self._shutdown(self._iterator)
        self._iterator = None
        self.epochs += 1

    def close(self) -> None:
        """Shut the workers down now rather than at garbage collection."""
        iterator, self._iterator = self._iterator, None
        self._shutdown(iterator)
        self._shutdown(getattr(self._loader, "_iterator", None))

    @staticmethod
    def _shutdown(iterator: Iterator[Any] | None) -> None:
        shutdown = getattr(iterator, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()


def _init_worker(child_pid: int, user_init: Callable[[int], None] | None, worker_id: int) -> None:
    """A DataLoader worker's init: SIGKILL when the trial child goes (PyTorch's watchdog polls
    only every 5 s), then the workload's own init, as the user's loader runs it."""
    die_with_parent(child_pid)
    if user_init is not None:
        user_init(worker_id)


class _TrainingLoop:
    """One micro-batch at a time as training runs it: fetch, move, step, optimizer step."""

    def __init__(
        self, stream: _EpochLoop, step: TrainStep, device: torch.device, settings: LoaderSettings
    ) -> None:
        self.stream = stream
        self._step = step
        self.device = device
        self._non_blocking = settings.pin_memory and device.type == "cuda"
        self._accumulation_steps = settings.accumulation_steps
        self.micro_batches = 0

    def run_one(self) -> int:
        """Run one micro-batch; its samples."""
        batch = self.stream.next()
        if self.micro_batches == 0:
            check_batch(batch)
        return self.step(batch)

    def step(self, batch: Any) -> int:
        """Step one micro-batch the loop holds; its samples."""
        samples = count_samples(batch)
        self._step(move_to_device(batch, self.device, self._non_blocking))
        self.micro_batches += 1
        if self.micro_batches % self._accumulation_steps == 0:
            self._step.optimizer_step()
        return samples

    def warm_up(self, warmup_s: float, min_batches: int) -> None:
        """At least ``min_batches`` micro-batches and ``warmup_s`` seconds, the first done, ending
        where an optimizer step has just run: the window then starts an accumulation run, in
        every rank alike, so the ranks' gradient all-reduces (on each run's last micro-batch)
        pair up although their warm-ups, each on its own clock, ran different counts."""
        warm_from, warm_batches = time.perf_counter(), 1
        while (
            warm_batches < min_batches
            or time.perf_counter() - warm_from < warmup_s
            or self.micro_batches % self._accumulation_steps
        ):
            self.run_one()
            warm_batches += 1
        synchronize(self.device)


@dataclasses.dataclass
class _Window:
    """What one timed window counted."""

    samples: int = 0
    batches: int = 0
    elapsed_s: float = 0.0
    wait_s: float = 0.0
    epochs: int = 0
    started_at: float = 0.0
    timeline: StepTimeline = dataclasses.field(default_factory=StepTimeline)

    def counted(self, samples_per_batch: float | None) -> float:
        """Samples, or batches at the epoch's mean size under a batch sampler."""
        return self.samples if samples_per_batch is None else self.batches * samples_per_batch


@dataclasses.dataclass(frozen=True)
class _EpochMark:
    """Where an epoch began in the window: seconds in, and what had been counted before it."""

    at_s: float
    samples: int
    batches: int
    wait_s: float


def _whole_epochs(window: _Window, marks: list[_EpochMark]) -> _Window:
    """The part of ``window`` from its first epoch start to its last: whole epochs, each with
    its own start (a new iterator, its workers' first batches) and end (the drain), as
    training's rate averages them."""
    first, last = marks[0], marks[-1]
    return dataclasses.replace(
        window,
        samples=last.samples - first.samples,
        batches=last.batches - first.batches,
        elapsed_s=last.at_s - first.at_s,
        wait_s=last.wait_s - first.wait_s,
        epochs=len(marks) - 1,
        started_at=window.started_at + first.at_s,
    )


def _run_window(
    loop: _TrainingLoop,
    window_s: float,
    samples_per_batch: float | None,
    progress: ProgressCallback | None,
    progress_interval_s: float,
) -> _Window:
    """Time micro-batches for ``window_s`` seconds, the device synchronised at the end.

    Where epochs are short (one starts in the window's first half), the rate is taken over
    whole epochs: the window runs on to the next epoch's start (at most ``window_s`` more)
    and counts from its first epoch start to its last. A time window over short epochs holds
    one or two epoch starts by chance, each a pause while the new iterator's workers fetch
    their first batches; over whole epochs the storage workload's rounds spread about half as
    much.
    """
    stream = loop.stream
    stream.wait_s, epochs_before = 0.0, stream.epochs
    window = _Window(started_at=time.monotonic())
    marks: list[_EpochMark] = []
    started = time.perf_counter()
    next_report = started + progress_interval_s
    while True:
        began, waited_before, epoch = time.perf_counter(), stream.wait_s, stream.epochs
        samples = loop.run_one()
        if stream.epochs != epoch:
            marks.append(_EpochMark(began - started, window.samples, window.batches, waited_before))
        window.samples += samples
        window.batches += 1
        now = time.perf_counter()
        waited = stream.wait_s - waited_before
        window.timeline.add(began - started, waited, now - began - waited)
        if now - started >= window_s:
            short_epochs = bool(marks) and marks[0].at_s <= window_s / 2
            if not short_epochs or (len(marks) >= 2 and stream.epochs != epoch):
                break
            if now - started >= 2 * window_s:
                break
        if progress is not None and now >= next_report:
            rate = window.counted(samples_per_batch) / (now - started)
            progress(now - started, rate, stream.wait_s / (now - started))
            next_report = now + progress_interval_s
    synchronize(loop.device)
    window.elapsed_s = time.perf_counter() - started
    window.wait_s, window.epochs = stream.wait_s, stream.epochs - epochs_before
    return _whole_epochs(window, marks) if len(marks) >= 2 else window


def _epoch_batches(loader: DataLoader) -> int | None:
    try:
        return len(loader)
    except TypeError:  # an IterableDataset without __len__
        return None


def _warm_up(
    loop: _TrainingLoop,
    workload: Workload,
    settings: LoaderSettings,
    seed: int,
    warmup_s: float,
    min_batches: int,
) -> None:
    """The epoch's heaviest batch, where there is one, then the warm-up."""
    # After the first batch, so the workers fork as training forks them: before any step.
    heaviest = heaviest_batch(workload, settings, seed)
    if heaviest is not None:
        loop.step(heaviest)
        del heaviest
    loop.warm_up(warmup_s, min_batches)


def measure(
    workload: Workload,
    settings: LoaderSettings,
    device: torch.device,
    window_s: float,
    warmup_s: float,
    seed: int = 0,
    progress: ProgressCallback | None = None,
    progress_interval_s: float = 0.5,
    min_warmup_batches: int = 2,
    before_window: Callable[[], Any] | None = None,
    stepping: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext,
) -> Measurement:
    """Measure samples/sec of ``workload`` under ``settings`` over ``window_s`` seconds.

    ``before_window`` runs between the warm-up and the window: the ranks of a node meet there
    (a barrier), so their windows start together. ``stepping()`` is entered around each run of
    steps (the warm-up; the window and what follows it): a rank training under DDP joins there
    (:class:`tuner.trial._ddp.RankModel`), so ranks whose step counts differ do not wait on one
    another.
    """
    torch.manual_seed(seed)
    torch.set_num_threads(settings.torch_num_threads)
    samples_per_batch = epoch_mean_batch(workload, settings, seed)
    built = time.perf_counter()
    loader = DataLoader(
        workload.dataset,
        **settings.build_dataloader_kwargs(workload, seed),
        worker_init_fn=functools.partial(_init_worker, os.getpid(), workload.worker_init_fn),
    )
    stream = _EpochLoop(loader)
    loop = _TrainingLoop(stream, workload.train_step(device), device, settings)
    try:
        with stepping():
            loop.run_one()
            synchronize(device)
            time_to_first_batch_s = time.perf_counter() - built
            _warm_up(loop, workload, settings, seed, warmup_s, min_warmup_batches)
        if before_window is not None:
            before_window()
        with stepping():
            window = _run_window(loop, window_s, samples_per_batch, progress, progress_interval_s)
            if settings.reforks_workers and not stream.epochs:
                stream.start_epoch()
                for _ in range(REFORK_STEPS):
                    loop.run_one()
                synchronize(device)
        own_peak = own_peak_memory_bytes()  # the workers still alive, as at the peak
    finally:
        stream.close()
    return Measurement(
        samples_per_sec=window.counted(samples_per_batch) / window.elapsed_s,
        time_to_first_batch_s=time_to_first_batch_s,
        batches=window.batches,
        samples=window.samples,
        window_s=window.elapsed_s,
        data_wait_fraction=min(1.0, window.wait_s / window.elapsed_s),
        epochs=window.epochs,
        epoch_starts=stream.epochs,
        device=str(device),
        window_started_at=window.started_at,
        timeline=window.timeline.rows(),
        epoch_batches=_epoch_batches(loader),
        own_peak_host_memory_bytes=own_peak,
    )
