"""One plain training loop of one setting, as a user writes it: what
:func:`bench._harness.measure_plain` starts in a fresh interpreter, alone or as each of
``torch.distributed.run``'s ranks.

    python -m bench.plain_loop --objective image --options '{"images": 512}' \
        --settings '{"batch": 64, "num_workers": 2, ...}' --window-s 5
    python -m torch.distributed.run --standalone --nproc-per-node 2 -m bench.plain_loop ...

It sets ``torch.set_num_threads`` as tuned, builds the DataLoader
(:func:`bench._harness.plain_loader`: shuffled, ``drop_last``; under torchrun each rank's
``DistributedSampler`` shard) and runs :func:`bench._harness.plain_loop`. Under torchrun the
ranks form a process group (gloo on the CPU, NCCL on CUDA), and a workload that hands over its
model trains it under ``DistributedDataParallel``.
Prints one JSON line (rank 0 only): the loop's result.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
from collections.abc import Sequence

import torch

from bench._harness import PLAIN_WARMUP_BATCHES, plain_loader, plain_loop
from objectives import load_workload
from tuner.search import LoaderSettings


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench.plain_loop", description=__doc__.split("\n")[0]
    )
    p.add_argument("--objective", required=True, help="a built-in name or module:attr")
    p.add_argument("--options", default="{}", help="the workload's options, a JSON object")
    p.add_argument("--settings", required=True, help="LoaderSettings attrs, a JSON object")
    p.add_argument("--batch-param", default="batch_size", help="the workload's batch parameter")
    p.add_argument("--warmup-batches", type=int, default=PLAIN_WARMUP_BATCHES)
    p.add_argument("--window-s", type=float, default=5.0, help="seconds counted")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    settings = LoaderSettings.from_attrs(json.loads(args.settings))
    sharded = int(os.environ.get("WORLD_SIZE", "1")) > 1
    if sharded:
        import torch.distributed as dist

        backend = "nccl" if torch.cuda.is_available() else "gloo"
        if torch.cuda.is_available():
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group(backend)
    torch.set_num_threads(settings.torch_num_threads)
    workload = load_workload(args.objective, json.loads(args.options))
    workload, loader = plain_loader(workload, settings, args.batch_param, sharded=sharded)
    result = plain_loop(
        loader,
        workload,
        0.0,
        args.window_s,
        warmup_batches=args.warmup_batches,
        accumulation_steps=settings.accumulation_steps,
    )
    if sharded:
        # DDP's reducer sits in reference cycles: collected after the group is gone, at exit,
        # it aborts the rank ("terminate called without an active exception").
        gc.collect()
        dist.barrier()
        dist.destroy_process_group()
    if int(os.environ.get("RANK", "0")) == 0:
        print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
