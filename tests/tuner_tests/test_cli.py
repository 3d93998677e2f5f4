"""``dataloader-tuner``: one command whose subcommands are the verbs' own parsers, help that
shows every flag with its default, errors named after the command, and docs/cli.md as the
parsers generate it."""

from __future__ import annotations

import argparse

import pytest

from tests.cli_runner import CliRunner
from tests.conftest import forked_cli
from tuner import _cli_doc
from tuner.cli import COMMANDS, verb_parser


def _actions(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """Every argument of ``parser`` and of its subcommands (``profiles list``, ...)."""
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found += _actions(sub)
        elif not isinstance(action, argparse._HelpAction):
            found.append(action)
    return found


def test_docs_cli_md_is_what_the_parsers_generate() -> None:
    assert _cli_doc.DOC_PATH.read_text(encoding="utf-8") == _cli_doc.render(), (
        "docs/cli.md is stale: run python -m tuner._cli_doc"
    )


@pytest.mark.parametrize("verb", list(COMMANDS))
def test_every_flag_has_help(verb: str) -> None:
    missing = [action.dest for action in _actions(verb_parser(verb)) if not action.help]
    assert missing == []


@pytest.mark.parametrize("verb", list(COMMANDS))
def test_a_subcommand_is_the_verbs_own_parser(verb: str) -> None:
    module = __import__(f"tuner.{verb}", fromlist=["parser"])
    ours = [(a.option_strings, a.dest, a.default) for a in _actions(verb_parser(verb))]
    theirs = [(a.option_strings, a.dest, a.default) for a in _actions(module.parser())]
    assert ours == theirs


def test_help_lists_the_subcommands_and_each_shows_its_defaults(cli_runner: CliRunner) -> None:
    top = forked_cli(cli_runner, "tuner.cli", "--help")
    assert top.returncode == 0, top.stderr
    assert all(verb in top.stdout for verb in COMMANDS)
    study = forked_cli(cli_runner, "tuner.cli", "study", "--help")
    assert study.returncode == 0, study.stderr
    text = " ".join(study.stdout.split())  # help wraps with the terminal's width
    assert text.startswith("usage: dataloader-tuner study")
    for shown in ("--arch ARCH", "(default: model)", "(default: 3)", "--seed SEED"):
        assert shown in text
    assert "--model" not in text


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["study", "--hardware", "auto", "--n-trails", "5"], "study: error: unrecognized"),
        (["study", "--hardware", "auto", "--n-trials", "0"], "study: error: --n-trials must"),
        (["study", "--hardware", "auto", "--model", "resnet50"], "study: error: unrecognized"),
        (["best", "--hardware", "no-such-box"], "best: error: unknown hardware profile"),
        (["tune"], ": error: argument COMMAND: invalid choice: 'tune'"),
    ],
)
def test_errors_are_one_line_named_after_the_command(
    argv: list[str], says: str, tmp_path: object, cli_runner: CliRunner
) -> None:
    result = forked_cli(cli_runner, "tuner.cli", *argv, "--storage", f"sqlite:///{tmp_path}/t.db")
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2, result.stderr
    assert len(lines) == 1 and lines[0].startswith(f"dataloader-tuner {says}".replace(" :", ":"))
    assert "Traceback" not in result.stderr


def test_the_installed_command_is_this_entry_point() -> None:
    import tomllib

    from tests.conftest import ROOT

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["scripts"] == {"dataloader-tuner": "tuner.cli:main"}
