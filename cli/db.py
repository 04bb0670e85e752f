"""`gridtune db upgrade`: bring a store's schema to the newest migration (alembic), then say where it is.

    gridtune db upgrade [--database-url URL]     # default: $GRIDTUNE_DATABASE_URL, else the SQLite file

`gridtune serve` does the same at start-up, and the store repairs missing tables by itself; this is
for upgrading ahead of a deployment or checking a database by hand.
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator


def register(sub: argparse._SubParsersAction) -> None:
    from cli.formatter import HelpFormatter

    p = sub.add_parser("db", help="database schema: upgrade to the newest migration", description=__doc__,
                       formatter_class=HelpFormatter)
    p.add_argument("action", choices=("upgrade", "status"))
    p.add_argument("--database-url", default=None, help="SQLAlchemy URL (default: $GRIDTUNE_DATABASE_URL)")
    p.add_argument("--table-prefix", default="gridtune_", help="prefix of the store's tables")
    p.set_defaults(handler=run)


def shown_url(url: str) -> str:
    """The URL as it may be printed: the password hidden where SQLAlchemy can parse it."""
    try:
        from sqlalchemy.engine import make_url

        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        return repr(url)


@contextlib.contextmanager
def database_errors(url: str | None, flag: str = "--database-url") -> Iterator[None]:
    """Turns what opening a database raises for a bad URL (unparseable, unknown dialect, missing
    driver, refused connection, bad credentials, unwritable file) into one ValueError line naming the
    URL (password hidden), which the CLI prints without a traceback."""
    from sqlalchemy import exc as sa_exc

    from tuner.store import default_database_url

    shown = shown_url(url or default_database_url())
    where = f"{flag} {shown}" if url else f"the database {shown} ({flag} or $GRIDTUNE_DATABASE_URL)"
    try:
        yield
    except sa_exc.NoSuchModuleError as exc:
        raise ValueError(f"{where}: unknown database kind ({exc}); use e.g. sqlite:///file.db or "
                         "postgresql+psycopg://user@host/db") from None
    except sa_exc.ArgumentError as exc:
        raise ValueError(f"{where}: not a database URL ({exc}); e.g. sqlite:///file.db or "
                         "postgresql+psycopg://user@host/db") from None
    except ModuleNotFoundError as exc:
        raise ValueError(f"{where}: its driver is not installed ({exc})") from None
    except sa_exc.DBAPIError as exc:
        text = str(exc.orig or exc).strip()
        first = text.splitlines()[0] if text else type(exc).__name__
        raise ValueError(f"{where}: cannot open it: {first}") from None
    except OSError as exc:
        raise ValueError(f"{where}: cannot open it: {exc}") from None


def run(args: argparse.Namespace) -> int:
    from tuner.store import Store

    with database_errors(args.database_url):
        store = Store(args.database_url, table_prefix=args.table_prefix, create=args.action == "upgrade")
    try:
        with database_errors(args.database_url):
            current, head = store.schema_revision(), store.head_revision()
        print(f"{store.engine.url.render_as_string(hide_password=True)}: schema {current or 'none'} "
              f"(newest {head}){'' if current == head else ' - run `gridtune db upgrade`'}")
        return 0 if current == head else 1
    finally:
        store.close()
