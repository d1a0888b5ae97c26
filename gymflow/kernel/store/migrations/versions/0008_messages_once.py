"""Each message stored once: a rollout's transcript and `generations` are read from its accepted chain.

Until 0007 `finish` copied the chain into `rollouts.transcript` and the `generations` table (assistant text three
times, token ids twice). From here the table `rollout_rows` keeps a rollout's row with `head_id`, the last
message of its accepted chain, and the names users query are derived from the chain:
- `rollouts`: a view of `rollout_rows` whose `transcript` is the chain's messages (a column a query does not
  name is not computed);
- `generations`: a view with one row per assistant turn of the chain (token ids, logprobs, policy version).
Rows written before 0008 keep what they stored (`transcript_before_0008`, `generations_before_0008`) until their
rollout is written again; nothing is lost.

Revision ID: 0008
Revises: 0007
"""
from alembic import op

revision = "0008"
down_revision = "0007"

EPISODE_CHAIN = """
CREATE FUNCTION episode_chain(head bigint) RETURNS SETOF messages LANGUAGE sql STABLE AS $$
    WITH RECURSIVE chain AS (
        SELECT * FROM messages WHERE id = head
      UNION ALL
        SELECT m.* FROM messages m JOIN chain c ON m.id = c.parent_id
    )
    SELECT * FROM chain ORDER BY position
$$
"""

ROLLOUT_TRANSCRIPT = """
CREATE FUNCTION rollout_transcript(head bigint, before_0008 jsonb) RETURNS jsonb LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN head IS NULL THEN coalesce(before_0008, '[]'::jsonb)
           ELSE (SELECT coalesce(jsonb_agg(c.body ORDER BY c.position), '[]'::jsonb) FROM episode_chain(head) c)
           END
$$
"""

ROLLOUTS = """
CREATE VIEW rollouts AS
SELECT id, run_id, task_id, sample_index, env, model, status, reward, masked, failure_type, failure_message,
       turns, tool_calls, prompt_tokens, completion_tokens, attempts, latency_s,
       rollout_transcript(head_id, transcript_before_0008) AS transcript,
       score_details, started_at, finished_at, execution_id, execution_started_at, superseded_executions, head_id
FROM rollout_rows
"""

_GENERATION_COLUMNS = ("rollout_id, turn, attempt, model, finish_reason, prompt_tokens, completion_tokens, latency_s, "
                       "message, prompt_token_ids, generation_token_ids, generation_log_probs, policy_version, "
                       "created_at")
GENERATIONS = f"""
CREATE VIEW generations AS
SELECT r.id AS rollout_id,
       (row_number() OVER (PARTITION BY r.id ORDER BY c.position) - 1)::int AS turn,
       coalesce((c.tokens->>'attempt')::int, 1) AS attempt,
       coalesce(c.tokens->>'model', '') AS model,
       c.tokens->>'finish_reason' AS finish_reason,
       coalesce((c.tokens->'usage'->>'prompt_tokens')::int, 0) AS prompt_tokens,
       coalesce((c.tokens->'usage'->>'completion_tokens')::int, 0) AS completion_tokens,
       (c.tokens->>'latency_s')::float8 AS latency_s,
       c.body AS message,
       c.tokens->'prompt_token_ids' AS prompt_token_ids,
       c.tokens->'generation_token_ids' AS generation_token_ids,
       c.tokens->'generation_log_probs' AS generation_log_probs,
       c.tokens->>'policy_version' AS policy_version,
       c.created_at
FROM rollout_rows r CROSS JOIN LATERAL episode_chain(r.head_id) c
WHERE r.head_id IS NOT NULL AND c.role = 'assistant' AND c.tokens IS NOT NULL
UNION ALL
SELECT {", ".join(f"g.{c.strip()}" for c in _GENERATION_COLUMNS.split(","))}
FROM generations_before_0008 g JOIN rollout_rows r ON r.id = g.rollout_id
WHERE r.head_id IS NULL AND r.transcript_before_0008 IS NOT NULL
"""

# The 0002 views (run_scores, ...) follow the table through the rename: they read `rollout_rows`, which has every
# column they use.


def upgrade() -> None:
    op.execute("ALTER TABLE rollouts RENAME TO rollout_rows")
    op.execute("ALTER TABLE rollout_rows RENAME COLUMN transcript TO transcript_before_0008")
    op.execute("ALTER TABLE rollout_rows ALTER COLUMN transcript_before_0008 DROP NOT NULL, "
               "ALTER COLUMN transcript_before_0008 DROP DEFAULT")
    op.execute("ALTER TABLE rollout_rows ADD COLUMN head_id bigint")
    op.execute("COMMENT ON COLUMN rollout_rows.head_id IS 'last message of the accepted chain (messages.id)'")
    op.execute("ALTER TABLE generations RENAME TO generations_before_0008")
    for sql in (EPISODE_CHAIN, ROLLOUT_TRANSCRIPT, ROLLOUTS, GENERATIONS):
        op.execute(sql)


def downgrade() -> None:
    # Materialise what the views derive for rows written since 0008, then put the tables back.
    op.execute("DELETE FROM generations_before_0008 WHERE rollout_id IN "
               "(SELECT id FROM rollout_rows WHERE head_id IS NOT NULL)")
    op.execute(f"""
        INSERT INTO generations_before_0008 ({_GENERATION_COLUMNS})
        SELECT {_GENERATION_COLUMNS} FROM generations
        WHERE rollout_id IN (SELECT id FROM rollout_rows WHERE head_id IS NOT NULL)""")
    op.execute("UPDATE rollout_rows SET transcript_before_0008 = rollout_transcript(head_id, transcript_before_0008)")
    op.execute("DROP VIEW generations")
    op.execute("DROP VIEW rollouts")
    op.execute("DROP FUNCTION rollout_transcript(bigint, jsonb)")
    op.execute("DROP FUNCTION episode_chain(bigint)")
    op.execute("ALTER TABLE generations_before_0008 RENAME TO generations")
    op.execute("ALTER TABLE rollout_rows DROP COLUMN head_id")
    op.execute("ALTER TABLE rollout_rows ALTER COLUMN transcript_before_0008 SET DEFAULT '[]'::jsonb, "
               "ALTER COLUMN transcript_before_0008 SET NOT NULL")
    op.execute("ALTER TABLE rollout_rows RENAME COLUMN transcript_before_0008 TO transcript")
    op.execute("ALTER TABLE rollout_rows RENAME TO rollouts")
