"""``python -m tuner.report``: write a study's report as one HTML file that opens offline.

    python -m tuner.report --hardware auto --out report.html
    python -m tuner.report --hardware g4dn.xlarge --objective text --out text.html

No study, or no completed trial in it: exit code 1. A bad argument: one line, exit code 2.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import optuna

from storage import artifact_dir_for, mask_url, open_storage, sqlite_file_missing
from tuner._cli import (
    ArgumentParser,
    UsageError,
    add_artifact_dir,
    add_common,
    run_cli,
    storage_url,
)
from tuner._naming import study_name
from tuner.insight import NoResultError, resolve_profile_name

__all__ = ["PROG", "main", "parser"]


PROG = "python -m tuner.report"


def parser(prog: str = PROG) -> argparse.ArgumentParser:
    """The flags of ``report``; ``prog`` names the command in usage and error lines."""
    p = ArgumentParser(
        prog=prog,
        description="Write a study's report as one self-contained HTML file.",
    )
    add_common(p)
    p.add_argument("--out", required=True, metavar="FILE.html", help="the HTML file to write")
    add_artifact_dir(p)
    return p


def main(argv: Sequence[str] | None = None, prog: str = PROG) -> int:
    args = parser(prog).parse_args(argv)
    out = Path(args.out)
    if out.is_dir() or not out.parent.resolve().is_dir():
        raise UsageError(f"--out {args.out}: not a file in an existing directory")
    url = storage_url(args.storage)
    name = args.study_name or study_name(
        args.objective, resolve_profile_name(args.hardware, args.profiles)
    )
    create = f"dataloader-tuner study --hardware {args.hardware} --objective {args.objective}"
    if sqlite_file_missing(url):
        raise NoResultError(f"no study {name} in {mask_url(url)}; create it with: {create}")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        study = optuna.load_study(
            study_name=name, storage=open_storage(url, heartbeat_interval=None)
        )
    except KeyError:
        raise NoResultError(
            f"no study {name} in {mask_url(url)}; create it with: {create}"
        ) from None

    from optuna.artifacts import FileSystemArtifactStore

    from tuner.insight import build_report

    directory = artifact_dir_for(url, args.artifact_dir)
    store = FileSystemArtifactStore(directory) if directory.is_dir() else None
    try:
        text = build_report(study, store)
    except ValueError:
        raise NoResultError(f"study {name} has no completed trial yet; run: {create}") from None
    try:
        out.write_text(text, encoding="utf-8")
    except OSError as error:
        raise UsageError(f"--out {args.out}: {error.strerror or error}") from None
    print(f"wrote {out} ({name})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    run_cli("tuner.report", main)
