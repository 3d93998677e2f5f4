"""The runner's child is what ``python -m`` gives: the same stdout, stderr, exit code and exit
steps as a real interpreter running the same module, for each way a program ends."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.cli_runner import CliRunner
from tests.conftest import forked_cli, run_cli

PROBE = """
import atexit, os, sys, threading, time

print("argv", sys.argv[1:], "as", __name__, "first on the path", sys.path[0] == os.getcwd())
print("stdin", repr(sys.stdin.read()), "env", os.environ.get("CLI_RUNNER_PROBE"))
atexit.register(lambda: print("atexit ran", file=sys.stderr))
how = sys.argv[1]
if how == "thread":
    threading.Thread(target=lambda: (time.sleep(0.2), print("thread finished"))).start()
if how == "code":
    sys.exit(3)
if how == "message":
    sys.exit("a message")
if how == "raise":
    raise ValueError("boom")
"""


def _without_frames(stderr: str) -> list[str]:
    """stderr less a traceback's frame lines (the runner's own frames sit above the module's)."""
    return [line for line in stderr.splitlines() if not line.startswith("  ")]


@pytest.mark.parametrize("how", ["returns", "thread", "code", "message", "raise"])
def test_a_forked_command_ends_as_the_interpreter_ends_it(
    how: str, tmp_path: Path, cli_runner: CliRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "probe.py").write_text(PROBE)
    monkeypatch.setenv("CLI_RUNNER_PROBE", "seen")

    forked = forked_cli(cli_runner, "probe", how, cwd=tmp_path)
    real = run_cli("probe", how, cwd=tmp_path)

    assert real.stdout.startswith(f"argv ['{how}'] as __main__ first on the path True\n")
    assert "stdin '' env seen" in real.stdout
    assert (forked.returncode, forked.stdout) == (real.returncode, real.stdout)
    assert _without_frames(forked.stderr) == _without_frames(real.stderr), forked.stderr
    assert real.stderr.endswith("atexit ran\n")


def test_a_hung_command_is_killed_at_its_timeout(tmp_path: Path, cli_runner: CliRunner) -> None:
    (tmp_path / "hang.py").write_text("import time\ntime.sleep(600)\n")
    (tmp_path / "done.py").write_text("print('served')\n")
    with pytest.raises(subprocess.TimeoutExpired):
        forked_cli(cli_runner, "hang", cwd=tmp_path, timeout=1)
    assert forked_cli(cli_runner, "done", cwd=tmp_path).stdout == "served\n"  # the next one runs
