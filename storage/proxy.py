"""``python -m storage.proxy``: Optuna's gRPC storage proxy, for fleets of hundreds of workers.

Hundreds of workers each holding database connections exhaust a PostgreSQL server; the proxy
holds one storage and the workers talk gRPC to it (``--storage grpc://HOST:PORT``).

Limits, from Optuna's design: no heartbeats pass through the proxy, so a worker killed
mid-trial leaves its trial RUNNING (run ``python -m tuner.study`` against the database URL now
and then, or fail them with ``optuna.storages.fail_stale_trials``); and the cross-process lock
that makes baselines and ``--total-trials`` exact is not available through it, so start the
first worker against the database URL to create the study.

    python -m storage.proxy --storage postgresql+psycopg://tuner@db/tuner --port 13000
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from storage._open import open_storage
from storage._urls import StorageError, default_storage_url, mask_url

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m storage.proxy", description="Serve a storage over gRPC."
    )
    parser.add_argument(
        "--storage",
        default=None,
        help="database URL (default: $TUNER_STORAGE, else sqlite:///tuner.db)",
    )
    parser.add_argument(
        "--host", default="127.0.0.1", help="bind address (default 127.0.0.1; 0.0.0.0 exposes it)"
    )
    parser.add_argument("--port", type=int, default=13000)
    args = parser.parse_args(argv)
    url = args.storage or default_storage_url()
    try:
        from optuna.storages import run_grpc_proxy_server

        storage = open_storage(url, heartbeat_interval=None)
    except ImportError:
        print(
            "storage.proxy: error: needs grpcio: pip install 'dataloader-tuner[grpc]'",
            file=sys.stderr,
        )
        return 2
    except StorageError as error:
        print(f"storage.proxy: error: {error}", file=sys.stderr)
        return 2
    print(f"serving {mask_url(url)} on grpc://{args.host}:{args.port}", file=sys.stderr, flush=True)
    try:
        run_grpc_proxy_server(storage, host=args.host, port=args.port)
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
