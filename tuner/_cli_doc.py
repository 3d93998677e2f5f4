"""docs/cli.md, the command-line reference, generated from the argparse parsers themselves.

    python -m tuner._cli_doc            # rewrites docs/cli.md
    python -m tuner._cli_doc --check    # exit 1 when docs/cli.md is stale

Each subcommand gets its usage and one table per argument group: the flag, its default, its help.
The text depends on the parsers only (a fixed width, no terminal, nothing read from the machine),
so the file is the same wherever it is generated; tests/tuner_tests/test_cli.py fails when it is
stale.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tuner.cli import COMMANDS, PROG, verb_parser

__all__ = ["DOC_PATH", "render"]

DOC_PATH = Path(__file__).resolve().parents[1] / "docs" / "cli.md"

_HEAD = f"""# Command-line reference

Generated from the argparse parsers by `python -m tuner._cli_doc`; do not edit by hand.

`{PROG} COMMAND [flags]` runs a subcommand; `python -m tuner.COMMAND [flags]` runs the same
one. `{PROG} COMMAND --help` prints what follows for one command. Bad input is one line on
stderr and exit code 2; "nothing to show" (no study, no finished trial) is exit code 1.
"""


def _flag(action: argparse.Action) -> str:
    if not action.option_strings:
        return str(action.metavar or action.dest)
    if action.nargs == 0:
        return ", ".join(action.option_strings)
    if action.metavar is not None:
        value = str(action.metavar)
    elif action.choices is not None:
        value = "{" + ",".join(str(choice) for choice in action.choices) + "}"
    else:
        value = action.dest.upper()
    return ", ".join(f"{option} {value}" for option in action.option_strings)


def _default(action: argparse.Action) -> str:
    if action.required:
        return "required"
    if action.nargs == 0 or action.default in (None, [], argparse.SUPPRESS):
        return ""
    return f"`{action.default}`"


def _cell(text: str) -> str:
    """Text in a Markdown table cell: pipes escaped, ``<name>`` shown rather than read as HTML."""
    return text.replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")


def _help(action: argparse.Action, prog: str) -> str:
    return _cell((action.help or "") % {**vars(action), "prog": prog})


def _tables(p: argparse.ArgumentParser) -> list[str]:
    lines: list[str] = []
    for group in p._action_groups:
        actions = [
            a
            for a in group._group_actions
            if not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction))
        ]
        if not actions:
            continue
        lines += [
            "",
            f"{group.title}:",
            "",
            "| flag | default | what it does |",
            "| --- | --- | --- |",
        ]
        lines += [f"| `{_cell(_flag(a))}` | {_default(a)} | {_help(a, p.prog)} |" for a in actions]
    return lines


def _subcommands(p: argparse.ArgumentParser) -> list[tuple[str, argparse.ArgumentParser]]:
    """The subcommands a parser holds (``profiles list``, ...), in order."""
    found = []
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            found += list(action.choices.items())
    return found


def _synopsis(p: argparse.ArgumentParser) -> str:
    """``prog`` and what follows it: the subcommand names, or the positionals and ``[flags]``."""
    subcommands = _subcommands(p)
    if subcommands:
        return f"{p.prog} {{{','.join(name for name, _ in subcommands)}}} [flags]"
    positionals = [str(a.metavar or a.dest) for a in p._actions if not a.option_strings]
    return " ".join([p.prog, *positionals, "[flags]"])


def _section(p: argparse.ArgumentParser, level: str) -> list[str]:
    lines = [f"{level} `{p.prog}`", ""]
    if p.description:
        lines += [p.description, ""]
    lines += ["```", _synopsis(p), "```", *_tables(p)]
    for _, sub in _subcommands(p):
        lines += ["", *_section(sub, level + "#")]
    return lines


def render() -> str:
    """The whole of docs/cli.md."""
    lines = [_HEAD, f"Commands (`{PROG} --help`):", ""]
    lines += [
        f"- [`{PROG} {verb}`](#{PROG}-{verb}): {summary}" for verb, summary in COMMANDS.items()
    ]
    for verb in COMMANDS:
        lines += ["", *_section(verb_parser(verb), "##")]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Rewrite docs/cli.md; with ``--check``, exit 1 when it is stale instead."""
    check = "--check" in (sys.argv[1:] if argv is None else argv)
    text = render()
    if check:
        stale = not DOC_PATH.exists() or DOC_PATH.read_text(encoding="utf-8") != text
        if stale:
            print(f"{DOC_PATH} is stale: run python -m tuner._cli_doc", file=sys.stderr)
        return 1 if stale else 0
    DOC_PATH.write_text(text, encoding="utf-8")
    print(f"wrote {DOC_PATH}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
