"""``dataloader-tuner``: the installed command, one subcommand per verb.

    dataloader-tuner study --hardware auto --n-trials 20
    dataloader-tuner best --hardware auto --format python
    dataloader-tuner report --hardware auto --out report.html
    dataloader-tuner dashboard
    dataloader-tuner profiles list

Each subcommand is the verb module's own parser and ``main`` (``dataloader-tuner study`` runs
exactly what ``python -m tuner.study`` runs), named ``dataloader-tuner <verb>`` in its usage and
error lines. As under ``python -m``, the working directory is on ``sys.path``, so an
``--objective mymodule:workload`` beside the user imports the same way in both.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import NoReturn

from tuner import __version__
from tuner._cli import ArgumentParser, run_cli

__all__ = ["COMMANDS", "PROG", "main", "parser", "verb_parser"]

PROG = "dataloader-tuner"

COMMANDS = {
    "study": "tune a workload's DataLoader on this machine for a hardware profile",
    "best": "print the best setting stored for a hardware profile",
    "report": "write a study's report as one self-contained HTML file",
    "dashboard": "serve optuna-dashboard on the tuner's storage and artifact store",
    "profiles": "list the hardware profiles, their studies, and this machine",
}
"""The subcommands, each the module ``tuner.<name>``, with its one line for ``--help``."""


def _module(verb: str) -> ModuleType:
    return importlib.import_module(f"tuner.{verb}")


def verb_parser(verb: str) -> argparse.ArgumentParser:
    """The parser of ``dataloader-tuner <verb>``: the verb module's own, under this name."""
    return _module(verb).parser(f"{PROG} {verb}")


def parser() -> argparse.ArgumentParser:
    """The top-level parser: a subcommand and its arguments (parsed by the verb's parser)."""
    p = ArgumentParser(
        prog=PROG,
        description="Tune PyTorch DataLoader settings per hardware profile with Optuna.",
        epilog=f"'{PROG} COMMAND --help' shows a command's flags and their defaults.",
    )
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = p.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for verb, summary in COMMANDS.items():
        # add_help=False: the verb's own parser answers --help and reads every flag.
        commands.add_parser(verb, help=summary, add_help=False)
    return p


def main(argv: Sequence[str] | None = None) -> NoReturn:
    """Run ``dataloader-tuner``: pick the subcommand, hand it the rest of the arguments."""
    args, rest = parser().parse_known_args(argv)
    if os.getcwd() not in sys.path:  # what python -m does; a console script does not
        sys.path.insert(0, os.getcwd())
    verb: str = args.command
    name = f"{PROG} {verb}"
    verb_main: Callable[..., int] = _module(verb).main
    run_cli(name, lambda given: verb_main(given, prog=name), rest)


if __name__ == "__main__":
    main()
