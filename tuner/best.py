"""``python -m tuner.best``: print the best setting stored for a hardware profile, all of it.

python -m tuner.best --hardware auto --format python
python -m tuner.best --hardware g4dn.xlarge --format json > best.json
python -m tuner.best --hardware auto --objective train.py:workload --format hf
python -m tuner.best --objective image --nproc-per-node 4   # the study tuned for 4 ranks

Every format carries the whole setting (DataLoader arguments, the main process's intra-op
threads, the workload's knobs) from one :class:`tuner.insight.BestSetting`. The JSON shape is
documented in the README: ``DataLoader(ds, **setting["dataloader"])`` stays one line. ``hf``
prints Hugging Face ``TrainingArguments`` code (:mod:`tuner.integrations.huggingface`).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence

import optuna

from tuner._cli import ArgumentParser, UsageError, add_common, run_cli, storage_url
from tuner.insight import best_setting, extra_settings, format_table
from tuner.integrations.huggingface import training_arguments_snippet

__all__ = ["PROG", "main", "parser"]


PROG = "python -m tuner.best"


def parser(prog: str = PROG) -> argparse.ArgumentParser:
    """The flags of ``best``; ``prog`` names the command in usage and error lines."""
    p = ArgumentParser(prog=prog, description="Print the best DataLoader setting of a profile.")
    add_common(p)
    p.add_argument(
        "--format",
        choices=("table", "json", "python", "hf"),
        default="table",
        help="table to read, json to parse, python code to paste, or Hugging Face "
        "TrainingArguments code (hf)",
    )
    p.add_argument(
        "--nproc-per-node",
        type=int,
        default=1,
        metavar="N",
        help="the ranks per node the study was tuned for (study --nproc-per-node); each rank "
        "applies the setting to its own DataLoader",
    )
    return p


def main(argv: Sequence[str] | None = None, prog: str = PROG) -> int:
    args = parser(prog).parse_args(argv)
    if args.nproc_per_node < 1:
        raise UsageError(f"--nproc-per-node must be a positive count, got {args.nproc_per_node}")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    best = best_setting(
        args.hardware,
        objective=args.objective,
        storage=storage_url(args.storage),
        study_name=args.study_name,
        profiles_file=args.profiles,
        nproc_per_node=args.nproc_per_node,
    )
    if args.format == "json":
        print(json.dumps(best.to_json(), indent=2))
    elif args.format == "hf":
        try:
            print(training_arguments_snippet(best))
        except ValueError as error:
            raise UsageError(str(error)) from None
    elif args.format == "python":
        print(f"# {best.summary()}")
        print(best.snippet())
    else:
        print(best.summary())
        extra = extra_settings(best.settings, best.batch_param)
        rows = [*best.dataloader_kwargs.items(), *extra.items()]
        print(format_table(["parameter", "value"], rows))
        print(
            "\napply all of it: DataLoader(dataset, **kwargs), "
            f"torch.set_num_threads({best.torch_num_threads}) in the training process"
            + (", and the workload's knobs (--format python shows the code)" if best.knobs else "")
        )
    return 0


if __name__ == "__main__":
    run_cli("tuner.best", main)
