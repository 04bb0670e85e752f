"""`gridtune db upgrade`: bring a store's schema to the newest migration (alembic), then say where it is.

    gridtune db upgrade [--database-url URL]     # default: $GRIDTUNE_DATABASE_URL, else the SQLite file

`gridtune serve` does the same at start-up, and the store repairs missing tables by itself; this is
for upgrading ahead of a deployment or checking a database by hand.
"""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    from cli.common import HelpFormatter

    p = sub.add_parser("db", help="database schema: upgrade to the newest migration", description=__doc__,
                       formatter_class=HelpFormatter)
    p.add_argument("action", choices=("upgrade", "status"))
    p.add_argument("--database-url", default=None, help="SQLAlchemy URL (default: $GRIDTUNE_DATABASE_URL)")
    p.add_argument("--table-prefix", default="gridtune_", help="prefix of the store's tables")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from tuner.store import Store

    store = Store(args.database_url, table_prefix=args.table_prefix, create=args.action == "upgrade")
    try:
        current, head = store.schema_revision(), store.head_revision()
        print(f"{store.engine.url.render_as_string(hide_password=True)}: schema {current or 'none'} "
              f"(newest {head}){'' if current == head else ' - run `gridtune db upgrade`'}")
        return 0 if current == head else 1
    finally:
        store.close()
