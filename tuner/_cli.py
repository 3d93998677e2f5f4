"""What every verb (``dataloader-tuner <verb>``, ``python -m tuner.<verb>``) shares: flag names,
help that shows each default, one-line errors, exit codes, and where progress goes.

Exit codes follow Optuna's CLI habits: 2 for a usage error (bad flag, unknown profile, storage
that cannot be opened), 1 for "nothing to show" (no study, no finished trial). Progress lines are
the ``tuner.run`` logger's INFO records, written to stderr (above a progress bar, where one runs);
warnings carry the program's name. Ctrl-C, and SIGTERM during a study, end it with one line on
stderr ("interrupted", "terminated") and 128 + the signal's number (130, 143).
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

import optuna

from objectives import WorkloadError
from storage import LostConnectionFilter, StorageError, default_storage_url, mask_password
from tuner._signals import stop_exit_code, stop_reason
from tuner.machine import AUTO_PROFILE, ProfileError
from tuner.search import SpaceError

__all__ = ["ArgumentParser", "HelpFormatter", "UsageError", "add_common", "run_cli"]

USAGE_ERRORS: tuple[type[Exception], ...] = (StorageError, ProfileError, WorkloadError, SpaceError)


class UsageError(ValueError):
    """A bad argument found after parsing; exit code 2."""


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """argparse's help with ``(default: X)`` after each flag that has a value by default.

    A default of None, False or an empty list is left out: the help says what the flag does
    when it is not given (a value computed from the machine, the environment or other flags).
    """

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default in (None, False, [], argparse.SUPPRESS) or isinstance(
            action, (argparse._StoreTrueAction, argparse._StoreFalseAction)
        ):
            return action.help
        return super()._get_help_string(action)


class ArgumentParser(argparse.ArgumentParser):
    """argparse, but an error is one line (no usage dump) and exit code 2; help shows defaults."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        raise SystemExit(2)


def add_common(parser: argparse.ArgumentParser, objective: bool = True) -> None:
    """--hardware, --objective, --storage, --study-name, --profiles, as every verb names them."""
    parser.add_argument(
        "--hardware",
        default=AUTO_PROFILE,
        help="a profile name from the catalog (dataloader-tuner profiles list), or 'auto': the "
        "catalog profile this machine matches, else its fingerprint (local-...); "
        "dataloader-tuner profiles detect shows which",
    )
    if objective:
        parser.add_argument(
            "--objective",
            default="image",
            help="image, text, storage, pkg.module:attr or file.py:attr "
            "(user code: it is imported and run)",
        )
    parser.add_argument(
        "--storage",
        default=None,
        help="database URL (default: $TUNER_STORAGE, else sqlite:///tuner.db)",
    )
    parser.add_argument(
        "--study-name", default=None, help="the study's name (default: <objective>@<hardware>)"
    )
    parser.add_argument(
        "--profiles", default=None, metavar="FILE.json", help="a JSON catalog of more profiles"
    )


def add_artifact_dir(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """--artifact-dir: the trials' artifact store, where the study writes it and readers look."""
    parser.add_argument(
        "--artifact-dir",
        default=None,
        help="the trials' artifact store (default: tuner-artifacts/ beside an SQLite file, "
        "else ./tuner-artifacts)",
    )


def storage_url(value: str | None) -> str:
    return value or default_storage_url()


class _Formatter(logging.Formatter):
    """A progress line as it is; a warning or error with the program's name in front."""

    def __init__(self, prog: str) -> None:
        super().__init__("%(message)s")
        self.prog = prog

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        return text if record.levelno < logging.WARNING else f"{self.prog}: {text}"


class _ProgressHandler(logging.Handler):
    """Writes each record to stderr above a running progress bar (``tqdm.write``)."""

    def emit(self, record: logging.LogRecord) -> None:
        from tqdm import tqdm

        try:
            tqdm.write(self.format(record), file=sys.stderr)
        except Exception:
            self.handleError(record)


def run_cli(
    prog: str, main: Callable[[Sequence[str] | None], int], argv: Sequence[str] | None = None
) -> NoReturn:
    """Run ``main`` and turn the known errors into one line on stderr and an exit code.

    ``prog`` names the program in error lines and warnings (``tuner.study`` under
    ``python -m``, ``dataloader-tuner study`` under the installed command).
    """
    from tuner.insight import NoResultError
    from tuner.run import ConfigError

    handler = _ProgressHandler()
    handler.setFormatter(_Formatter(prog))
    handler.addFilter(LostConnectionFilter())  # a server restart: one line, no traceback
    logging.basicConfig(level=logging.WARNING, handlers=[handler])
    logging.getLogger("tuner.run").setLevel(logging.INFO)  # a run's progress lines
    # A CLI's own choice: Optuna's per-trial INFO lines would drown the progress bar.
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        code = main(argv)
    except NoResultError as error:
        print(f"{prog}: {error}", file=sys.stderr)
        code = 1
    except (*USAGE_ERRORS, UsageError, ConfigError) as error:
        print(f"{prog}: error: {mask_password(str(error))}", file=sys.stderr)
        code = 2
    except KeyboardInterrupt as stop:  # Ctrl-C, or SIGTERM during a study (tuner._signals)
        print(f"{prog}: {stop_reason(stop)}", file=sys.stderr)
        code = stop_exit_code(stop)
    raise SystemExit(code)
