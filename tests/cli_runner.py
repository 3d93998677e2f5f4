"""``python -m tuner.<verb> ...`` as a user types it, without an interpreter start per command.

The runner is one interpreter, started once, that imports what the verbs import (torch, Optuna,
SQLAlchemy, the tuner's packages, Lightning, Transformers) and then only forks. Each command is a
child that takes the command's argv, working folder and environment, points fds 0, 1 and 2 at
/dev/null and two files, and runs the module as ``__main__`` (``runpy.run_module``) with nothing
of the runner's above it to catch what it raises: its ``SystemExit``, or an uncaught exception's
traceback and exit code 1, are the interpreter's own, and so are the exit handlers that run. The
parent only imports and forks: it opens no database and starts no thread (checked before each
fork), so a child inherits imported modules and nothing else. A runner whose imports wrote
anything (a warning a fresh interpreter would print beside a command's one line) refuses to start.

What a child cannot show, and what therefore keeps a real subprocess: anything read at
interpreter start or at import, that is ``PYTHONPATH`` and the environment variables modules read
as they load (``TUNER_DB_RETRY_SECONDS``), and anything that depends on a module not being
imported yet. :meth:`CliRunner.run` therefore takes no environment of its own: the command sees
the test process's environment with ``PYTHONPATH`` set to the checkout, as
:func:`tests.conftest.run_cli` gives it.
"""

from __future__ import annotations

import atexit
import gc
import importlib
import json
import os
import runpy
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import TracebackType
from typing import IO, Any

ROOT = Path(__file__).resolve().parents[1]

PREIMPORTS = (
    "torch",
    "optuna",
    "sqlalchemy",
    "psycopg",
    "storage",
    "objectives",
    "tuner._cli",
    "tuner.run",
    "tuner.insight",
    "tuner.fleet",
    "tuner.machine",
    "tuner.integrations.huggingface",
    "lightning",
    "transformers",
)
"""What the verbs and the tests' workloads import, loaded once; never a verb module itself, which
``runpy`` must find unimported to run it as ``__main__`` the way ``python -m`` does."""


class CliRunner:
    """A pre-imported interpreter that runs ``python -m`` commands in forked children.

    Use it as a context manager; the runner starts on the first :meth:`run` and ends on exit.
    One command runs at a time.
    """

    def __init__(self, start_timeout: float = 300) -> None:
        self.start_timeout = start_timeout
        self._process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._requests = -1
        self._replies = -1
        self._pending = b""

    def __enter__(self) -> CliRunner:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def run(
        self, argv: list[str], cwd: Path, timeout: float = 300
    ) -> subprocess.CompletedProcess[str]:
        """Run ``python -m <argv>`` in ``cwd``; what ``subprocess.run`` with captured text returns.

        Args:
            argv: the module, then its arguments, as after ``python -m``.
            cwd: the working folder, also ``sys.path[0]`` as under ``python -m``.
            timeout: seconds before the command is killed and ``subprocess.TimeoutExpired``
                raised.

        Returns:
            The exit code (negative for a signal, as ``subprocess`` gives it), stdout and stderr.
        """
        self._start()
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        with tempfile.TemporaryDirectory(prefix="cli-runner-") as folder:
            out, err = Path(folder) / "stdout", Path(folder) / "stderr"
            request = {"argv": argv, "cwd": str(cwd), "env": env, "out": str(out), "err": str(err)}
            os.write(self._requests, json.dumps(request).encode() + b"\n")
            deadline = time.monotonic() + timeout
            pid = int(self._reply(deadline))
            try:
                code = int(self._reply(deadline))
            except subprocess.TimeoutExpired:
                os.kill(pid, signal.SIGKILL)
                self._reply(time.monotonic() + 60)
                raise subprocess.TimeoutExpired([sys.executable, "-m", *argv], timeout) from None
            command = [sys.executable, "-m", *argv]
            return subprocess.CompletedProcess(command, code, out.read_text(), err.read_text())

    def close(self) -> None:
        """End the runner: it exits once its requests are closed."""
        if self._process is None:
            return
        os.close(self._requests)
        os.close(self._replies)
        try:
            self._process.wait(60)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        assert self._log is not None
        self._log.close()
        self._process = None

    def _start(self) -> None:
        if self._process is not None:
            return
        request_read, self._requests = os.pipe()
        self._replies, reply_write = os.pipe()
        self._log = tempfile.TemporaryFile()  # noqa: SIM115  # the runner's; closed by close()
        self._process = subprocess.Popen(
            [sys.executable, "-m", "tests.cli_runner", str(request_read), str(reply_write)],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=self._log,
            pass_fds=(request_read, reply_write),
        )
        os.close(request_read)
        os.close(reply_write)
        ready = self._reply(time.monotonic() + self.start_timeout)
        self._log.seek(0)
        written = self._log.read().decode(errors="replace")
        if ready != "ready" or written:
            self.close()
            raise RuntimeError(f"the CLI runner did not start cleanly:\n{written}")

    def _reply(self, deadline: float) -> str:
        """The runner's next line, waiting until ``deadline`` (``time.monotonic``)."""
        while b"\n" not in self._pending:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._replies], [], [], left)[0]:
                raise subprocess.TimeoutExpired("tests.cli_runner", left)
            chunk = os.read(self._replies, 4096)
            if not chunk:
                raise RuntimeError("the CLI runner exited")
            self._pending += chunk
        line, self._pending = self._pending.split(b"\n", 1)
        return line.decode()


# --- the runner process: python -m tests.cli_runner REQUESTS_FD REPLIES_FD -------------------


def serve(requests_fd: int, replies_fd: int) -> dict[str, Any]:
    """Import, then fork a child per request; returns only in a child, with its request.

    The parent writes the child's pid, then its exit code, one line each, and exits when the
    requests are closed.
    """
    for name in PREIMPORTS:
        importlib.import_module(name)
    gc.collect()
    gc.freeze()  # a child's collections then leave the imported objects, and their pages, alone
    os.write(replies_fd, b"ready\n")
    requests = os.fdopen(requests_fd, "rb")
    while line := requests.readline():
        request = json.loads(line)
        # A forked child runs only this thread: a lock another thread held would stay held.
        assert threading.active_count() == 1, threading.enumerate()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            requests.close()
            os.close(replies_fd)
            return request
        os.write(replies_fd, f"{pid}\n".encode())
        _, status = os.waitpid(pid, 0)
        os.write(replies_fd, f"{os.waitstatus_to_exitcode(status)}\n".encode())
    raise SystemExit(0)


def enter(request: dict[str, Any]) -> str:
    """Make this child the command's process; returns the module to run as ``__main__``."""
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    sys.path[0] = request["cwd"]  # python -m puts the working folder first
    for fd, path, flags in (
        (0, os.devnull, os.O_RDONLY),
        (1, request["out"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
        (2, request["err"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
    ):
        opened = os.open(path, flags, 0o644)
        os.dup2(opened, fd)
        os.close(opened)
    module, *args = request["argv"]
    sys.argv = ["-m", *args]  # runpy puts the module's file in argv[0], as python -m does
    return module


def exit_as_the_interpreter_does(module: str) -> None:
    """Run ``module`` as ``__main__``, then end this child as ``python -m`` ends.

    The exit code and what is printed for it are the interpreter's (``SystemExit``'s code, or
    its message and 1; an uncaught exception's traceback and 1; SIGINT for Ctrl-C), then its
    exit steps in its order: waiting for threads, the ``atexit`` handlers, flushing stdout and
    stderr. Tearing down the modules is left out: in a forked child it would copy every page
    the runner's imports filled, for nothing a command shows.
    """
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exit:
        code = _system_exit_code(exit)
    except KeyboardInterrupt:
        sys.excepthook(*sys.exc_info())
        code = -signal.SIGINT
    except BaseException:
        sys.excepthook(*sys.exc_info())
        code = 1
    threading._shutdown()  # type: ignore[attr-defined]  # the interpreter's own exit step
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    if code == -signal.SIGINT:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(code)


def _system_exit_code(exit: SystemExit) -> int:
    if exit.code is None:
        return 0
    if isinstance(exit.code, int):
        return exit.code
    print(exit.code, file=sys.stderr)
    return 1


if __name__ == "__main__":
    exit_as_the_interpreter_does(enter(serve(int(sys.argv[1]), int(sys.argv[2]))))
