"""Episode data by reference (docs/design-episode-data.md): tasks stored once per run, messages as a chain.

Revision ID: 0003
Revises: 0002
"""
import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0003"
down_revision = "0002"


def upgrade() -> None:
    op.create_table(
        "tasks",
        sa.Column("run_id", sa.Text, primary_key=True),
        sa.Column("task_id", sa.Text, primary_key=True),
        sa.Column("env", sa.Text, nullable=False),
        sa.Column("body", JSONB, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
    )
    op.create_table(
        "messages",
        sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
        sa.Column("rollout_id", sa.Text, nullable=False),
        sa.Column("parent_id", sa.BigInteger, sa.ForeignKey("messages.id"), nullable=True),
        sa.Column("position", sa.Integer, nullable=False),
        sa.Column("producer", sa.Text, nullable=False),
        sa.Column("producer_index", sa.Integer, nullable=False),
        sa.Column("role", sa.Text, nullable=False),
        sa.Column("body", JSONB, nullable=False),
        sa.Column("state", JSONB, nullable=True),
        sa.Column("tokens", JSONB, nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        # One batch per producer (workflow run + activity): a retried or zombie attempt finds, not duplicates.
        sa.UniqueConstraint("rollout_id", "producer", "producer_index", name="messages_producer_key"),
    )
    op.create_index("messages_parent", "messages", ["parent_id"])


def downgrade() -> None:
    op.drop_table("messages")
    op.drop_table("tasks")
