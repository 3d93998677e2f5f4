"""What the pipeline model costs to set up on a big node: predictions and CPU seconds.

    python -m bench.scale --vcpus 96 --ranks 8

Builds what a study builds before its first trial (:func:`tuner.run._study` in order: the worker
range, the model with its bound, the seeds) for a synthetic image-like profile on ``--vcpus``
usable cores shared by ``--ranks`` training processes, and prints how many settings the model
predicted (counted at :func:`tuner.pipeline.predict`, the one prediction function) and the CPU
seconds it took. The count is what the tests hold; the seconds are this machine's.

The profile is the image workload's as stored on 2 cores (a 0.43 ms decode per sample, a
two-value ``collate`` knob, a step at 2,600 samples/s on one thread), with the step measured at
one thread, one rank's cores and all of them (the ceiling measures one and all), its rate
growing with the square root of the threads; 8 GiB of host memory per vCPU.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import math
import sys
import time
from collections.abc import Iterator, Sequence

from objectives import Workload
from tuner.pipeline import PipelineModel, PipelineProfile, _model, model_seeds, worker_range
from tuner.pipeline._profile import KNOB_COST_FIELDS, knob_key
from tuner.search import SearchSpace

BATCHES = (8, 16, 32, 64, 128, 256, 512)
HOST_BYTES_PER_VCPU = 8 * 2**30
ONE_THREAD_RATE = 2_600.0
"""The image step's samples/s on one thread (the stored 2-core profiles: 2,060-2,840)."""


@dataclasses.dataclass(frozen=True)
class ScaleResult:
    """What one set-up cost: settings predicted, CPU seconds, and what it chose."""

    predictions: int
    cpu_s: float
    worker_range: int
    best: str
    seeds: int


def synthetic_profile(vcpus: int, ranks: int = 1) -> PipelineProfile:
    """An image-like profile on ``vcpus`` usable cores shared by ``ranks`` ranks (see the
    module docstring)."""
    per_rank = max(1, vcpus // max(1, ranks))
    threads = sorted({1, per_rank, vcpus})
    rates = {t: {b: ONE_THREAD_RATE * math.sqrt(t) for b in BATCHES} for t in threads}
    cpu = {t: {b: t / rates[t][b] for b in BATCHES} for t in threads}
    base = {
        "fetch_wall_s": 0.000435,
        "fetch_cpu_s": 0.000434,
        "fetch_runqueue_s": 2e-6,
        "collate_s": 0.0000587,
        "ipc_dump_s": 0.0000924,
        "ipc_load_s": 0.0000428,
        "transfer_s": 6.8e-7,
        "sample_bytes": 150_536.0,
        "loader_main_cpu_s": 0.0000407,
        "loader_worker_cpu_s": 0.000458,
    }
    uint8 = {
        **{name: base[name] for name in KNOB_COST_FIELDS},
        "fetch_wall_s": 0.000323,
        "fetch_cpu_s": 0.000324,
        "collate_s": 0.0000319,
        "ipc_dump_s": 0.0000332,
        "sample_bytes": 37_640.0,
        "loader_worker_cpu_s": 0.000312,
        "step_time_ratio": 1.27,
    }
    return PipelineProfile(
        **base,  # type: ignore[arg-type]
        worker_start_s=0.0088,
        worker_uss_bytes=29_331_456,
        worker_pss_bytes=134_273_024,
        samples_per_batch={b: float(b) for b in BATCHES},
        usable_cores=float(vcpus),
        step_rates=rates,
        step_cpu_s=cpu,
        profiled_batch=32,
        measured_samples=512,
        dataset_samples=50_000,
        knob_costs={knob_key("collate", "uint8"): uint8},
        ranks=ranks,
    )


def synthetic_space(vcpus: int) -> SearchSpace:
    """The space a study starts from on ``vcpus`` cores: workers up to twice the vCPUs, threads
    up to all of them, batches 8-512, the ``collate`` knob."""
    workload = Workload(
        name="scale",
        dataset=[],  # type: ignore[arg-type]  # never loaded: the model reads the profile only
        batch_size_range=(BATCHES[0], BATCHES[-1]),
        knobs={"collate": ("float", "uint8")},
        configure=lambda **knobs: workload,
    )
    return SearchSpace(
        workload=workload,
        max_workers=min(2 * vcpus, _model.HARD_MAX_WORKERS),
        max_threads=vcpus,
        cuda=False,
    )


@contextlib.contextmanager
def counted_predictions() -> Iterator[list[int]]:
    """Count every call of the model's prediction function while inside (``[count]``)."""
    count = [0]
    original = _model.predict

    def counting(profile: PipelineProfile, settings: object) -> _model.Prediction:
        count[0] += 1
        return original(profile, settings)  # type: ignore[arg-type]

    _model.predict = counting  # type: ignore[assignment]
    try:
        yield count
    finally:
        _model.predict = original


def set_up(vcpus: int, ranks: int = 1) -> ScaleResult:
    """The worker range, the model (bound and best) and the seeds for ``vcpus`` x ``ranks``."""
    profile, space = synthetic_profile(vcpus, ranks), synthetic_space(vcpus)
    host_limit = vcpus * HOST_BYTES_PER_VCPU
    with counted_predictions() as count:
        started = time.process_time()
        space = dataclasses.replace(space, max_workers=worker_range(profile, space, host_limit))
        model = PipelineModel.build(profile, space, host_limit)
        seeds = model_seeds(profile, space)
        cpu_s = time.process_time() - started
    best = model.best
    described = (
        f"num_workers={best.num_workers}, batch_size={best.batch}, "
        f"threads={best.torch_num_threads}, collate={best.knobs.get('collate')}"
    )
    return ScaleResult(count[0], cpu_s, space.max_workers, described, len(seeds))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.scale",
        description="The pipeline model's set-up cost for a synthetic profile on a big node.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--vcpus", type=int, default=96, help="usable cores of the node")
    parser.add_argument("--ranks", type=int, default=1, help="training processes per node")
    args = parser.parse_args(argv)
    if args.vcpus < 1 or args.ranks < 1:
        print("bench.scale: --vcpus and --ranks must be at least 1", file=sys.stderr)
        return 2
    result = set_up(args.vcpus, args.ranks)
    print(f"{args.vcpus} vCPUs, {args.ranks} rank(s): {result.predictions} predictions")
    print(f"{result.cpu_s:.2f} CPU seconds")
    print(f"worker range 0..{result.worker_range}; predicted best {result.best}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
