"""Policy versions: the trainer says which policy is current per model; the latest row (highest ordinal) is
current. Generation records the version (and its ordinal) that produced each turn, so the trainer iterator can
bound staleness (gymflow/training/policy.py, docs/training.md).

Revision ID: 0006
Revises: 0005
"""
import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"


def upgrade() -> None:
    op.create_table(
        "policy_versions",
        sa.Column("model", sa.Text, primary_key=True),
        sa.Column("ordinal", sa.Integer, primary_key=True),
        sa.Column("version", sa.Text, nullable=False),
        sa.Column("set_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
    )
    # The version -> ordinal look-up for a turn whose model server reported its own version.
    op.create_index("policy_versions_model_version", "policy_versions", ["model", "version"])


def downgrade() -> None:
    op.drop_index("policy_versions_model_version", table_name="policy_versions")
    op.drop_table("policy_versions")
