"""``python -m tuner.best``: print the best DataLoader setting stored for a hardware profile.

python -m tuner.best --hardware auto --format python
python -m tuner.best --hardware g4dn.xlarge --format json > loader.json
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from tuner._cli import ArgumentParser, add_common, run_cli, storage_url
from tuner.insight._best import find_best
from tuner.insight._snippet import dataloader_snippet, extra_settings
from tuner.insight._table import format_table

__all__ = ["main", "parser"]


def parser() -> argparse.ArgumentParser:
    p = ArgumentParser(
        prog="python -m tuner.best", description="Print the best DataLoader setting of a profile."
    )
    add_common(p)
    p.add_argument("--format", choices=("table", "json", "python"), default="table")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    best = find_best(
        args.hardware, args.objective, storage_url(args.storage), args.profiles, args.study_name
    )
    kwargs = best.dataloader_kwargs()
    extra = extra_settings(best.settings, best.batch_param)
    summary = (
        f"{best.study_name}: trial {best.trial.number}, {best.samples_per_sec:,.1f} samples/s, "
        f"best of {best.finished_trials} finished trials"
    )
    if args.format == "json":
        # stdout is exactly DataLoader(ds, **kw); the rest goes to stderr for humans.
        print(json.dumps(kwargs, indent=2))
        print(f"# {summary}; also: {json.dumps(extra)}", file=sys.stderr)
    elif args.format == "python":
        print(f"# {summary}")
        print(dataloader_snippet(best.settings, best.batch_param))
    else:
        print(summary)
        print(format_table(["parameter", "value"], [*kwargs.items(), *extra.items()]))
    return 0


if __name__ == "__main__":
    run_cli("tuner.best", main)
