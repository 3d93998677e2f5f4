"""``dataloader-tuner study`` (``python -m tuner.study``): tune a workload's DataLoader on this
machine for a hardware profile.

    dataloader-tuner study --hardware auto --n-trials 20
    dataloader-tuner study --hardware g4dn.xlarge --objective mypkg.data:workload --storage postgresql+psycopg://...

Objectives given as ``module:attr`` or ``file.py:attr`` are user code: they are imported and run.
The run itself is :func:`tuner.run.run_study`, which :func:`tuner.tune` calls too.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from tuner._cli import (
    ArgumentParser,
    UsageError,
    add_artifact_dir,
    add_common,
    run_cli,
    storage_url,
)
from tuner.insight import NoResultError, print_summary
from tuner.run import SAMPLERS, StudyConfig, no_result_message, run_study

__all__ = ["PROG", "config_from_args", "main", "parser"]

PROG = "python -m tuner.study"
DESCRIPTION = "Tune a workload's DataLoader on this machine for a hardware profile."


def parser(prog: str = PROG) -> argparse.ArgumentParser:
    """The flags of a study run; ``prog`` names the command in usage and error lines."""
    p = ArgumentParser(prog=prog, description=DESCRIPTION)
    add_common(p)
    run = p.add_argument_group("run")
    _add_run_flags(run)
    _add_trial_flags(run)
    _add_finish_flags(run)
    _add_guard_and_fleet_flags(p)
    _add_workload_flags(p)
    return p


def _add_run_flags(run: argparse._ArgumentGroup) -> None:
    """How long the run goes, where its step runs, and how it searches."""
    run.add_argument(
        "--n-trials",
        type=int,
        default=None,
        help="trials for this process (default: 20; unbounded with --total-trials)",
    )
    run.add_argument(
        "--total-trials",
        type=int,
        default=None,
        help="stop the whole fleet once the study holds this many finished trials",
    )
    run.add_argument(
        "--timeout", type=float, default=None, help="seconds for this whole run (default: none)"
    )
    run.add_argument(
        "--device",
        default="auto",
        help="where the step runs: auto (cuda if present), cpu, cuda[:N]",
    )
    run.add_argument(
        "--nproc-per-node",
        default="1",
        metavar="N|auto",
        help="training processes per node, as torchrun's flag: each trial runs N ranks, each its "
        "own DataLoader over its DistributedSampler shard; auto is the CUDA GPU count, else 1",
    )
    run.add_argument(
        "--seed",
        type=int,
        default=None,
        help="the sampler's seed, for a repeatable search (default: none; a resumed study's "
        "seed moves on by the trials it holds)",
    )
    run.add_argument(
        "--sampler",
        choices=SAMPLERS,
        default=StudyConfig.sampler,
        help="the search: model (the pipeline model's predictions, corrected by each "
        "measurement; gp where no model can be built), gp (Optuna's GPSampler), tpe "
        "(with the pruner) or random",
    )


def _add_trial_flags(run: argparse._ArgumentGroup) -> None:
    """What each trial measures, and how."""
    run.add_argument(
        "--trial-seconds",
        type=float,
        default=StudyConfig.trial_seconds,
        help="measurement window per trial, in seconds",
    )
    run.add_argument(
        "--warmup-seconds",
        type=float,
        default=StudyConfig.warmup_seconds,
        help="seconds each trial runs before its window starts (workers start, caches fill)",
    )
    run.add_argument(
        "--trial-timeout",
        type=float,
        default=None,
        help="kill a trial after this many seconds (default: 60 + 3x its windows)",
    )
    run.add_argument(
        "--fix",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="freeze a parameter, e.g. batch_size=64 (repeatable)",
    )
    run.add_argument(
        "--effective-batch",
        type=int,
        default=None,
        help="keep this effective batch through gradient accumulation",
    )
    run.add_argument(
        "--multiprocessing-context",
        choices=("fork", "spawn", "forkserver"),
        default=None,
        help="the DataLoader's worker start method (default: the platform's)",
    )


def _add_finish_flags(run: argparse._ArgumentGroup) -> None:
    """The batch probe first, the re-measurement last, and what the run prints."""
    run.add_argument(
        "--no-probe-batch",
        dest="probe_batch",
        action="store_false",
        help="skip finding the largest batch that fits first",
    )
    run.add_argument(
        "--remeasure-top",
        type=int,
        default=StudyConfig.remeasure_top,
        help="re-measure this many best settings side by side at the end (0: none)",
    )
    run.add_argument(
        "--remeasure-rounds",
        type=int,
        default=StudyConfig.remeasure_rounds,
        help="hold-out rounds of the pick and the baselines, side by side, after the selection "
        "(their median is the printed figure); the selection itself takes one fresh round of "
        "each of the top settings",
    )
    add_artifact_dir(run)
    run.add_argument(
        "--no-progress",
        dest="progress",
        action="store_false",
        help="no progress bar (the set-up and result lines still print)",
    )
    run.add_argument(
        "--verbose",
        action="store_true",
        help="the tuner's diagnostics in the summary: the ceiling, the bound, the model's "
        "error and the pipeline profile",
    )


def _add_guard_and_fleet_flags(p: argparse.ArgumentParser) -> None:
    """The memory guard's budgets, and a fleet's heartbeats."""
    guard = p.add_argument_group("memory guard")
    guard.add_argument(
        "--memory-limit",
        default=None,
        metavar="SIZE|FRACTION",
        help="host budget (default: 90%% of RAM or the cgroup limit)",
    )
    guard.add_argument(
        "--shm-limit",
        default=None,
        metavar="SIZE|FRACTION",
        help="/dev/shm budget (default: 90%% of /dev/shm)",
    )
    guard.add_argument(
        "--gpu-memory-limit",
        default=None,
        metavar="SIZE|FRACTION",
        help="device budget (default: 95%% of the device)",
    )
    fleet = p.add_argument_group("fleet")
    fleet.add_argument(
        "--heartbeat-interval",
        type=int,
        default=StudyConfig.heartbeat_interval,
        help="seconds between a running trial's heartbeats",
    )
    fleet.add_argument(
        "--grace-period",
        type=int,
        default=None,
        help="seconds without a heartbeat before a trial is failed and retried "
        "(default: Optuna's, twice the heartbeat interval)",
    )


def _add_workload_flags(p: argparse.ArgumentParser) -> None:
    """The built-in workloads' options."""
    workload = p.add_argument_group("built-in workloads")
    workload.add_argument(
        "--arch",
        default=None,
        help="image: the network, small-cnn (default) or resnet50 (needs torchvision)",
    )
    workload.add_argument(
        "--images", type=int, default=None, help="image: how many JPEGs to generate"
    )
    workload.add_argument(
        "--resolution", type=int, default=None, help="image: generated JPEG size in pixels"
    )
    workload.add_argument(
        "--image-dir", default=None, help="image: read real image files from this folder"
    )
    workload.add_argument(
        "--sequences", type=int, default=None, help="text: how many token sequences"
    )
    workload.add_argument(
        "--vocab-size", type=int, default=None, help="text: token ids (default 2048)"
    )
    workload.add_argument(
        "--max-length", type=int, default=None, help="text: the longest sequence (default 512)"
    )
    workload.add_argument("--samples", type=int, default=None, help="storage: how many samples")
    workload.add_argument(
        "--latency-ms", type=int, default=None, help="storage: each sample's wait (default 8)"
    )


_WORKLOAD_FLAGS = {
    "image": ("arch", "images", "resolution", "image_dir"),
    "text": ("sequences", "vocab_size", "max_length"),
    "storage": ("samples", "latency_ms"),
}


def _objective_options(args: argparse.Namespace) -> dict[str, object]:
    options = {}
    for objective, flags in _WORKLOAD_FLAGS.items():
        for flag in flags:
            value = getattr(args, flag)
            if value is None:
                continue
            if args.objective != objective:
                raise UsageError(
                    f"--{flag.replace('_', '-')} applies to --objective {objective} only"
                )
            options[flag] = value
    return options


def config_from_args(args: argparse.Namespace) -> StudyConfig:
    """The run the parsed flags describe."""
    return StudyConfig(
        hardware=args.hardware,
        objective=args.objective,
        objective_options=_objective_options(args),
        storage=storage_url(args.storage),
        study_name=args.study_name,
        n_trials=args.n_trials if args.n_trials is not None or args.total_trials else 20,
        total_trials=args.total_trials,
        timeout=args.timeout,
        device=args.device,
        seed=args.seed,
        trial_seconds=args.trial_seconds,
        warmup_seconds=args.warmup_seconds,
        trial_timeout=args.trial_timeout,
        fix=args.fix,
        effective_batch=args.effective_batch,
        sampler=args.sampler,
        memory_limit=args.memory_limit,
        shm_limit=args.shm_limit,
        gpu_memory_limit=args.gpu_memory_limit,
        probe_batch=args.probe_batch,
        remeasure_top=args.remeasure_top,
        remeasure_rounds=args.remeasure_rounds,
        multiprocessing_context=args.multiprocessing_context,
        heartbeat_interval=args.heartbeat_interval,
        grace_period=args.grace_period,
        profiles_file=args.profiles,
        artifact_dir=args.artifact_dir,
        progress=args.progress,
        nproc_per_node=args.nproc_per_node,
    )


def main(argv: Sequence[str] | None = None, prog: str = PROG) -> int:
    """Run a study from command-line flags; the summary on stdout. Returns the exit code."""
    args = parser(prog).parse_args(argv)
    result = run_study(config_from_args(args))
    best = print_summary(result.study, result.batch_param, out=sys.stdout, verbose=args.verbose)
    if best is None and result.trials_run:
        raise NoResultError(no_result_message(result.study))
    return 0 if best is not None or result.trials_run else 1


if __name__ == "__main__":
    run_cli("tuner.study", main)
