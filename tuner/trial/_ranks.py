"""Ranks per node: a measuring trial child that runs N rank processes as torchrun does.

Contract, inside the trial child (:mod:`tuner.trial._child`) when ``Job.nproc_per_node`` > 1:

* the child forks N rank processes; they stay in its process group, so the supervisor's
  ``killpg`` and the guard's process-tree sampling cover every rank and its DataLoader workers,
  and each rank dies with the child (``PR_SET_PDEATHSIG``);
* each rank gets torchrun's environment (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``,
  ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR`` on loopback, a free ``MASTER_PORT``) and joins a real
  process group (NCCL on CUDA, gloo on the CPU); it builds the trial's DataLoader over its
  :class:`~torch.utils.data.DistributedSampler` shard and runs the workload's step on
  ``cuda:LOCAL_RANK`` or the CPU (:func:`rank_devices`), the workload's model under
  ``DistributedDataParallel`` where it hands one over (:mod:`tuner.trial._ddp`), so the
  gradient all-reduce paces the ranks as in training;
* the ranks meet at a barrier after their warm-up, so their windows start together: the
  node's samples/sec is the sum of the ranks' rates over that common window, and each rank's
  rate and data wait are recorded beside it;
* a rank that fails or dies ends the trial with its reason, as one process would, and the
  child kills the other ranks before it reports.

A workload that hands over no model steps as it is in each rank, with no collective.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import multiprocessing
import os
import signal
import socket
from collections.abc import Callable
from multiprocessing.connection import Connection, wait
from typing import Any

import torch
from torch.utils.data import DistributedSampler

from objectives import Workload
from tuner._lifeline import die_with_parent
from tuner.trial._ddp import RankModel
from tuner.trial._outcome import classify_error, classify_exit, one_line
from tuner.trial._protocol import Failure, Job, Progress, Result

__all__ = [
    "PEER_DEATH_S",
    "RANK_ATTRS",
    "MeasureRank",
    "node_attrs",
    "rank_devices",
    "run_ranks",
    "shard",
    "shard_error",
]

RANK_ATTRS = ("rank_samples_per_sec", "rank_data_wait_fraction")
"""Trial user attrs of a multi-rank trial: each rank's samples/sec and data-wait fraction."""

PEER_DEATH_S = 0.5
"""How long a rank's failure waits for another rank's death to be seen: a dead peer's socket
fails the survivors' gloo and NCCL collectives within milliseconds."""

MeasureRank = Callable[
    [
        Connection,
        Workload,
        Job,
        torch.device,
        Callable[[], Any],
        Callable[[], contextlib.AbstractContextManager[Any]],
    ],
    None,
]
"""``measure(conn, workload, job, device, before_window, stepping)``: one rank's measurement
(``stepping`` as :func:`tuner.trial._measure.measure` takes it), which sends
:class:`Progress` and then one :class:`Result` over ``conn``."""


def shard_error(workload: Workload) -> str | None:
    """Why ``workload``'s samples cannot be split over ranks, or None when they can.

    A rank's shard is a :class:`DistributedSampler` over the dataset; a workload that brings its
    own sampler or batch sampler, or a dataset without a length, has no shard the tuner could
    build without changing what it measures.
    """
    if workload.batch_sampler is not None:
        return f"workload {workload.name!r} has its own batch sampler, which cannot be sharded"
    if workload.sampler is not None:
        return f"workload {workload.name!r} has its own sampler, which cannot be sharded"
    if workload.dataset_length is None:
        return f"workload {workload.name!r} has a dataset without a length, which cannot be sharded"
    return None


def shard(workload: Workload, rank: int, ranks: int, seed: int) -> Workload:
    """``workload`` drawing from rank ``rank``'s shard of its shuffled dataset."""
    sampler = DistributedSampler(
        workload.dataset, num_replicas=ranks, rank=rank, shuffle=True, seed=seed
    )
    return dataclasses.replace(workload, sampler=sampler)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def rank_devices(device: str, ranks: int) -> list[str]:
    """The device of each of ``ranks`` ranks on a study's ``device``: ``device`` itself for one
    rank; ``cuda:LOCAL_RANK`` on CUDA, as torchrun's ranks take theirs, or the CPU, for more."""
    if ranks == 1:
        return [device]
    if device.startswith("cuda"):
        return [f"cuda:{rank}" for rank in range(ranks)]
    return ["cpu"] * ranks


def _rank_main(
    conn: Connection,
    measure: MeasureRank,
    workload: Workload,
    job: Job,
    rank: int,
    port: int,
    parent: int,
) -> None:
    """One rank: torchrun's environment, the process group, its shard, the measurement."""
    import torch.distributed as dist

    die_with_parent(parent)
    ranks = job.nproc_per_node
    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(ranks),
        LOCAL_WORLD_SIZE=str(ranks),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    device = torch.device(rank_devices(job.device, ranks)[rank])
    try:
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
        model = RankModel(job.settings.accumulation_steps)
        try:
            mine = model.wrap(shard(workload, rank, ranks, job.seed))
            measure(conn, mine, job, device, dist.barrier, model.stepping)
        except BaseException as error:
            # Said before the group goes: its end fails the other ranks' collectives too.
            _send_failure(conn, rank, error)
        finally:
            # DDP's reducer sits in reference cycles; collected after its group is gone, at
            # exit, it aborts the rank ("terminate called without an active exception").
            model.module = None
            gc.collect()
            dist.destroy_process_group()
    except BaseException as error:
        _send_failure(conn, rank, error)
    finally:
        conn.close()


def _send_failure(conn: Connection, rank: int, error: BaseException) -> None:
    """The rank's error, as the trial's outcome (the parent keeps the first a rank sends)."""
    conn.send(Failure(f"rank {rank}: {one_line(error)}", classify_error(error)))


@dataclasses.dataclass
class _Rank:
    number: int
    process: multiprocessing.process.BaseProcess
    conn: Connection
    progress: Progress | None = None
    result: dict[str, Any] | None = None


def _start(
    measure: MeasureRank, workload: Workload, job: Job, start_method: str | None
) -> list[_Rank]:
    # Forked, the ranks share the child's loaded workload; a child whose workload initialised
    # CUDA cannot fork it, so its ranks start fresh (the workload travels pickled).
    method = start_method or ("spawn" if torch.cuda.is_initialized() else "fork")
    context = multiprocessing.get_context(method)
    port, ranks = _free_port(), []
    for number in range(job.nproc_per_node):
        receiver, sender = context.Pipe(duplex=False)
        process = context.Process(
            target=_rank_main,
            args=(sender, measure, workload, job, number, port, os.getpid()),
            daemon=False,  # a rank starts DataLoader workers of its own
        )
        process.start()
        sender.close()
        ranks.append(_Rank(number, process, receiver))
    return ranks


def _stop(ranks: list[_Rank]) -> None:
    """SIGKILL every rank still running (its workers die with it) and reap them; a rank that
    sent its result has a moment to leave its process group first."""
    for rank in ranks:
        if rank.result is not None:
            rank.process.join(timeout=2.0)
    for rank in ranks:
        if rank.process.is_alive() and rank.process.pid is not None:
            try:
                os.kill(rank.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    for rank in ranks:
        rank.process.join(timeout=5.0)
        rank.conn.close()


def _died(rank: _Rank) -> Failure:
    rank.process.join(timeout=5.0)
    reason = classify_exit(rank.process.exitcode)
    if reason.startswith("trial_exited"):
        return Failure(f"rank {rank.number} ended without a result ({reason})")
    return Failure(f"rank {rank.number} was {reason}", reason)


def _node_progress(ranks: list[_Rank]) -> Progress | None:
    reports = [rank.progress for rank in ranks]
    if any(report is None for report in reports):
        return None
    return Progress(
        max(r.elapsed_s for r in reports if r is not None),
        sum(r.samples_per_sec for r in reports if r is not None),
        sum(r.data_wait_fraction for r in reports if r is not None) / len(reports),
    )


def _receive(rank: _Rank) -> Failure | None:
    """Take one message of ``rank``: progress forwarded for the node, a result kept."""
    try:
        message = rank.conn.recv()
    except (EOFError, OSError):
        return _died(rank)
    match message:
        case Failure():
            return message
        case Result():
            rank.result = dict(message.attrs)
        case Progress():
            rank.progress = message
    return None


def _killed_peer(ranks: list[_Rank], failed: _Rank) -> Failure | None:
    """The death of another rank killed by a signal (the OOM killer's, a user's) within
    :data:`PEER_DEATH_S` of ``failed``'s error, or None: a rank that dies fails the others'
    collectives with connection errors, and the killing is what ended the trial."""
    others = [rank for rank in ranks if rank is not failed]
    wait([rank.process.sentinel for rank in others], timeout=PEER_DEATH_S)
    for rank in others:
        exitcode = rank.process.exitcode
        if exitcode is not None and exitcode < 0:
            return _died(rank)
    return None


def _gather(conn: Connection, ranks: list[_Rank]) -> list[dict[str, Any]] | Failure:
    """Every rank's result attrs, or the first rank's failure; forwards the node's progress."""
    while any(rank.result is None for rank in ranks):
        pending = {rank.conn: rank for rank in ranks if rank.result is None}
        for ready in wait(list(pending)):
            rank = pending[ready]  # type: ignore[index]
            failure = _receive(rank)
            if failure is not None:
                return _killed_peer(ranks, rank) or failure
            if rank.progress is not None and rank.result is None:
                node = _node_progress(ranks)
                if node is not None:
                    conn.send(node)
    return [rank.result for rank in ranks if rank.result is not None]


def node_attrs(results: list[dict[str, Any]]) -> dict[str, Any]:
    """The trial's attrs from each rank's measurement: the node's samples/sec (their sum over
    the common window), samples, batches and memory summed, the data wait averaged, each rank's
    rate and wait in :data:`RANK_ATTRS`, the rest as rank 0 measured it."""
    attrs = dict(results[0])
    for key in ("samples_per_sec", "samples", "batches"):
        attrs[key] = sum(result[key] for result in results)
    waits = [result["data_wait_fraction"] for result in results]
    attrs["data_wait_fraction"] = sum(waits) / len(waits)
    peaks = [result.get("own_peak_host_memory_bytes") for result in results]
    attrs["own_peak_host_memory_bytes"] = None if None in peaks else sum(peaks)  # type: ignore[arg-type]
    attrs["window_s"] = max(result["window_s"] for result in results)
    attrs["window_started_at"] = min(result["window_started_at"] for result in results)
    attrs[RANK_ATTRS[0]] = [result["samples_per_sec"] for result in results]
    attrs[RANK_ATTRS[1]] = waits
    attrs["nproc_per_node"] = len(results)
    return attrs


def run_ranks(
    conn: Connection,
    measure: MeasureRank,
    workload: Workload,
    job: Job,
    start_method: str | None = None,
) -> None:
    """Run ``measure`` in ``job.nproc_per_node`` ranks; send the node's result or the first
    rank's failure over ``conn``, with no rank left running. ``start_method`` (None: fork,
    spawn once CUDA is initialised here) is how the ranks start."""
    ranks = _start(measure, workload, job, start_method)
    try:
        outcome = _gather(conn, ranks)
    finally:
        _stop(ranks)
    conn.send(outcome if isinstance(outcome, Failure) else Result(node_attrs(outcome)))
