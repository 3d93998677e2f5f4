"""The trial child: one process per trial, in its own process group, that runs the workload.

Contract with the supervisor (:mod:`tuner.trial._supervisor`):

* the child puts itself in a new process group first, so the supervisor can kill it together
  with its DataLoader workers (which inherit the group) in one ``killpg``;
* it watches the study process and kills its own process group, DataLoader workers included,
  the moment the study is gone (:func:`tuner._lifeline.kill_group_when_gone`), so a
  killed study leaves no orphans;
* it sends the typed messages of :mod:`tuner.trial._protocol` over a pipe: :class:`Progress`
  while measuring, then exactly one :class:`Result` or :class:`Failure`; it never writes to the
  study's database.
"""

from __future__ import annotations

import contextlib
import dataclasses
import multiprocessing
import os
import sys
import warnings
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

import torch

from objectives import Workload, load_workload
from tuner._lifeline import kill_group_when_gone
from tuner._naming import CEILING_ATTR, STEP_CPU_ATTR, STEP_PEAK_ATTR, STEP_RATES_ATTR
from tuner.machine import own_peak_memory_bytes
from tuner.trial._ceiling import measure_step_rates
from tuner.trial._measure import measure, synchronize
from tuner.trial._outcome import classify_error, one_line
from tuner.trial._pipeline import measure_pipeline
from tuner.trial._protocol import Failure, Fits, Job, Mode, Progress, Result
from tuner.trial._ranks import run_ranks

__all__ = ["run_child"]


def _workload(job: Job) -> Workload:
    return load_workload(job.objective, job.options).with_knobs(job.settings.knobs)


def _measure_in(
    conn: Connection,
    workload: Workload,
    job: Job,
    device: torch.device,
    before_window: Callable[[], Any] | None = None,
    stepping: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext,
) -> None:
    """Measure in this process; progress and the result over ``conn``."""

    def progress(elapsed_s: float, samples_per_sec: float, data_wait_fraction: float) -> None:
        conn.send(Progress(elapsed_s, samples_per_sec, data_wait_fraction))

    result = measure(
        workload,
        job.settings,
        device,
        window_s=job.window_s,
        warmup_s=job.warmup_s,
        seed=job.seed,
        progress=progress,
        before_window=before_window,
        stepping=stepping,
    )
    conn.send(Result(result.to_attrs()))


def _measure(conn: Connection, job: Job) -> None:
    if job.nproc_per_node > 1:
        run_ranks(conn, _measure_in, _workload(job), job)
    else:
        _measure_in(conn, _workload(job), job, torch.device(job.device))


def _probe(conn: Connection, job: Job) -> None:
    """Run a couple of steps at each batch value in turn; report each one that fits."""
    workload = _workload(job)
    device = torch.device(job.device)
    for batch in job.batches:
        # Two steps: the second runs with the optimizer's state, the steady memory peak.
        measure(
            workload,
            dataclasses.replace(job.settings, batch=batch),
            device,
            window_s=0.0,
            warmup_s=0.0,
            seed=job.seed,
            min_warmup_batches=1,
        )
        synchronize(device)
        if device.type == "cuda":
            torch.cuda.empty_cache()
        conn.send(Fits(batch, own_peak_memory_bytes()))
    conn.send(Result({}))


def _ceiling(conn: Connection, job: Job) -> None:
    """The step alone on prepared batches: what no DataLoader setting can beat, with the
    step's rate and CPU time per batch and thread count for the pipeline profile."""
    steps = measure_step_rates(
        _workload(job),
        job.settings,
        torch.device(job.device),
        window_s=job.window_s,
        warmup_s=job.warmup_s,
        batches=job.batches or None,
        threads=job.threads or None,
        seed=job.seed,
    )
    attrs = {
        CEILING_ATTR: steps.ceiling,
        STEP_RATES_ATTR: _text_keys(steps.rates),
        STEP_CPU_ATTR: _text_keys(steps.cpu_s),
        STEP_PEAK_ATTR: {str(b): v for b, v in steps.peak_bytes.items()},
    }
    conn.send(Result(attrs))


def _text_keys(table: dict[int, dict[int, float]]) -> dict[str, dict[str, float]]:
    return {str(t): {str(b): v for b, v in row.items()} for t, row in table.items()}


def _pipeline(conn: Connection, job: Job) -> None:
    """The pipeline profile's measured part: fetch, collate, IPC, transfer, worker memory."""
    attrs = measure_pipeline(
        _workload(job),
        job.settings.batch,
        torch.device(job.device),
        batches=job.batches,
        seed=job.seed,
        budget_s=job.budget_s,
        knobs=job.settings.knobs,
        knob_variants=job.knob_variants,
        loader_workers=job.loader_workers,
    )
    conn.send(Result(attrs))


_MODES = {
    Mode.MEASURE: _measure,
    Mode.PROBE: _probe,
    Mode.CEILING: _ceiling,
    Mode.PIPELINE: _pipeline,
}


def run_child(conn: Connection, job: Job, supervisor_pid: int) -> None:
    """Entry point of the trial child process (the target of a forkserver ``Process``)."""
    os.setpgid(0, 0)
    kill_group_when_gone(supervisor_pid)
    # A forkserver Process makes "forkserver" its own default start method; DataLoader workers
    # must start the way they would in the user's process: the platform's default.
    multiprocessing.set_start_method(None, force=True)
    # Trials run more workers than cores on purpose (samples that wait on storage); PyTorch's
    # warning about it, once per DataLoader, would flood the study's output.
    warnings.filterwarnings("ignore", message="This DataLoader will create", category=UserWarning)
    if job.cwd:
        os.chdir(job.cwd)
    if job.sys_path:
        sys.path[:] = job.sys_path
    try:
        _MODES[job.mode](conn, job)
    except BaseException as error:  # everything the workload raises is the trial's outcome
        try:
            conn.send(Failure(one_line(error), classify_error(error)))
        except (BrokenPipeError, OSError):
            pass
    finally:
        conn.close()
