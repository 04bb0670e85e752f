"""The tables gridtune 0.1 created with create_all: profiles and measurements.

Idempotent: a database that already has them (created before migrations existed) is only stamped.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade(table_prefix: str = "gridtune_") -> None:
    inspector = sa.inspect(op.get_bind())
    profiles, measurements = f"{table_prefix}profiles", f"{table_prefix}measurements"
    if not inspector.has_table(profiles):
        op.create_table(
            profiles,
            sa.Column("id", sa.String(64), primary_key=True),
            sa.Column("name", sa.String(200), nullable=False),
            sa.Column("profile", sa.JSON, nullable=False),
            sa.Column("cluster", sa.JSON(none_as_null=True), nullable=True),
            sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        )
        op.create_index(f"ix_{profiles}_name", profiles, ["name"])
    if not inspector.has_table(measurements):
        op.create_table(
            measurements,
            sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
            sa.Column("cluster_id", sa.String(200), nullable=True),
            sa.Column("model", sa.JSON, nullable=False),
            sa.Column("cluster", sa.JSON, nullable=False),
            sa.Column("training", sa.JSON, nullable=False),
            sa.Column("plan", sa.JSON, nullable=False),
            sa.Column("measured", sa.JSON, nullable=False),
            sa.Column("prediction", sa.JSON(none_as_null=True), nullable=True),
            sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        )
        op.create_index(f"ix_{measurements}_cluster_id", measurements, ["cluster_id"])


def downgrade(table_prefix: str = "gridtune_") -> None:
    op.drop_table(f"{table_prefix}measurements")
    op.drop_table(f"{table_prefix}profiles")
