"""`gridtune serve`: the REST service (api.create_app) under uvicorn.

    gridtune serve                                  # 127.0.0.1:8000, SQLite in ~/.local/share/gridtune
    gridtune serve --host 0.0.0.0 --port 8080 --database-url postgresql+psycopg://user@db/gridtune
    GRIDTUNE_API_KEY=secret gridtune serve          # writes then need "Authorization: Bearer secret"

`--workers N` starts N processes (SQLite in WAL mode and PostgreSQL both take concurrent writers);
/metrics then reports per worker. uvicorn and FastAPI are imported inside the handler so the
other subcommands start fast.
"""

from __future__ import annotations

import argparse
import os


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="run the REST service (predict, recommend, clusters, measurements)",
        description="Run the gridtune REST service with uvicorn. API docs at http://HOST:PORT/docs.",
    )
    parser.add_argument("--host", default="127.0.0.1", help="interface to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="TCP port (default 8000; 0 picks a free one)")
    parser.add_argument(
        "--database-url",
        default=None,
        help="SQLAlchemy URL of the store (default: $GRIDTUNE_DATABASE_URL, else a SQLite file "
        "in ~/.local/share/gridtune/)",
    )
    parser.add_argument("--workers", type=int, default=1, help="server processes (default 1)")
    parser.add_argument("--log-level", default="info", choices=("critical", "error", "warning", "info", "debug"))
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    if not 0 <= args.port <= 65535:
        raise ValueError(f"--port must be in 0..65535, got {args.port}")
    if args.workers < 1:
        raise ValueError(f"--workers must be at least 1, got {args.workers}")
    if args.database_url:
        # through the environment, so every worker process (and create_app's Settings) sees it
        os.environ["GRIDTUNE_DATABASE_URL"] = args.database_url

    import uvicorn

    from api.settings import Settings

    settings = Settings.from_env()  # fail here, with one line, on a bad setting
    if args.workers == 1:
        from api import create_app

        app = create_app(settings)
        uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level, access_log=False)
    else:
        uvicorn.run(
            "api.app:create_app",
            factory=True,
            host=args.host,
            port=args.port,
            workers=args.workers,
            log_level=args.log_level,
            access_log=False,
        )
    return 0
