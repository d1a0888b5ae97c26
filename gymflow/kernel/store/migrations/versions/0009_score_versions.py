"""Score versions: `gymflow rescore` re-verifies a run's stored episodes and writes each new score beside the
collect's own (kept in rollout_rows), one version per rescore: which verifier (environment, its code's hash,
gymflow's version) and which options produced which reward.

Revision ID: 0009
Revises: 0008
"""
import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0009"
down_revision = "0008"


def upgrade() -> None:
    op.create_table(
        "score_versions",
        sa.Column("id", sa.Text, primary_key=True, comment="<run>@<name>; name defaults to v<ordinal>"),
        sa.Column("run_id", sa.Text, nullable=False),
        sa.Column("name", sa.Text, nullable=False),
        sa.Column("ordinal", sa.Integer, nullable=False, comment="1, 2, ... per run; 0 is the collect's own score"),
        sa.Column("verifiers", postgresql.JSONB, nullable=False, server_default=sa.text("'{}'::jsonb"),
                  comment="per environment: its code's hash and gymflow's version"),
        sa.Column("options", postgresql.JSONB, nullable=False, server_default=sa.text("'{}'::jsonb"),
                  comment="the environment options the verifiers ran with"),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True)),
        sa.UniqueConstraint("run_id", "ordinal", name="score_versions_run_ordinal_key"),
        sa.UniqueConstraint("run_id", "name", name="score_versions_run_name_key"),
    )
    op.create_table(
        "rescored",
        sa.Column("score_version", sa.Text, sa.ForeignKey("score_versions.id", ondelete="CASCADE"),
                  primary_key=True),
        sa.Column("rollout_id", sa.Text, primary_key=True),
        sa.Column("reward", sa.Float),
        sa.Column("masked", sa.Boolean, nullable=False),
        sa.Column("failure_type", sa.Text),
        sa.Column("failure_message", sa.Text),
        sa.Column("details", postgresql.JSONB, nullable=False, server_default=sa.text("'{}'::jsonb")),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
    )
    op.create_index("rescored_rollout_idx", "rescored", ["rollout_id"])


def downgrade() -> None:
    op.drop_index("rescored_rollout_idx", "rescored")
    op.drop_table("rescored")
    op.drop_table("score_versions")
