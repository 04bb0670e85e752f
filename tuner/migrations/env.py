"""Alembic environment: runs on the connection and table prefix that `tuner.store.Store.migrate`
hands over."""

from __future__ import annotations

from alembic import context


def run() -> None:
    config = context.config
    connection = config.attributes["connection"]
    prefix = config.attributes["table_prefix"]
    context.configure(connection=connection, version_table=f"{prefix}alembic_version",
                      transaction_per_migration=True)
    with context.begin_transaction():
        context.run_migrations(table_prefix=prefix)


try:
    context.config  # noqa: B018 - set only while alembic runs this file
except AttributeError:  # imported as a plain module (a walk over the package): nothing to run
    pass
else:
    run()
