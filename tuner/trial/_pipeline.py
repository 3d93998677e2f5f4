"""The pipeline profile's measured part, in a trial child: fetch, collate, IPC, transfer, memory.

Runs in the trial child (mode ``pipeline``); the study side turns the result into a
:class:`~tuner.pipeline.PipelineProfile` (with the step's rates from the ceiling measurement and
the usable cores) and stores it. What each number means is written there.
"""

from __future__ import annotations

import io
import multiprocessing
import os
import pickle
import statistics
import time
from collections.abc import Mapping, Sequence
from multiprocessing.connection import Connection
from multiprocessing.reduction import ForkingPickler
from typing import Any

import psutil
import torch
import torch.multiprocessing  # registers the tensor reductions a worker queue pickles with
from torch.multiprocessing.reductions import shared_cache
from torch.utils.data import DataLoader, default_collate

from objectives import Workload, move_to_device
from tuner.machine import process_tree_memory_bytes
from tuner.pipeline import KNOB_COST_FIELDS, STEP_TIME_RATIO, knob_key
from tuner.search import LoaderSettings
from tuner.trial._ceiling import step_batch
from tuner.trial._measure import count_samples, synchronize

__all__ = ["fetch_burst_s", "measure_pipeline", "samples_per_batch"]

STEP_WINDOW_S = 0.3
"""The window of the step's time per knob value: a ratio at one batch, not the ceiling."""
STEP_ROUNDS = 2
"""How many windows of :data:`STEP_WINDOW_S` each side of a knob value's step-time ratio gets
(its steps and the base knobs' taken in turn)."""

STEP_MIN_STEPS = 5
"""...and at least this many timed steps each, whatever the windows hold."""


def _tensor_bytes(value: Any) -> int:
    if isinstance(value, torch.Tensor):
        return value.element_size() * value.nelement()
    if isinstance(value, Mapping):
        return sum(_tensor_bytes(v) for v in value.values())
    if isinstance(value, list | tuple):
        return sum(_tensor_bytes(v) for v in value)
    return 0


def _profile_worker(
    conn: Connection, workload: Workload, batches: Sequence[Sequence[int]], budget_s: float
) -> None:
    """A stand-in DataLoader worker: fetch, collate and pickle batches, timing each part."""
    torch.set_num_threads(1)  # as DataLoader workers run
    conn.send("ready")
    collate = workload.collate_fn or default_collate
    walls: list[float] = []
    cpus: list[float] = []
    queued: list[float] = []
    collates: list[float] = []
    dumps: list[float] = []
    loads: list[float] = []
    fetched: list[tuple[int, float]] = []
    started = time.perf_counter()
    batch: Any = None
    for number, indices in enumerate(batches):
        if number >= 3 and time.perf_counter() - started > budget_s:
            break
        samples = []
        for index in indices:
            runqueue = _runqueue_s()
            wall, cpu = time.perf_counter(), time.process_time()
            samples.append(workload.dataset[index])
            walls.append(time.perf_counter() - wall)
            cpus.append(time.process_time() - cpu)
            queued.append(_runqueue_s() - runqueue)
        waits = zip(walls[-len(indices) :], queued[-len(indices) :], strict=True)
        fetched.append((len(indices), sum(max(0.0, wall - queue) for wall, queue in waits)))
        batch = _collate_and_pass(collate, samples, collates, dumps, loads)
    memory = psutil.Process().memory_full_info()
    # The first batch pays first-touch costs (imports, caches); leave it out when there are more.
    first = len(batches[0]) if len(collates) > 1 else 0
    conn.send(
        {
            "fetch_wall_s": statistics.fmean(walls[first:]),
            "fetch_cpu_s": statistics.fmean(cpus[first:]),
            "fetch_runqueue_s": statistics.fmean(queued[first:]),
            "fetch_burst_s": fetch_burst_s(fetched[1:] if first else fetched),
            "collate_s": statistics.median(collates[1:] or collates),
            "ipc_dump_s": statistics.median(dumps[1:] or dumps),
            "ipc_load_s": statistics.median(loads[1:] or loads),
            "worker_uss_bytes": int(memory.uss),
            "worker_pss_bytes": int(getattr(memory, "pss", memory.uss)),
            "sample_bytes": _tensor_bytes(batch) / max(1, len(batches[len(collates) - 1])),
            "measured_samples": len(walls),
        }
    )
    # Plain pickle, not shared memory: this process exits before the batch is read.
    conn.send_bytes(pickle.dumps(batch))
    conn.close()


def fetch_burst_s(batches: Sequence[tuple[int, float]]) -> float:
    """The most one batch's fetch took over its samples' share of the mean fetch, in seconds
    (0 for an even fetch): a stall a deeper prefetch queue can absorb.

    Args:
        batches: per batch fetched, its samples and their fetch time less the run-queue wait
            (other work on the machine, not the workload's own unevenness).

    Returns:
        The largest excess, at least 0.
    """
    samples = sum(count for count, _ in batches)
    if not samples:
        return 0.0
    mean = sum(seconds for _, seconds in batches) / samples
    return max(0.0, max(seconds - count * mean for count, seconds in batches))


def _collate_and_pass(
    collate: Any,
    samples: list[Any],
    collates: list[float],
    dumps: list[float],
    loads: list[float],
) -> Any:
    """Collate ``samples`` and pass the batch through a worker queue's pickling; each part's
    time per sample is appended to ``collates``, ``dumps`` and ``loads``. Returns the batch."""
    began = time.perf_counter()
    batch = collate(samples)
    collates.append((time.perf_counter() - began) / len(samples))
    began = time.perf_counter()
    buffer = io.BytesIO()
    ForkingPickler(buffer).dump(batch)  # what a worker's queue does: tensors into shm
    dumps.append((time.perf_counter() - began) / len(samples))
    began = time.perf_counter()
    ForkingPickler.loads(buffer.getvalue())
    loads.append((time.perf_counter() - began) / len(samples))
    del buffer
    # torch keeps each dumped storage mapped while its cache holds a reference, and sweeps
    # the cache only past 128 entries: 128 batches held here (measured: this worker's USS
    # grew a batch's bytes per batch, 165 MiB in 0.8 s on image at batch 32). A real
    # worker's stays flat; sweep after each batch as its memory is measured afterwards.
    shared_cache.free_dead_references()
    return batch


def _schedstat_s(path: str, field: int) -> float | None:
    """One field of a schedstat file, in seconds (None where the kernel hides it): 0 is the
    time on a CPU, 1 the time waiting for one while runnable, both in nanoseconds."""
    try:
        with open(path) as file:
            return int(file.read().split()[field]) / 1e9
    except (OSError, IndexError, ValueError):
        return None


def _runqueue_s(path: str = "/proc/thread-self/schedstat") -> float:
    """Seconds this thread has waited for a CPU while runnable (0 where the kernel hides it):
    on a shared machine, time a fetch spends queued behind other work, not waiting on I/O."""
    return _schedstat_s(path, 1) or 0.0


def _index_batches(workload: Workload, batch: int, seed: int, count: int) -> list[list[int]]:
    """The first ``count`` batches an epoch would fetch (the workload's batch sampler if any)."""
    if workload.batch_sampler is not None:
        plan = [list(b) for b in workload.batch_sampler(workload.dataset, batch, seed)]
        return plan[:count]
    order = torch.randperm(len(workload.dataset), generator=torch.Generator().manual_seed(seed))
    indices = order.tolist()
    size = max(1, min(batch, len(indices)))
    return [indices[i : i + size] for i in range(0, min(len(indices), size * count), size)]


def samples_per_batch(workload: Workload, batches: Sequence[int], seed: int) -> dict[int, float]:
    """Each batch value's samples: the value itself, or a batch sampler's epoch mean."""
    if workload.batch_sampler is None:
        return {b: float(min(b, len(workload.dataset))) for b in batches}
    result = {}
    for value in batches:
        plan = [len(b) for b in workload.batch_sampler(workload.dataset, value, seed)]
        result[value] = sum(plan) / len(plan) if plan else 1.0
    return result


def _loader_cpu_s(
    workload: Workload, batch: int, seed: int, budget_s: float, workers: int = 2
) -> tuple[float, float, float]:
    """CPU seconds per sample of a real DataLoader (``workers`` workers, no step): in the main
    process and in the workers, counted from the first batch for about ``budget_s``; and what
    each worker added to the tree's PSS (the lower of two readings, outside the timed part,
    so the fewest batches in flight)."""
    # Persistent: the workers outlive an epoch that ends early, so their CPU can still be read.
    settings = LoaderSettings(
        batch=batch, num_workers=workers, prefetch_factor=2, persistent_workers=True
    )
    loader = DataLoader(workload.dataset, **settings.build_dataloader_kwargs(workload, seed))
    me = psutil.Process()
    alone = process_tree_memory_bytes(me.pid) or 0
    iterator = iter(loader)
    try:
        next(iterator)
        children = me.children()
        readings = [process_tree_memory_bytes(me.pid) or 0]
        before = sum(_cpu_s(child) for child in children)
        main_before, started, samples = time.process_time(), time.perf_counter(), 0
        for batch_value in iterator:
            samples += count_samples(batch_value)
            if time.perf_counter() - started > budget_s:
                break
        main_s = time.process_time() - main_before
        workers_s = max(0.0, sum(_cpu_s(child) for child in children) - before)
        readings.append(process_tree_memory_bytes(me.pid) or 0)
    finally:
        shutdown = getattr(iterator, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()
    fork_bytes = max(0.0, (min(readings) - alone) / workers)
    return main_s / max(1, samples), workers_s / max(1, samples), fork_bytes


def _cpu_s(process: psutil.Process) -> float:
    """CPU seconds of ``process``, all its threads, to the nanosecond where schedstat is there.

    ``cpu_times`` counts clock ticks (often 10 ms), too coarse for workers that spend tens of
    milliseconds of CPU on the whole profile. Live threads only: one that ends between two
    readings takes its CPU with it (a loader worker runs one).
    """
    try:
        tasks = os.listdir(f"/proc/{process.pid}/task")
    except OSError:
        tasks = []
    readings = [_schedstat_s(f"/proc/{process.pid}/task/{task}/schedstat", 0) for task in tasks]
    if tasks and all(reading is not None for reading in readings):
        return sum(reading or 0.0 for reading in readings)
    try:
        times = process.cpu_times()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return 0.0
    return times.user + times.system


def _transfer_s(batch: Any, device: torch.device, samples: int) -> float:
    """Seconds per sample to copy a collated batch to ``device`` (median of a few copies)."""
    times = []
    for _ in range(5):
        began = time.perf_counter()
        move_to_device(batch, device)
        synchronize(device)
        times.append(time.perf_counter() - began)
    return statistics.median(times) / max(1, samples)


def _sample_costs(
    workload: Workload,
    batch: int,
    device: torch.device,
    seed: int,
    budget_s: float,
    max_batches: int,
    loader_workers: int = 2,
) -> tuple[dict[str, Any], Any]:
    """One knob set's per-sample costs (stand-in worker, transfer, a real loader's CPU) and
    the last batch the stand-in worker made."""
    plan = _index_batches(workload, batch, seed, max_batches)
    if not plan:
        raise ValueError("the workload yields no batch to profile")
    parent, child = multiprocessing.Pipe()
    started = time.perf_counter()
    worker = multiprocessing.Process(
        target=_profile_worker, args=(child, workload, plan, budget_s), daemon=True
    )
    worker.start()
    child.close()
    try:
        parent.recv()
        worker_start_s = time.perf_counter() - started
        stats = parent.recv()
        last = pickle.loads(parent.recv_bytes())
    finally:
        worker.join(timeout=10)
        if worker.is_alive():
            worker.kill()
    main_cpu_s, worker_cpu_s, fork_bytes = _loader_cpu_s(
        workload, batch, seed, budget_s, loader_workers
    )
    costs = {
        **stats,
        "loader_main_cpu_s": main_cpu_s,
        "loader_worker_cpu_s": worker_cpu_s,
        "worker_fork_bytes": fork_bytes,
        "transfer_s": _transfer_s(last, device, len(plan[0])),
        "worker_start_s": worker_start_s,
    }
    return costs, last


def _step_time_ratio(
    base: Workload, variant: Workload, batch: int, device: torch.device, seed: int
) -> float:
    """``variant``'s step time per sample over ``base``'s at ``batch`` on one thread: the two
    steps timed one after the other, turn and turn about, for :data:`STEP_ROUNDS` windows each,
    and the ratio of their median step times.

    Whole windows taken in turn (two rounds, their times summed) read image's ``uint8`` step at
    0.93-1.48 of the ``float`` one over 15 stored profiles, four of them 1.27-1.48 where the
    rest sat at 0.93-1.07: a slow spell of the machine fell on one side's window. Step by step, a
    spell falls on both, and a median leaves out the steps it stretched.
    """
    settings = LoaderSettings(batch=batch, num_workers=0, torch_num_threads=1)
    torch.set_num_threads(1)
    sides = []
    for workload in (base, variant):
        prepared = step_batch(workload, settings, seed, device)
        sides.append((workload.train_step(device), prepared, max(1, count_samples(prepared))))
    times: tuple[list[float], list[float]] = ([], [])
    warm_until = time.perf_counter() + STEP_WINDOW_S / 2
    window_until = warm_until + 2 * STEP_ROUNDS * STEP_WINDOW_S
    while time.perf_counter() < window_until or min(map(len, times)) < STEP_MIN_STEPS:
        for side, (step, prepared, samples) in enumerate(sides):
            started = time.perf_counter()
            step(prepared)
            step.optimizer_step()
            synchronize(device)
            if started >= warm_until:
                times[side].append((time.perf_counter() - started) / samples)
    return statistics.median(times[1]) / max(1e-12, statistics.median(times[0]))


def measure_pipeline(
    workload: Workload,
    batch: int,
    device: torch.device,
    batches: Sequence[int],
    seed: int = 0,
    budget_s: float = 1.0,
    max_batches: int = 64,
    knobs: Mapping[str, Any] | None = None,
    knob_variants: Sequence[tuple[str, Any]] = (),
    loader_workers: int = 2,
) -> dict[str, Any]:
    """The profile's measured part (all but the step's rates and the cores), as attrs.

    ``batch`` is the batch value profiled (the workload's default); ``batches`` every value the
    space holds, for ``samples_per_batch``. At least three batches are fetched, more while
    ``budget_s`` lasts. Each ``(knob, value)`` of ``knob_variants`` is profiled again with
    ``value`` over ``knobs`` (the base knobs ``workload`` runs with), at half the budget, with
    its step's time against the base's (``knob_costs``). The real DataLoader runs
    ``loader_workers`` workers at prefetch 2.
    """
    costs, _ = _sample_costs(workload, batch, device, seed, budget_s, max_batches, loader_workers)
    knob_costs = {}
    for name, value in knob_variants:
        variant = workload.with_knobs({**(knobs or {}), name: value})
        own, _ = _sample_costs(
            variant, batch, device, seed, budget_s / 2, max_batches, loader_workers
        )
        knob_costs[knob_key(name, value)] = {
            **{field: float(own[field]) for field in KNOB_COST_FIELDS},
            STEP_TIME_RATIO: _step_time_ratio(workload, variant, batch, device, seed),
        }
    return {
        **costs,
        "knob_costs": knob_costs,
        "loader_workers": loader_workers,
        "samples_per_batch": {
            str(k): v for k, v in samples_per_batch(workload, batches, seed).items()
        },
        "profiled_batch": batch,
        "dataset_samples": len(workload.dataset),
    }
