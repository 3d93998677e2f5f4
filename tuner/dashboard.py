"""``python -m tuner.dashboard``: optuna-dashboard on the tuner's storage, with its artifacts.

    python -m tuner.dashboard                      # sqlite:///tuner.db on 127.0.0.1:8080
    python -m tuner.dashboard --storage postgresql+psycopg://... --port 8081

It serves the same storage the studies write (``--storage``, else ``$TUNER_STORAGE``, else
``sqlite:///tuner.db``) with the same artifact store (``tuner-artifacts/`` beside an SQLite file,
or ``--artifact-dir``), so each trial's ``telemetry.csv`` and ``steps.csv`` open in its trial
view. It binds to 127.0.0.1 unless told otherwise: the dashboard can delete studies.

The dashboard's "best trial" is the tuner's best (the re-measured winner that ``tuner.best``,
``tuner.loader``, the note and the report name), not Optuna's highest single window: see
:class:`TunerBestStorage` (a gRPC proxy URL serves Optuna's own).
"""

from __future__ import annotations

import argparse
import socketserver
import sys
import wsgiref.simple_server
from collections.abc import Sequence

import optuna
from optuna.storages import RDBStorage
from optuna.trial import FrozenTrial

from storage import mask_url, open_artifact_store, open_storage, sqlite_file_missing
from tuner._cli import ArgumentParser, UsageError, add_artifact_dir, run_cli, storage_url
from tuner.insight import best_trial

__all__ = ["PROG", "TunerBestStorage", "main", "parser"]


class TunerBestStorage(RDBStorage):
    """An RDBStorage that names the tuner's best as a study's best trial.

    optuna-dashboard asks its storage for a study's best trial (``get_best_trial``), which
    Optuna answers with the highest single window. The tuner's best is the winner of fresh
    side-by-side rounds, and finished trials are immutable, so the re-measured medians cannot
    become trial values; this storage answers with the trial ``tuner.best`` names instead.
    Studies the tuner did not write get Optuna's answer, which ``best_trial`` falls back to.
    """

    def get_best_trial(self, study_id: int) -> FrozenTrial:
        name = self.get_study_name_from_id(study_id)
        best = best_trial(optuna.load_study(study_name=name, storage=self))
        if best is None:
            raise ValueError("No trials are completed yet.")
        return best


class _ThreadingServer(socketserver.ThreadingMixIn, wsgiref.simple_server.WSGIServer):
    """Concurrent requests, as the optuna-dashboard CLI serves them; threads die with us."""

    daemon_threads = True


class _QuietHandler(wsgiref.simple_server.WSGIRequestHandler):
    """No line per request: the dashboard polls every few seconds."""

    def log_message(self, format: str, *args: object) -> None:
        pass


PROG = "python -m tuner.dashboard"


def parser(prog: str = PROG) -> argparse.ArgumentParser:
    """The flags of ``dashboard``; ``prog`` names the command in usage and error lines."""
    p = ArgumentParser(
        prog=prog,
        description="Serve optuna-dashboard on the tuner's storage and artifact store.",
    )
    p.add_argument(
        "--storage",
        default=None,
        help="database URL (default: $TUNER_STORAGE, else sqlite:///tuner.db)",
    )
    p.add_argument(
        "--host", default="127.0.0.1", help="address to bind (the dashboard can delete studies)"
    )
    p.add_argument("--port", type=int, default=8080, help="port to listen on")
    add_artifact_dir(p)
    return p


def main(argv: Sequence[str] | None = None, prog: str = PROG) -> int:
    args = parser(prog).parse_args(argv)
    if not 0 < args.port < 65536:
        raise UsageError(f"--port must be 1..65535, got {args.port}")
    url = storage_url(args.storage)
    if sqlite_file_missing(url):
        from tuner.insight import NoResultError

        raise NoResultError(
            f"no database at {mask_url(url)}; create a study first: "
            "dataloader-tuner study --hardware auto"
        )
    storage = open_storage(url, heartbeat_interval=None, storage_class=TunerBestStorage)
    try:
        store = open_artifact_store(url, args.artifact_dir)
    except OSError as error:
        raise UsageError(f"--artifact-dir: {error.strerror or error}") from None

    from optuna_dashboard import wsgi

    app = wsgi(storage, artifact_store=store)
    try:
        # Bind before announcing, so a taken port is one line and exit code 2.
        server = wsgiref.simple_server.make_server(
            args.host, args.port, app, server_class=_ThreadingServer, handler_class=_QuietHandler
        )
    except OSError as error:
        raise UsageError(
            f"cannot listen on {args.host}:{args.port}: {error.strerror or error}"
        ) from None
    host, port = server.server_address[:2]
    print(
        f"optuna-dashboard for {mask_url(url)} on http://{host}:{port}/ (Ctrl-C to stop)",
        file=sys.stderr,
        flush=True,
    )
    try:
        server.serve_forever()
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    run_cli("tuner.dashboard", main)
