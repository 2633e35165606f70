"""Snapshots: one record per snapshot of a workspace, written before the provider writes its files.

Revision ID: 0002
Revises: 0001
Create Date: 2026-02-01

Workspaces gain the ``paused`` status too; ``status`` is a plain string column, so that needs no schema change.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | Sequence[str] | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Create the ``snapshots`` table and its indexes."""
    op.create_table(
        "snapshots",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("name", sa.String(length=255), nullable=True),
        sa.Column("workspace_id", sa.String(length=32), nullable=False),
        sa.Column("provider", sa.String(length=64), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("base_image", sa.String(length=512), nullable=False),
        sa.Column("container_type", sa.String(length=32), nullable=False),
        sa.Column("network", sa.String(length=16), nullable=False),
        sa.Column("resource_limits", sa.JSON(), nullable=False),
        sa.Column("metadata", sa.JSON(), nullable=False),
        sa.Column("setup_key", sa.String(length=64), nullable=True),
        sa.Column("error", sa.String(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_snapshots")),
    )
    op.create_index(op.f("ix_snapshots_workspace_id"), "snapshots", ["workspace_id"])
    op.create_index(op.f("ix_snapshots_setup_key"), "snapshots", ["setup_key"])


def downgrade() -> None:
    """Drop everything :func:`upgrade` created."""
    op.drop_index(op.f("ix_snapshots_setup_key"), table_name="snapshots")
    op.drop_index(op.f("ix_snapshots_workspace_id"), table_name="snapshots")
    op.drop_table("snapshots")
