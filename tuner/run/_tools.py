"""The one factory for what runs trials of a prepared study: GPU reader, guard, supervisor,
jobs and the trial runner.

``run_study`` and ``bench/`` both build through here, so a benchmark measures a setting exactly
as a trial does (same guard, same GPU index, same job). The GPU reader is closed when the
``with`` block of :func:`trial_tools` ends.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import sys
from collections.abc import Iterator
from pathlib import Path

from storage import open_artifact_store
from tuner.machine import GpuReader, auto_profile_name, open_gpu_reader
from tuner.pipeline import PipelineModel
from tuner.run._config import PreparedStudy, trial_deadline
from tuner.run._runner import TrialRunner
from tuner.search import LoaderSettings, SearchSpace
from tuner.trial import Job, MemoryGuard, Mode, Supervisor

__all__ = ["TrialTools", "make_job", "make_runner", "trial_tools"]

_log = logging.getLogger("tuner")


@dataclasses.dataclass(frozen=True)
class TrialTools:
    """What every child of one study process is run with."""

    supervisor: Supervisor
    gpu: GpuReader | None
    """The reader for the trial's device, or None off CUDA or without NVML."""
    gpu_reason: str | None
    """Why the GPU guard is off, for one line in the run's output."""


@contextlib.contextmanager
def trial_tools(prepared: PreparedStudy) -> Iterator[TrialTools]:
    """Open the GPU reader (closed on exit) and build the guard and supervisor around it."""
    with contextlib.closing(open_gpu_reader(_log)) as reader:
        gpu = reader if prepared.space.cuda and reader.available else None
        reason = None if reader.available else getattr(reader, "reason", "no GPU")
        guard = MemoryGuard(
            prepared.limits,
            gpu=gpu,
            gpu_indices=(prepared.gpu_indices or None) if gpu is not None else None,
        )
        yield TrialTools(Supervisor(guard), gpu, reason)


def _objective_for_children(objective: str) -> str:
    """A ``file.py:attr`` objective as an absolute path, so children find it from any cwd."""
    path, sep, attr = objective.rpartition(":")
    if path.endswith(".py"):
        return f"{Path(path).resolve()}{sep}{attr}"
    return objective


def make_job(prepared: PreparedStudy, settings: LoaderSettings, mode: Mode = Mode.MEASURE) -> Job:
    """The job a child of this study runs ``settings`` with, in the study's window."""
    config = prepared.config
    return Job(
        mode=mode,
        objective=_objective_for_children(config.objective),
        options=dict(config.objective_options),
        settings=settings,
        device=prepared.device,
        window_s=config.trial_seconds,
        warmup_s=config.warmup_seconds,
        seed=config.seed or 0,
        sys_path=tuple(sys.path),
        nproc_per_node=prepared.nproc_per_node if mode is Mode.MEASURE else 1,
    )


def _telemetry_gpu(prepared: PreparedStudy, tools: TrialTools) -> int | None:
    """The GPU the telemetry reads: the first rank's, where the guard reads GPUs at all."""
    return prepared.gpu_indices[0] if tools.gpu is not None and prepared.gpu_indices else None


def make_runner(
    prepared: PreparedStudy,
    tools: TrialTools,
    space: SearchSpace | None = None,
    ceiling: float | None = None,
    model: PipelineModel | None = None,
) -> TrialRunner:
    """The runner for this study's trials over ``space`` (default: the prepared space)."""
    config = prepared.config
    space = space or prepared.space
    # The template's setting is a placeholder: every trial's job carries its own.
    placeholder = space.main_process_settings(space.clamp_batch(space.workload.default_batch_size))
    return TrialRunner(
        supervisor=tools.supervisor,
        space=space,
        job_template=make_job(prepared, placeholder),
        deadline_s=trial_deadline(config),
        machine_attrs={
            "profile": auto_profile_name(prepared.fingerprint),
            **prepared.fingerprint.to_attrs(),
        },
        gpu=tools.gpu,
        gpu_index=_telemetry_gpu(prepared, tools),
        artifact_store=open_artifact_store(config.storage, config.artifact_dir),
        ceiling=ceiling,
        model=model,
    )
