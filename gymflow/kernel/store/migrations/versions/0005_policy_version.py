"""The policy version (checkpoint, weights step) that generated each turn, so a training record can say
which policy produced which tokens. Nullable: servers and older rows do not report one.

Revision ID: 0005
Revises: 0004
"""
import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"


def upgrade() -> None:
    op.add_column("generations", sa.Column("policy_version", sa.Text, nullable=True))


def downgrade() -> None:
    op.drop_column("generations", "policy_version")
