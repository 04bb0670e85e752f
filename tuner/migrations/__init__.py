"""Alembic migrations of the store's schema (profiles, measurements).

Why: a stored database must survive upgrades of gridtune. `tuner.store.Store` runs
`upgrade head` itself when it opens a database and whenever it finds the tables missing (a
PostgreSQL database dropped and recreated under a running service), so no one has to run alembic
by hand. The table prefix (`Store(table_prefix=...)`) is passed to every migration, and each prefix
keeps its own version table (`<prefix>alembic_version`), so several stores can share one database.

To apply by hand: `gridtune db upgrade [--database-url URL]`. To add a migration, copy the newest
file in `versions/`, bump `revision`/`down_revision`, and write `upgrade(table_prefix)` with
`alembic.op`; migrations must be idempotent on databases created before alembic (gridtune <= 0.1
created the tables with `create_all`).
"""
