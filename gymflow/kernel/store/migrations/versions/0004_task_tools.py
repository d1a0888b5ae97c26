"""The tool schemas of a task, stored by the episode's `begin` (env pool), so the generate pool needs no
environment code to offer them to the model.

Revision ID: 0004
Revises: 0003
"""
import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0004"
down_revision = "0003"


def upgrade() -> None:
    op.add_column("tasks", sa.Column("tools", JSONB, nullable=True))


def downgrade() -> None:
    op.drop_column("tasks", "tools")
