"""The trial child: one process per trial, in its own process group, that runs the workload.

Contract with the supervisor (:mod:`tuner.trial._supervisor`):

* the child puts itself in a new process group first, so the supervisor can kill it together
  with its DataLoader workers (which inherit the group) in one ``killpg``;
* it asks the kernel to kill it when its parent, the forkserver (which exits with the study
  process), dies (``PR_SET_PDEATHSIG``), so a killed study leaves no orphans;
* it sends plain dicts over a pipe: ``progress`` while measuring, then exactly one ``result``
  or ``error``; it never writes to the study's database.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import signal
import sys
from multiprocessing.connection import Connection
from typing import Any

import torch

from objectives import Workload, load_workload
from tuner._naming import CEILING_ATTR, STEP_CPU_ATTR, STEP_RATES_ATTR
from tuner.search._settings import LoaderSettings
from tuner.trial._ceiling import measure_step_rates
from tuner.trial._measure import measure, synchronize
from tuner.trial._outcome import classify_error, one_line
from tuner.trial._pipeline import measure_pipeline

__all__ = ["run_child"]

_PR_SET_PDEATHSIG = 1


def _die_with_parent(supervisor_pid: int) -> None:
    """Die with the forkserver, which itself exits when the study process does."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        pass  # Not Linux/glibc: the supervisor's process-group kill still applies.
    try:
        os.kill(supervisor_pid, 0)
    except ProcessLookupError:
        os._exit(1)


def _workload(job: dict[str, Any], settings: LoaderSettings) -> Workload:
    return load_workload(job["objective"], job.get("options")).with_knobs(settings.knobs)


def _measure(conn: Connection, job: dict[str, Any]) -> None:
    settings = LoaderSettings.from_attrs(job["settings"])
    workload = _workload(job, settings)
    device = torch.device(job["device"])

    def progress(elapsed_s: float, samples_per_sec: float, data_wait_fraction: float) -> None:
        conn.send(
            {
                "kind": "progress",
                "elapsed_s": elapsed_s,
                "samples_per_sec": samples_per_sec,
                "data_wait_fraction": data_wait_fraction,
            }
        )

    result = measure(
        workload,
        settings,
        device,
        window_s=job["window_s"],
        warmup_s=job["warmup_s"],
        seed=job.get("seed", 0),
        progress=progress,
    )
    conn.send({"kind": "result", "attrs": result.to_attrs()})


def _probe(conn: Connection, job: dict[str, Any]) -> None:
    """Run a couple of steps at each batch value in turn; report each one that fits."""
    base = LoaderSettings.from_attrs(job["settings"])
    workload = _workload(job, base)
    device = torch.device(job["device"])
    for batch in job["batches"]:
        settings = LoaderSettings.from_attrs({**base.to_attrs(), "batch": batch})
        # Two steps: the second runs with the optimizer's state, the steady memory peak.
        measure(
            workload,
            settings,
            device,
            window_s=0.0,
            warmup_s=0.0,
            seed=job.get("seed", 0),
            min_warmup_batches=1,
        )
        synchronize(device)
        if device.type == "cuda":
            torch.cuda.empty_cache()
        conn.send({"kind": "fits", "batch": batch})
    conn.send({"kind": "result", "attrs": {}})


def _ceiling(conn: Connection, job: dict[str, Any]) -> None:
    """The step alone on one prepared batch: what no DataLoader setting can beat."""
    settings = LoaderSettings.from_attrs(job["settings"])
    steps = measure_step_rates(
        _workload(job, settings),
        settings,
        torch.device(job["device"]),
        window_s=job["window_s"],
        warmup_s=job["warmup_s"],
        batches=job.get("batches"),
        threads=job.get("threads"),
        seed=job.get("seed", 0),
    )
    attrs = {
        CEILING_ATTR: steps.ceiling,
        STEP_RATES_ATTR: _text_keys(steps.rates),
        STEP_CPU_ATTR: _text_keys(steps.cpu_s),
    }
    conn.send({"kind": "result", "attrs": attrs})


def _text_keys(table: dict[int, dict[int, float]]) -> dict[str, dict[str, float]]:
    return {str(t): {str(b): v for b, v in row.items()} for t, row in table.items()}


def _pipeline(conn: Connection, job: dict[str, Any]) -> None:
    """The pipeline profile's measured part: fetch, collate, IPC, transfer, worker memory."""
    settings = LoaderSettings.from_attrs(job["settings"])
    attrs = measure_pipeline(
        _workload(job, settings),
        settings.batch,
        torch.device(job["device"]),
        batches=job["batches"],
        seed=job.get("seed", 0),
        budget_s=job["budget_s"],
    )
    conn.send({"kind": "result", "attrs": attrs})


_MODES = {"measure": _measure, "probe": _probe, "ceiling": _ceiling, "pipeline": _pipeline}


def run_child(conn: Connection, job: dict[str, Any], supervisor_pid: int) -> None:
    """Entry point of the trial child process (the target of a forkserver ``Process``)."""
    os.setpgid(0, 0)
    _die_with_parent(supervisor_pid)
    # A forkserver Process makes "forkserver" its own default start method; DataLoader workers
    # must start the way they would in the user's process: the platform's default.
    multiprocessing.set_start_method(None, force=True)
    if job.get("cwd"):
        os.chdir(job["cwd"])
    if job.get("sys_path"):
        sys.path[:] = job["sys_path"]
    try:
        _MODES[job["mode"]](conn, job)
    except BaseException as error:  # everything the workload raises is the trial's outcome
        try:
            conn.send({"kind": "error", "reason": classify_error(error), "error": one_line(error)})
        except (BrokenPipeError, OSError):
            pass
    finally:
        conn.close()
