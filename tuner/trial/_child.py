"""The trial child: one process per trial, in its own process group, that runs the workload.

Contract with the supervisor (:mod:`tuner.trial._supervisor`):

* the child puts itself in a new process group first, so the supervisor can kill it together
  with its DataLoader workers (which inherit the group) in one ``killpg``;
* it watches the study process and kills its own process group, DataLoader workers included,
  the moment the study is gone (:func:`tuner.trial._lifeline.kill_group_when_gone`), so a
  killed study leaves no orphans;
* it sends plain dicts over a pipe: ``progress`` while measuring, then exactly one ``result``
  or ``error``; it never writes to the study's database.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
from multiprocessing.connection import Connection
from typing import Any

import torch

from objectives import Workload, load_workload
from tuner._naming import CEILING_ATTR
from tuner.search._settings import LoaderSettings
from tuner.trial._ceiling import measure_ceiling
from tuner.trial._lifeline import kill_group_when_gone
from tuner.trial._measure import measure, synchronize
from tuner.trial._outcome import classify_error, one_line

__all__ = ["run_child"]


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
    rate = measure_ceiling(
        _workload(job, settings),
        settings,
        torch.device(job["device"]),
        window_s=job["window_s"],
        warmup_s=job["warmup_s"],
        batches=job.get("batches"),
        threads=job.get("threads"),
        seed=job.get("seed", 0),
    )
    conn.send({"kind": "result", "attrs": {CEILING_ATTR: rate}})


_MODES = {"measure": _measure, "probe": _probe, "ceiling": _ceiling}


def run_child(conn: Connection, job: dict[str, Any], supervisor_pid: int) -> None:
    """Entry point of the trial child process (the target of a forkserver ``Process``)."""
    os.setpgid(0, 0)
    kill_group_when_gone(supervisor_pid)
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
