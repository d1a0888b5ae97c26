"""Human review: a reviewer's label on a rollout (the verifier right or wrong, the reward they would give, tags, a
comment), append-only beside the verifier's score, which it never changes. A reviewer's newest label of a rollout is
the one that counts; the older ones are kept.

Revision ID: 0010
Revises: 0009
"""
import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0010"
down_revision = "0009"


def upgrade() -> None:
    op.create_table(
        "reviews",
        sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
        sa.Column("rollout_id", sa.Text, sa.ForeignKey("rollout_rows.id", ondelete="CASCADE"), nullable=False),
        sa.Column("reviewer", sa.Text, nullable=False),
        sa.Column("verdict", sa.Text, nullable=False, comment="the verifier's score: right, wrong or unsure"),
        sa.Column("reward", sa.Float, comment="the reward the reviewer would give (optional)"),
        sa.Column("tags", postgresql.ARRAY(sa.Text), nullable=False, server_default="{}"),
        sa.Column("comment", sa.Text),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.CheckConstraint("verdict IN ('right', 'wrong', 'unsure')", name="reviews_verdict_check"),
    )
    op.create_index("reviews_rollout_idx", "reviews", ["rollout_id", "reviewer", "id"])


def downgrade() -> None:
    op.drop_index("reviews_rollout_idx", "reviews")
    op.drop_table("reviews")
