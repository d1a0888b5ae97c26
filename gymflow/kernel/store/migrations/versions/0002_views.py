"""SQL views for what users ask most: reward and pass@k per run, failures by type, latency.

Revision ID: 0002
Revises: 0001
"""
from alembic import op

revision = "0002"
down_revision = "0001"

RUN_SCORES = """
CREATE OR REPLACE VIEW run_scores AS
WITH per_task AS (
  SELECT run_id, env, model, task_id,
         count(*) FILTER (WHERE status = 'completed' AND NOT masked) AS scored,
         max(reward) FILTER (WHERE status = 'completed' AND NOT masked) AS best
  FROM rollouts GROUP BY run_id, env, model, task_id
)
SELECT r.run_id, r.env, r.model,
       count(*) AS rollouts,
       count(*) FILTER (WHERE r.status = 'completed') AS completed,
       count(*) FILTER (WHERE r.status = 'failed') AS failed,
       count(*) FILTER (WHERE r.status = 'running') AS running,
       count(*) FILTER (WHERE r.masked) AS masked,
       avg(r.reward) FILTER (WHERE r.status = 'completed' AND NOT r.masked) AS mean_reward,
       (SELECT avg(CASE WHEN p.best >= 1 THEN 1.0 ELSE 0.0 END) FROM per_task p
         WHERE p.run_id = r.run_id AND p.env = r.env AND p.model = r.model AND p.scored > 0) AS pass_at_k
FROM rollouts r GROUP BY r.run_id, r.env, r.model
"""

FAILURES = """
CREATE OR REPLACE VIEW failure_counts AS
SELECT run_id, env, model, coalesce(failure_type, 'none') AS failure_type, status, masked, count(*) AS n
FROM rollouts WHERE status = 'failed' OR masked GROUP BY 1, 2, 3, 4, 5, 6
"""

LATENCY = """
CREATE OR REPLACE VIEW latency_percentiles AS
SELECT run_id, env, model,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY latency_s) AS p50_s,
       percentile_cont(0.9) WITHIN GROUP (ORDER BY latency_s) AS p90_s,
       percentile_cont(0.99) WITHIN GROUP (ORDER BY latency_s) AS p99_s
FROM rollouts WHERE latency_s IS NOT NULL GROUP BY run_id, env, model
"""


def upgrade() -> None:
    for sql in (RUN_SCORES, FAILURES, LATENCY):
        op.execute(sql)


def downgrade() -> None:
    for view in ("latency_percentiles", "failure_counts", "run_scores"):
        op.execute(f"DROP VIEW IF EXISTS {view}")
