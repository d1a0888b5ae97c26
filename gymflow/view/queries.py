"""The view's SQL. Every query reads `rollout_rows` (not the `rollouts` view) unless it needs a transcript, walks
message chains by id only, and fetches message text cut to a bound in SQL: a page never pulls a 10 MB message or a
turn's token ids unless that is what was asked for."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession

from gymflow.view.filters import TableQuery

Row = dict[str, Any]
CUT = 20_000  # characters of a message field shown inline; the rest behind a link

# Per run: counts by status, mean reward and solved-task share as run_scores counts them (completed, unmasked),
# times, and the policy versions current while it ran (policy_versions of its models: the one current at its
# start and every one declared until its end); reading each turn's stamp would detoast every token list.
_RUNS = """
WITH g AS (  -- hashed by (run, env, model) first: array_agg(DISTINCT) over every row would sort them all
  SELECT run_id, env, model, count(*) AS rollouts,
         count(*) FILTER (WHERE status = 'completed') AS completed, count(*) FILTER (WHERE status = 'failed') AS failed,
         count(*) FILTER (WHERE status = 'running') AS running, count(*) FILTER (WHERE masked) AS masked,
         sum(reward) FILTER (WHERE status = 'completed' AND NOT masked) AS reward_sum,
         count(reward) FILTER (WHERE status = 'completed' AND NOT masked) AS scored,
         min(started_at) AS started_at, max(finished_at) AS finished_at
  FROM rollout_rows {where} GROUP BY run_id, env, model
), s AS (
  SELECT run_id, array_agg(DISTINCT env) AS envs, array_agg(DISTINCT model) AS models, sum(rollouts) AS rollouts,
         sum(completed) AS completed, sum(failed) AS failed, sum(running) AS running, sum(masked) AS masked,
         sum(reward_sum) / nullif(sum(scored), 0) AS mean_reward, min(started_at) AS started_at,
         max(finished_at) AS finished_at
  FROM g GROUP BY run_id
), t AS (
  SELECT run_id, max(reward) AS best FROM rollout_rows {where_t}
  GROUP BY run_id, task_id HAVING count(*) FILTER (WHERE status = 'completed' AND NOT masked) > 0
), p AS (
  SELECT run_id, avg(CASE WHEN best >= 1 THEN 1.0 ELSE 0.0 END) AS pass_at_k, count(*) AS scored_tasks
  FROM t GROUP BY run_id
)
SELECT s.*, p.pass_at_k, coalesce(p.scored_tasks, 0) AS scored_tasks,
       ARRAY(SELECT pv.version FROM policy_versions pv
             WHERE pv.model = ANY(s.models) AND pv.set_at <= coalesce(s.finished_at, now())
               AND pv.ordinal >= coalesce((SELECT max(c.ordinal) FROM policy_versions c
                                           WHERE c.model = pv.model AND c.set_at <= s.started_at), 1)
             ORDER BY pv.model, pv.ordinal) AS policy_versions
FROM s LEFT JOIN p USING (run_id)
ORDER BY s.started_at DESC, s.run_id LIMIT :limit
"""
RUNS = sa.text(_RUNS.format(where="", where_t="WHERE status = 'completed' AND NOT masked"))
ONE_RUN = sa.text(_RUNS.format(where="WHERE run_id = :run",
                               where_t="WHERE run_id = :run AND status = 'completed' AND NOT masked"))

FAILURE_TYPES = sa.text("""
SELECT coalesce(failure_type, 'none') AS failure_type, count(*) AS n,
       count(*) FILTER (WHERE status = 'failed') AS failed, count(*) FILTER (WHERE masked) AS masked
FROM rollout_rows WHERE run_id = :run AND (status = 'failed' OR masked) GROUP BY 1 ORDER BY 2 DESC, 1
""")

LATENCY = sa.text("""
SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY latency_s) AS p50,
       percentile_cont(0.9) WITHIN GROUP (ORDER BY latency_s) AS p90,
       percentile_cont(0.99) WITHIN GROUP (ORDER BY latency_s) AS p99
FROM rollout_rows WHERE run_id = :run AND latency_s IS NOT NULL
""")

# What changes when a run moves on; cached plots and checks are keyed on it.
FINGERPRINT = sa.text("SELECT count(*), count(*) FILTER (WHERE status = 'running'), max(finished_at), "
                      "max(started_at) FROM rollout_rows WHERE run_id = :run")

_TABLE_COLUMNS = ("r.id, r.task_id, r.sample_index, r.status, r.reward, r.masked, r.failure_type, r.failure_message, "
                  "r.turns, r.latency_s, r.started_at")

PAGE_POLICIES = sa.text("""
SELECT rollout_id, array_agg(DISTINCT tokens->>'policy_version' ORDER BY tokens->>'policy_version') AS versions
FROM messages WHERE rollout_id = ANY(:ids) AND role = 'assistant' AND tokens->>'policy_version' IS NOT NULL
GROUP BY rollout_id
""")

ROLLOUT = sa.text("""
SELECT id, run_id, task_id, sample_index, env, model, status, reward, masked, failure_type, failure_message, turns,
       tool_calls, prompt_tokens, completion_tokens, attempts, latency_s, score_details, started_at, finished_at,
       head_id, transcript_before_0008 IS NOT NULL AS stored_before_0008
FROM rollout_rows WHERE id = :rid
""")

# A running rollout's newest stored message is its head (as reports.live_episode reads it).
LIVE_HEAD = sa.text("SELECT max(id) FROM messages WHERE rollout_id = :rid")

# The chain by id: no body is read, so a 200-turn episode of large messages costs a few index lookups per message.
CHAIN = sa.text("""
WITH RECURSIVE walk AS (
  SELECT id, parent_id, position, role, tokens IS NOT NULL AS generated FROM messages WHERE id = :head
  UNION ALL
  SELECT m.id, m.parent_id, m.position, m.role, m.tokens IS NOT NULL FROM messages m JOIN walk w ON m.id = w.parent_id
)
SELECT id, position, role, generated FROM walk ORDER BY position
""")

# One page of messages: text fields cut at :cut characters with their full length, the rest of the body, and the
# token metadata without the id and logprob lists (only their lengths).
MESSAGES = sa.text("""
SELECT m.id, m.position, m.role, m.body - 'content' - 'reasoning_content' AS rest,
       left(shown.text, :cut) AS content, length(shown.text) AS content_len,
       jsonb_typeof(m.body->'content') AS content_type,
       left(m.body->>'reasoning_content', :cut) AS reasoning, length(m.body->>'reasoning_content') AS reasoning_len,
       m.tokens - 'prompt_token_ids' - 'generation_token_ids' - 'generation_log_probs' AS meta,
       jsonb_array_length(CASE WHEN jsonb_typeof(m.tokens->'prompt_token_ids') = 'array'
                               THEN m.tokens->'prompt_token_ids' END) AS prompt_ids_n,
       jsonb_array_length(CASE WHEN jsonb_typeof(m.tokens->'generation_token_ids') = 'array'
                               THEN m.tokens->'generation_token_ids' END) AS generation_ids_n,
       jsonb_array_length(CASE WHEN jsonb_typeof(m.tokens->'generation_log_probs') = 'array'
                               THEN m.tokens->'generation_log_probs' END) AS logprobs_n
FROM messages m
-- A list of content parts reads as its text, an image as a one-line placeholder (not kilobytes of base64), as
-- gymflow/view/conversation.py `as_text` shows one.
CROSS JOIN LATERAL (SELECT CASE
    WHEN jsonb_typeof(m.body->'content') = 'string' THEN m.body->>'content'
    WHEN jsonb_typeof(m.body->'content') = 'array' THEN (
        SELECT string_agg(CASE
            WHEN jsonb_typeof(p) = 'object' AND p->>'type' = 'text' AND jsonb_typeof(p->'text') = 'string'
                THEN p->>'text'
            WHEN jsonb_typeof(p) = 'object' AND p->>'type' = 'image_url'
                THEN '[image: ' || coalesce(substring(p->'image_url'->>'url' from '^data:([a-z/+.-]{1,40});'),
                                            'not a data URL') ||
                     ', ' || coalesce(length(p->'image_url'->>'url'), 0) || ' characters]'
            ELSE p::text END, E'\n' ORDER BY ord)
        FROM jsonb_array_elements(m.body->'content') WITH ORDINALITY AS parts(p, ord))
    ELSE (m.body->'content')::text END AS text) AS shown
WHERE m.id = ANY(:ids) ORDER BY m.position
""")

MESSAGE_FIELD = sa.text("SELECT CASE WHEN jsonb_typeof(body->:field) = 'string' THEN body->>:field "
                        "ELSE jsonb_pretty(body->:field) END FROM messages WHERE id = :mid AND rollout_id = :rid")
MESSAGE_TOKENS = sa.text("SELECT tokens FROM messages WHERE id = :mid AND rollout_id = :rid")
# Rows stored before migration 0008 keep their own transcript and generations.
OLD_TRANSCRIPT = sa.text("SELECT transcript_before_0008 FROM rollout_rows WHERE id = :rid")
OLD_TOKENS = sa.text("SELECT prompt_token_ids, generation_token_ids, generation_log_probs, finish_reason, "
                     "prompt_tokens, completion_tokens, latency_s, policy_version, model, attempt "
                     "FROM generations WHERE rollout_id = :rid AND turn = :turn")
OLD_TURNS = sa.text("SELECT turn, finish_reason, prompt_tokens, completion_tokens, latency_s, policy_version, "
                    "jsonb_array_length(generation_token_ids) AS generation_ids_n FROM generations "
                    "WHERE rollout_id = :rid ORDER BY turn")


async def _rows(session: AsyncSession, statement: sa.TextClause, **params: Any) -> list[Row]:
    return [dict(r._mapping) for r in await session.execute(statement, params)]


async def runs(session: AsyncSession, limit: int = 500) -> list[Row]:
    """The most recently started runs, each with its counts, scores, times and policy versions."""
    return await _rows(session, RUNS, limit=limit)


async def run_summary(session: AsyncSession, run_id: str) -> Row | None:
    rows = await _rows(session, ONE_RUN, run=run_id, limit=1)
    return rows[0] if rows else None


async def failure_types(session: AsyncSession, run_id: str) -> list[Row]:
    return await _rows(session, FAILURE_TYPES, run=run_id)


async def latency(session: AsyncSession, run_id: str) -> Row:
    return (await _rows(session, LATENCY, run=run_id))[0]


async def fingerprint(session: AsyncSession, run_id: str) -> tuple[Any, ...]:
    return tuple((await session.execute(FINGERPRINT, {"run": run_id})).one())


async def table_page(session: AsyncSession, run_id: str, q: TableQuery, total: int | None = None
                     ) -> tuple[list[Row], int]:
    """One page of the run's rollout table under `q`, and how many rollouts match in all (counted unless given)."""
    where, params = q.where()
    params["run"] = run_id
    if total is None:
        total = await session.scalar(sa.text(f"SELECT count(*) FROM rollout_rows r WHERE r.run_id = :run{where}"),
                                     params)
    # The page's ids are chosen on the sort key alone (narrow rows sort faster on a deep page), then joined back.
    rows = await _rows(session, sa.text(
        f"SELECT {_TABLE_COLUMNS} FROM rollout_rows r JOIN (SELECT r.id FROM rollout_rows r WHERE r.run_id = :run"
        f"{where} ORDER BY {q.order_by()} LIMIT :limit OFFSET :offset) page USING (id) ORDER BY {q.order_by()}"),
        **params, limit=q.size, offset=q.offset)
    if rows:
        versions = {r["rollout_id"]: r["versions"]
                    for r in await _rows(session, PAGE_POLICIES, ids=[r["id"] for r in rows])}
        for r in rows:
            r["policy_versions"] = versions.get(r["id"]) or []
    return rows, int(total or 0)


async def rollout(session: AsyncSession, rollout_id: str) -> Row | None:
    rows = await _rows(session, ROLLOUT, rid=rollout_id)
    return rows[0] if rows else None


async def head_of(session: AsyncSession, row: Row) -> int | None:
    """The chain to show: the accepted head of a finished rollout, the newest message of a running one."""
    if row["head_id"] is not None:
        return int(row["head_id"])
    if row["status"] == "running":
        head = await session.scalar(LIVE_HEAD, {"rid": row["id"]})
        return None if head is None else int(head)
    return None


async def chain(session: AsyncSession, head: int) -> list[Row]:
    """The chain ending at `head`, oldest first: id, position, role, and whether it is a generated turn."""
    return await _rows(session, CHAIN, head=head)


async def messages(session: AsyncSession, ids: list[int], cut: int = CUT) -> list[Row]:
    return await _rows(session, MESSAGES, ids=ids, cut=cut)


async def message_field(session: AsyncSession, rollout_id: str, message_id: int, field: str) -> str | None:
    return await session.scalar(MESSAGE_FIELD, {"field": field, "mid": message_id, "rid": rollout_id})


async def message_tokens(session: AsyncSession, rollout_id: str, message_id: int) -> dict[str, Any] | None:
    return await session.scalar(MESSAGE_TOKENS, {"mid": message_id, "rid": rollout_id})


async def old_transcript(session: AsyncSession, rollout_id: str) -> list[Any]:
    return await session.scalar(OLD_TRANSCRIPT, {"rid": rollout_id}) or []


async def old_turns(session: AsyncSession, rollout_id: str) -> list[Row]:
    return await _rows(session, OLD_TURNS, rid=rollout_id)


async def old_tokens(session: AsyncSession, rollout_id: str, turn: int) -> Row | None:
    rows = await _rows(session, OLD_TOKENS, rid=rollout_id, turn=turn)
    return rows[0] if rows else None
