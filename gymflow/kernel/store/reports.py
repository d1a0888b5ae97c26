"""Read-side queries: the SQL views (migration 0002) plus what `gymflow report` and `gymflow show` print."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession

from gymflow.kernel.store.episodes import read_chain
from gymflow.kernel.store.repo import driver
from gymflow.kernel.store.scores import SCORED_ROLLOUTS

VIEWS = ("run_scores", "failure_counts", "latency_percentiles")
Row = dict[str, Any]

# Per (type, message): its count and the first few rollout ids; the top `per_type` messages of each type.
TOP_FAILURES = sa.text("""
WITH grouped AS (
  SELECT coalesce(failure_type, 'none') AS failure_type, coalesce(failure_message, '') AS failure_message,
         count(*) AS n, (array_agg(id ORDER BY id))[1:(:examples)] AS examples
  FROM rollouts WHERE run_id = :run AND (status = 'failed' OR masked)
  GROUP BY 1, 2
), ranked AS (
  SELECT *, sum(n) OVER (PARTITION BY failure_type) AS type_n,
         row_number() OVER (PARTITION BY failure_type ORDER BY n DESC, failure_message) AS rank,
         count(*) OVER (PARTITION BY failure_type) AS messages
  FROM grouped
)
SELECT failure_type, failure_message, n, examples, type_n, messages FROM ranked WHERE rank <= :per_type
ORDER BY type_n DESC, failure_type, n DESC, failure_message
""")

# Only what the statistics and plots need: no transcripts, which can be megabytes per rollout.
ROLLOUT_POINTS = sa.text("""
SELECT id, task_id, sample_index, status, reward, masked, failure_type, latency_s, started_at, finished_at
FROM rollouts WHERE run_id = :run ORDER BY task_id, sample_index
""")

# Token ids and logprobs can be tens of thousands of numbers per turn: count them in SQL, never fetch them.
# A missing list may be SQL NULL or a JSON null, hence jsonb_typeof.
GENERATIONS = sa.text("""
SELECT turn, attempt, model, finish_reason, prompt_tokens, completion_tokens, latency_s, created_at,
""" + ",\n".join(
    f"CASE WHEN jsonb_typeof({col}) = 'array' THEN jsonb_array_length({col}) END AS {name}_n, "
    f"coalesce(jsonb_typeof({col}) = 'array', false) AS has_{name}"
    for col, name in (("prompt_token_ids", "prompt_token_ids"), ("generation_token_ids", "generation_token_ids"),
                      ("generation_log_probs", "log_probs"))) + """
FROM generations WHERE rollout_id = :rid ORDER BY turn
""")


# The 0002 views that read scores, over a chosen score version (migration 0009) instead of the collect's own.
_VERSIONED_VIEWS = {
    "run_scores": """
WITH per_task AS (
  SELECT run_id, env, model, task_id,
         count(*) FILTER (WHERE status = 'completed' AND NOT masked) AS scored,
         max(reward) FILTER (WHERE status = 'completed' AND NOT masked) AS best
  FROM rollouts GROUP BY run_id, env, model, task_id
)
SELECT rollouts.run_id, rollouts.env, rollouts.model, count(*) AS rollouts,
       count(*) FILTER (WHERE rollouts.status = 'completed') AS completed,
       count(*) FILTER (WHERE rollouts.status = 'failed') AS failed,
       count(*) FILTER (WHERE rollouts.status = 'running') AS running,
       count(*) FILTER (WHERE rollouts.masked) AS masked,
       avg(rollouts.reward) FILTER (WHERE rollouts.status = 'completed' AND NOT rollouts.masked) AS mean_reward,
       (SELECT avg(CASE WHEN p.best >= 1 THEN 1.0 ELSE 0.0 END) FROM per_task p
         WHERE p.run_id = rollouts.run_id AND p.env = rollouts.env AND p.model = rollouts.model
           AND p.scored > 0) AS pass_at_k
FROM rollouts GROUP BY rollouts.run_id, rollouts.env, rollouts.model""",
    "failure_counts": """
SELECT run_id, env, model, coalesce(failure_type, 'none') AS failure_type, status, masked, count(*) AS n
FROM rollouts WHERE status = 'failed' OR masked GROUP BY 1, 2, 3, 4, 5, 6""",
}
_SCORED = SCORED_ROLLOUTS.replace("%(version)s", ":version").replace("%(run)s", ":run")


def _over(statement: str | sa.TextClause, version_id: str | None) -> sa.TextClause:
    """`statement` reading `rollouts`, made to read the rollouts as score version `version_id` scored them."""
    text = statement.text if isinstance(statement, sa.TextClause) else statement
    return sa.text(text if version_id is None else text.replace("FROM rollouts", "FROM " + _SCORED))


async def _rows(session: AsyncSession, statement: sa.TextClause, **params: Any) -> list[Row]:
    return [dict(r._mapping) for r in await session.execute(statement, params)]


async def run_report(session: AsyncSession, run_id: str, version_id: str | None = None) -> dict[str, list[Row]]:
    """Rows of each view for one run, keyed by view name; the scores of `version_id` where given."""
    out: dict[str, list[Row]] = {}
    for view in VIEWS:
        if version_id is not None and view in _VERSIONED_VIEWS:
            out[view] = await _rows(session, _over(_VERSIONED_VIEWS[view], version_id), run=run_id,
                                    version=version_id)
            continue
        result = await session.execute(sa.text(f"SELECT * FROM {view} WHERE run_id = :run"), {"run": run_id})
        out[view] = [dict(r._mapping) for r in result]
    return out


async def top_failures(session: AsyncSession, run_id: str, *, per_type: int = 3, examples: int = 3,
                       version_id: str | None = None) -> list[Row]:
    """The `per_type` most frequent messages of each failure type (failed or masked rollouts), most frequent type
    first, each with its count `n`, the type's total `type_n`, its number of distinct `messages` and up to
    `examples` rollout ids."""
    return await _rows(session, _over(TOP_FAILURES, version_id), run=run_id, per_type=per_type, examples=examples,
                       version=version_id)


async def rollout_points(session: AsyncSession, run_id: str, version_id: str | None = None) -> list[Row]:
    """One small row per rollout of the run (reward, status, latency, times) for statistics and plots."""
    return await _rows(session, _over(ROLLOUT_POINTS, version_id), run=run_id, version=version_id)


async def recent_runs(session: AsyncSession, limit: int = 5) -> list[str]:
    """The most recently started run ids, for error messages that name what does exist."""
    result = await session.execute(sa.text(
        "SELECT run_id FROM rollouts GROUP BY run_id ORDER BY max(started_at) DESC LIMIT :n"), {"n": limit})
    return [r[0] for r in result]


async def rollout_detail(session: AsyncSession, rollout_id: str) -> Row | None:
    """The rollout row (transcript and score details included) with its `generations`, or None if unknown."""
    rows = await _rows(session, sa.text("SELECT * FROM rollouts WHERE id = :rid"), rid=rollout_id)
    if not rows:
        return None
    detail = rows[0]
    detail["generations"] = await _rows(session, GENERATIONS, rid=rollout_id)
    detail["live"] = False
    if detail["status"] == "running" and (live := await live_episode(session, rollout_id)) is not None:
        detail["transcript"], detail["generations"] = live
        detail["live"] = True
    return detail


def _token_count(meta: dict[str, Any], key: str) -> int | None:
    value = meta.get(key)
    return len(value) if isinstance(value, list) else None


async def live_episode(session: AsyncSession, rollout_id: str) -> tuple[list[Any], list[Row]] | None:
    """For a rollout still running on the by-reference workflow: (transcript, generations) from the newest
    message stored for it (`rollouts` holds them only once the rollout finishes). None when nothing is stored.
    The newest message is the workflow's head except while a retried step's write is not yet accepted."""
    head = await session.scalar(sa.text("SELECT max(id) FROM messages WHERE rollout_id = :rid"), {"rid": rollout_id})
    if head is None:
        return None
    chain = await read_chain(await driver(session), head)
    generations: list[Row] = []
    for m in chain:
        if m.role != "assistant" or m.tokens is None:
            continue
        meta, usage = m.tokens, m.tokens.get("usage") or {}
        counts = {name: _token_count(meta, key) for name, key in (
            ("prompt_token_ids", "prompt_token_ids"), ("generation_token_ids", "generation_token_ids"),
            ("log_probs", "generation_log_probs"))}
        generations.append({
            "turn": len(generations), "attempt": meta.get("attempt", 1), "model": meta.get("model"),
            "finish_reason": meta.get("finish_reason"), "prompt_tokens": usage.get("prompt_tokens", 0),
            "completion_tokens": usage.get("completion_tokens", 0), "latency_s": meta.get("latency_s"),
            "created_at": None, **{f"{k}_n": v for k, v in counts.items()},
            **{f"has_{k}": v is not None for k, v in counts.items()}})
    return [m.body for m in chain], generations


async def similar_rollout_ids(session: AsyncSession, rollout_id: str, limit: int = 5) -> list[str]:
    """Ids of the same run (the part before the first '/'), for an error message about an unknown id."""
    run_id = rollout_id.split("/", 1)[0]
    result = await session.execute(sa.text("SELECT id FROM rollouts WHERE run_id = :run ORDER BY id LIMIT :n"),
                                   {"run": run_id, "n": limit})
    return [r[0] for r in result]
