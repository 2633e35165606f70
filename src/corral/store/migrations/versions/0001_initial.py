"""Initial schema: workspaces, agent types, sessions and the tool-call audit log.

Revision ID: 0001
Revises:
Create Date: 2026-01-01

Timestamps are ``DateTime(timezone=True)`` here; the models wrap them in ``UTCDateTime``, which only changes how
values are converted in Python, not the column type.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _timestamp(name: str, *, nullable: bool = False) -> sa.Column[datetime]:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def upgrade() -> None:
    """Create the four tables and their indexes."""
    op.create_table(
        "agent_types",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("workspace_config", sa.JSON(), nullable=False),
        _timestamp("created_at"),
        _timestamp("updated_at"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_agent_types")),
        sa.UniqueConstraint("name", name=op.f("uq_agent_types_name")),
    )
    op.create_table(
        "audit_entries",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("session_id", sa.String(length=64), nullable=False),
        _timestamp("at"),
        sa.Column("tool", sa.String(length=64), nullable=False),
        sa.Column("arguments_summary", sa.String(), nullable=False),
        sa.Column("status", sa.String(length=32), nullable=False),
        sa.Column("duration_ms", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_audit_entries")),
    )
    op.create_index(op.f("ix_audit_entries_session_id"), "audit_entries", ["session_id"])
    op.create_table(
        "workspaces",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("provider", sa.String(length=64), nullable=True),
        sa.Column("requested_provider", sa.String(length=64), nullable=False),
        sa.Column("container_type", sa.String(length=32), nullable=False),
        sa.Column("resource_limits", sa.JSON(), nullable=False),
        sa.Column("network", sa.String(length=16), nullable=False),
        sa.Column("base_image", sa.String(length=512), nullable=False),
        sa.Column("metadata", sa.JSON(), nullable=False),
        sa.Column("warnings", sa.JSON(), nullable=False),
        sa.Column("from_warm_pool", sa.Boolean(), nullable=False),
        sa.Column("provider_attempts", sa.JSON(), nullable=False),
        sa.Column("pool_key", sa.String(length=255), nullable=True),
        sa.Column("error", sa.String(), nullable=True),
        _timestamp("created_at"),
        _timestamp("updated_at"),
        _timestamp("last_used_at", nullable=True),
        _timestamp("destroyed_at", nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_workspaces")),
    )
    op.create_index("ix_workspaces_status", "workspaces", ["status"])
    op.create_index("ix_workspaces_pool_key", "workspaces", ["pool_key"])
    op.create_table(
        "sessions",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("agent_type_id", sa.String(length=64), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("degraded", sa.Boolean(), nullable=False),
        sa.Column("degraded_reason", sa.String(), nullable=True),
        sa.Column("workspace_id", sa.String(length=32), nullable=True),
        sa.Column("task_context", sa.JSON(), nullable=False),
        sa.Column("workspace_config", sa.JSON(), nullable=False),
        sa.Column("warnings", sa.JSON(), nullable=False),
        _timestamp("created_at"),
        _timestamp("updated_at"),
        _timestamp("ended_at", nullable=True),
        sa.ForeignKeyConstraint(
            ["agent_type_id"], ["agent_types.id"], name=op.f("fk_sessions_agent_type_id_agent_types")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_sessions")),
    )
    op.create_index(op.f("ix_sessions_agent_type_id"), "sessions", ["agent_type_id"])


def downgrade() -> None:
    """Drop everything :func:`upgrade` created."""
    op.drop_index(op.f("ix_sessions_agent_type_id"), table_name="sessions")
    op.drop_table("sessions")
    op.drop_index("ix_workspaces_pool_key", table_name="workspaces")
    op.drop_index("ix_workspaces_status", table_name="workspaces")
    op.drop_table("workspaces")
    op.drop_index(op.f("ix_audit_entries_session_id"), table_name="audit_entries")
    op.drop_table("audit_entries")
    op.drop_table("agent_types")
