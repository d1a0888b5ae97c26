"""The execution fence: which workflow execution (run) of a rollout owns its row, so a stale execution
(cancelled, restarted, reset, continued as new) can never overwrite what a newer one wrote (docs/architecture.md,
"Fenced persistence"). `finished_at` comes from the database's clock from here on. And `step_starts`: how often
a local step was started on a worker that had not run the step before it (after its worker died or hung), so a
poison step ends typed (`worker_lost`) instead of taking down worker after worker.

Revision ID: 0007
Revises: 0006
"""
import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0007"
down_revision = "0006"


def upgrade() -> None:
    op.add_column("rollouts", sa.Column("execution_id", sa.Text))
    op.add_column("rollouts", sa.Column("execution_started_at", sa.DateTime(timezone=True)))
    op.add_column("rollouts", sa.Column("superseded_executions", postgresql.ARRAY(sa.Text), nullable=False,
                                        server_default="{}"))
    op.create_table("step_starts", sa.Column("rollout_id", sa.Text, primary_key=True),
                    sa.Column("producer", sa.Text, primary_key=True),
                    sa.Column("starts", sa.Integer, nullable=False),
                    sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False))


def downgrade() -> None:
    op.drop_table("step_starts")
    for column in ("superseded_executions", "execution_started_at", "execution_id"):
        op.drop_column("rollouts", column)
