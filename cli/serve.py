"""`gridtune serve`: the REST service (api.create_app) under uvicorn, with limits for hostile clients.

    gridtune serve                                  # 127.0.0.1:8000, SQLite in ~/.local/share/gridtune
    gridtune serve --host 0.0.0.0 --port 8080 --database-url postgresql+psycopg://user@db/gridtune
    GRIDTUNE_API_KEY=secret gridtune serve          # writes then need "Authorization: Bearer secret"

Limits (see api/server.py): a connection that sends no byte within `--idle-timeout` seconds is
closed; a request's headers and body must arrive within `--request-timeout` seconds of its first
byte (else 408 and the connection closes); at most `--limit-concurrency` requests are served at once
(more get 503; /livez, /readyz, /healthz always answer); at most `--max-connections` are open (the
oldest idle one is closed for a newcomer; the open-file limit is raised and respected); idle
keep-alive connections close after `--timeout-keep-alive` seconds.

`--workers N` starts N processes (SQLite in WAL mode and PostgreSQL both take concurrent writers);
/metrics then reports per worker. The database schema is migrated (alembic) at start-up; `gridtune
db upgrade` does it alone. uvicorn and FastAPI are imported inside the handler so the other
subcommands start fast.
"""

from __future__ import annotations

import argparse
import os


def register(subparsers: argparse._SubParsersAction) -> None:
    from cli.formatter import HelpFormatter

    parser = subparsers.add_parser(
        "serve",
        help="run the REST service (predict, recommend, clusters, measurements)",
        description=__doc__,
        formatter_class=HelpFormatter,
    )
    parser.add_argument("--host", default="127.0.0.1", help="interface to listen on (default: %(default)s)")
    parser.add_argument(
        "--port", type=int, default=8000, help="TCP port (default: %(default)s; 0 picks a free one)"
    )
    parser.add_argument(
        "--database-url",
        default=None,
        help="SQLAlchemy URL of the store (default: $GRIDTUNE_DATABASE_URL, else a SQLite file "
        "in ~/.local/share/gridtune/)",
    )
    parser.add_argument("--workers", type=int, default=1, help="server processes (default: %(default)s)")
    parser.add_argument(
        "--log-level",
        default="info",
        choices=("critical", "error", "warning", "info", "debug"),
        help="default: %(default)s",
    )
    parser.add_argument("--request-timeout", type=float, default=30.0, metavar="S",
                        help="seconds a request may take to arrive, from its 1st byte (default: %(default)s)")
    parser.add_argument("--limit-concurrency", type=int, default=1024, metavar="N",
                        help="requests served at once; more get 503, not probes (default: %(default)s)")
    parser.add_argument("--idle-timeout", type=float, default=5.0, metavar="S",
                        help="a connection that sends no byte of a request within S seconds is closed "
                             "(default: %(default)s)")
    parser.add_argument("--max-connections", type=int, default=4096, metavar="N",
                        help="open connections; beyond it the oldest idle one closes (default: %(default)s)")
    parser.add_argument("--timeout-keep-alive", type=float, default=5.0, metavar="S",
                        help="idle keep-alive connections close after S seconds (default: %(default)s)")
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

    from api.server import ServerLimits, uvicorn_config
    from api.settings import Settings
    from cli.db import database_errors

    settings = Settings.from_env()  # fail here, with one line, on a bad setting
    try:
        limits = ServerLimits(
            request_timeout_s=args.request_timeout,
            limit_concurrency=args.limit_concurrency,
            timeout_keep_alive_s=args.timeout_keep_alive,
            idle_timeout_s=args.idle_timeout,
            max_connections=args.max_connections,
        )
    except ValueError as exc:
        raise ValueError(f"serve: {exc}") from None
    if args.workers == 1:
        from api import create_app

        with database_errors(args.database_url):  # a bad URL is one line, not a traceback
            app: object = create_app(settings)
    else:
        from tuner.store import Store

        with database_errors(args.database_url):  # each worker opens it again; check it once here
            Store(settings.database_url, table_prefix=settings.table_prefix).close()
        app = "api.app:create_app"
    config = uvicorn_config(
        app, host=args.host, port=args.port, workers=args.workers, log_level=args.log_level, limits=limits
    )
    server = uvicorn.Server(config)
    if args.workers == 1:
        server.run()
        return 0 if server.started else 1
    from uvicorn.supervisors import Multiprocess

    sock = config.bind_socket()
    Multiprocess(config, sockets=[sock]).run()
    return 0
