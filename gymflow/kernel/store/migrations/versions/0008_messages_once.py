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
# One rollout's turns: the assistant messages of its chain, numbered from 0, or what it stored before 0008. A
# function of the row, so a join with `generations` walks the chains of the rollouts it joins, once each (a view
# with the numbering outside re-walked every chain per joined row).
ROLLOUT_GENERATIONS = """
CREATE FUNCTION rollout_generations(head bigint, rid text) RETURNS SETOF generations_before_0008
LANGUAGE sql STABLE AS $$
    SELECT rid, (row_number() OVER (ORDER BY c.position) - 1)::int,
           coalesce((c.tokens->>'attempt')::int, 1), coalesce(c.tokens->>'model', ''), c.tokens->>'finish_reason',
           coalesce((c.tokens->'usage'->>'prompt_tokens')::int, 0),
           coalesce((c.tokens->'usage'->>'completion_tokens')::int, 0),
           (c.tokens->>'latency_s')::float8, c.body, c.tokens->'prompt_token_ids', c.tokens->'generation_token_ids',
           c.tokens->'generation_log_probs', c.created_at, c.tokens->>'policy_version'
    FROM episode_chain(head) c WHERE head IS NOT NULL AND c.role = 'assistant' AND c.tokens IS NOT NULL
  UNION ALL
    SELECT g.* FROM generations_before_0008 g
    WHERE head IS NULL AND g.rollout_id = rid
      AND EXISTS (SELECT 1 FROM rollout_rows r WHERE r.id = rid AND r.transcript_before_0008 IS NOT NULL)
$$
"""

GENERATIONS = f"""
CREATE VIEW generations AS
SELECT r.id AS rollout_id, {", ".join(f"g.{c.strip()}" for c in _GENERATION_COLUMNS.split(",")[1:])}
FROM rollout_rows r CROSS JOIN LATERAL rollout_generations(r.head_id, r.id) g
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
    for sql in (EPISODE_CHAIN, ROLLOUT_TRANSCRIPT, ROLLOUTS, ROLLOUT_GENERATIONS, GENERATIONS):
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
    op.execute("DROP FUNCTION rollout_generations(bigint, text)")
    op.execute("DROP FUNCTION rollout_transcript(bigint, jsonb)")
    op.execute("DROP FUNCTION episode_chain(bigint)")
    op.execute("ALTER TABLE generations_before_0008 RENAME TO generations")
    op.execute("ALTER TABLE rollout_rows DROP COLUMN head_id")
    op.execute("ALTER TABLE rollout_rows ALTER COLUMN transcript_before_0008 SET DEFAULT '[]'::jsonb, "
               "ALTER COLUMN transcript_before_0008 SET NOT NULL")
    op.execute("ALTER TABLE rollout_rows RENAME COLUMN transcript_before_0008 TO transcript")
    op.execute("ALTER TABLE rollout_rows RENAME TO rollouts")
