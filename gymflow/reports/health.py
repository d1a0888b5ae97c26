"""`gymflow check RUN`: the checks a careful user runs after a collection (NeMo Gym's `gym eval health-check`).

Each check has a stable id, a verdict (ok / warn / fail, or skip when the run holds nothing it can look at) from
the rate of what it counts, the counts, and up to 3 example rollout ids. The transcript checks read each finished
rollout's accepted message chain (`rollout_rows.head_id`, migration 0008), walked once into a temporary table;
everything is aggregated in SQL, and only example ids (and the tails of a bounded number of replies the repetition
pre-filter picked) leave the database. Rollouts still running have no accepted chain and are not examined.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession

from gymflow.kernel.failures import FAILURE_TYPES

EXAMPLES = 3
VERDICTS = ("ok", "warn", "fail", "skip")


@dataclass(frozen=True)
class Threshold:
    """warn when the rate is above `warn_above`, fail when above `fail_above` (None: never fails)."""

    warn_above: float
    fail_above: float | None

    def verdict(self, n: int, of: int) -> str:
        if of == 0:
            return "skip"
        rate = n / of
        if self.fail_above is not None and rate > self.fail_above:
            return "fail"
        return "warn" if rate > self.warn_above else "ok"

    def describe(self) -> str:
        def above(rate: float) -> str:
            return "if any" if rate == 0 else f"> {rate:.0%}"

        return f"warn {above(self.warn_above)}, " + ("never fails" if self.fail_above is None else
                                                     f"fail {above(self.fail_above)}")


# The stated thresholds of each check (docs/operations.md lists them too).
THRESHOLDS: dict[str, Threshold] = {
    "hollow_turns": Threshold(0.0, 0.05),
    "zero_completion_tokens": Threshold(0.0, 0.05),
    "truncated_replies": Threshold(0.0, 0.10),
    "runaway_repetition": Threshold(0.0, 0.05),
    "tool_call_parse_failures": Threshold(0.0, 0.10),
    "token_drift": Threshold(0.0, 0.05),
    "tasks_failing_every_sample": Threshold(0.0, 0.10),
    "duplicate_rollout_identities": Threshold(0.0, 0.0),
    "duplicate_prompts": Threshold(0.0, None),
    "failure_share": Threshold(0.01, 0.10),
}


@dataclass
class Check:
    id: str
    title: str
    verdict: str
    n: int  # what the check counts
    of: int  # out of how many
    unit: str
    counts: dict[str, int] = field(default_factory=dict)
    examples: list[str] = field(default_factory=list)
    detail: str = ""

    @property
    def threshold(self) -> Threshold:
        return THRESHOLDS[self.id]

    def to_json(self) -> dict[str, Any]:
        t = self.threshold
        return {"id": self.id, "title": self.title, "verdict": self.verdict, "n": self.n, "of": self.of,
                "unit": self.unit, "rate": self.n / self.of if self.of else None,
                "threshold": {"warn_above": t.warn_above, "fail_above": t.fail_above}, "counts": self.counts,
                "examples": self.examples, "detail": self.detail}


def check(check_id: str, title: str, n: int, of: int, unit: str, **kw: Any) -> Check:
    return Check(check_id, title, THRESHOLDS[check_id].verdict(n, of), n, of, unit, **kw)


# ---- SQL ------------------------------------------------------------------------------------------------

# The accepted chain of every finished rollout of the run: (rollout, message id), one walk for all the checks.
CHAIN = """
CREATE TEMP TABLE health_chain ON COMMIT DROP AS
WITH RECURSIVE walk AS (
  SELECT r.id AS rollout_id, r.head_id AS mid FROM rollout_rows r WHERE r.run_id = :run AND r.head_id IS NOT NULL
  UNION ALL
  SELECT w.rollout_id, m.parent_id FROM walk w JOIN messages m ON m.id = w.mid WHERE m.parent_id IS NOT NULL
)
SELECT rollout_id, mid FROM walk
"""

# One pass over the generated assistant turns (tokens IS NOT NULL: a prompt's own assistant messages carry none)
# into a temporary table of flags. Hollow: no tool call and no visible text. Zero tokens: usage reported (a prompt
# count) but no completion token. The repetition pre-filter: the reply's last 32 characters recur at least 4 times
# in its last 8,000 (cheap, linear, bounded); Python then measures the candidates exactly (repetition_coverage).
# Drift: turn k+1's prompt token ids must start with turn k's prompt + generation ids (a jsonb slice compared with
# jsonb equality: text output of thousands of numerics cost 4x more). Each jsonb column is read once, through
# jsonb_to_record: every `->` on a large (TOASTed) value would decompress all of it again.
TURNS = """
CREATE TEMP TABLE health_turns ON COMMIT DROP AS
WITH t AS (
  SELECT c.rollout_id, m.position, b.content, k.finish_reason, k.prompt_token_ids AS p, k.generation_token_ids AS gen,
         coalesce(jsonb_array_length(CASE WHEN jsonb_typeof(b.tool_calls) = 'array' THEN b.tool_calls END), 0) AS calls,
         coalesce(b.content, '') ~ '\\S' AS has_text, coalesce(b.reasoning_content, '') ~ '\\S' AS has_reasoning,
         coalesce(k.usage->>'completion_tokens', '0') AS completion, coalesce(k.usage->>'prompt_tokens', '0') AS prompt,
         right(rtrim(coalesce(b.reasoning_content, '') || E'\\n' || coalesce(b.content, '')), 8000) AS tail
  FROM health_chain c JOIN messages m ON m.id = c.mid
  CROSS JOIN LATERAL jsonb_to_record(m.body) AS b(content text, reasoning_content text, tool_calls jsonb)
  CROSS JOIN LATERAL jsonb_to_record(m.tokens)
    AS k(finish_reason text, usage jsonb, prompt_token_ids jsonb, generation_token_ids jsonb)
  WHERE m.role = 'assistant' AND m.tokens IS NOT NULL
), w AS (
  SELECT t.*, jsonb_typeof(p) = 'array' AS has_ids, lag(p) OVER o AS prev_p, lag(gen) OVER o AS prev_g,
         length(tail) >= 128 AND length(tail) - length(replace(tail, right(tail, 32), '')) >= 4 * 32 AS candidate
  FROM t WINDOW o AS (PARTITION BY rollout_id ORDER BY position)
), x AS (
  SELECT w.*, has_ids AND jsonb_typeof(prev_p) = 'array' AND jsonb_typeof(prev_g) = 'array' AS pair FROM w
)
SELECT rollout_id, calls = 0 AND NOT has_text AS hollow, content IS NULL AS no_content, has_reasoning,
       completion = '0' AND prompt <> '0' AS zero_tokens, completion <> '0' OR prompt <> '0' AS usage_reported,
       finish_reason = 'length' AS truncated, candidate, CASE WHEN candidate THEN tail END AS tail, has_ids, pair,
       CASE WHEN pair AND jsonb_array_length(prev_p) + jsonb_array_length(prev_g) > 0  -- CASE: AND may not skip it
            THEN jsonb_path_query_array(p, '$[0 to $n]', jsonb_build_object(
                   'n', jsonb_array_length(prev_p) + jsonb_array_length(prev_g) - 1)) <> prev_p || prev_g
            ELSE false END AS drift
FROM x
"""

TURN_COUNTS = sa.text("""
SELECT count(*) AS turns, count(*) FILTER (WHERE usage_reported) AS usage_reported,
       count(*) FILTER (WHERE hollow) AS hollow,
       count(*) FILTER (WHERE hollow AND no_content AND NOT has_reasoning) AS hollow_empty,
       count(*) FILTER (WHERE hollow AND NOT no_content AND NOT has_reasoning) AS hollow_whitespace,
       count(*) FILTER (WHERE hollow AND has_reasoning) AS hollow_reasoning_only,
       (array_agg(DISTINCT rollout_id) FILTER (WHERE hollow))[1:(:examples)] AS hollow_examples,
       count(*) FILTER (WHERE zero_tokens) AS zero_tokens,
       (array_agg(DISTINCT rollout_id) FILTER (WHERE zero_tokens))[1:(:examples)] AS zero_tokens_examples,
       count(*) FILTER (WHERE truncated) AS truncated,
       (array_agg(DISTINCT rollout_id) FILTER (WHERE truncated))[1:(:examples)] AS truncated_examples,
       count(*) FILTER (WHERE candidate) AS repeat_candidates
FROM health_turns
""")

REPEAT_CANDIDATES = sa.text("SELECT rollout_id, tail FROM health_turns WHERE candidate ORDER BY rollout_id "
                            "LIMIT :limit")

DRIFT = sa.text("""
SELECT count(*) FILTER (WHERE pair) AS pairs, count(DISTINCT rollout_id) FILTER (WHERE pair) AS rollouts,
       count(*) FILTER (WHERE drift) AS drifted_pairs, count(DISTINCT rollout_id) FILTER (WHERE drift) AS drifted,
       (array_agg(DISTINCT rollout_id) FILTER (WHERE drift))[1:(:examples)] AS examples,
       count(*) FILTER (WHERE has_ids) AS turns_with_ids
FROM health_turns
""")

# Tool messages after the rollout's first generated turn (earlier ones are the prompt's). A call the environment
# could not dispatch is stored as a tool message `Error: ...` with tokens.is_error (activities/env_calls.py):
# "Error: arguments ..." (not a JSON object, too deep, too long) or "Error: unknown tool ...".
TOOLS = sa.text("""
WITH m AS (
  SELECT c.rollout_id, m.role, m.position, m.tokens, m.body->>'content' AS content,
         min(m.position) FILTER (WHERE m.role = 'assistant' AND m.tokens IS NOT NULL)
           OVER (PARTITION BY c.rollout_id) AS first_turn
  FROM health_chain c JOIN messages m ON m.id = c.mid
), t AS (
  SELECT rollout_id, coalesce(tokens->>'is_error', '') = 'true' AS is_error,
         coalesce(content, '') LIKE 'Error: arguments %' AS bad_arguments,
         coalesce(content, '') LIKE 'Error: unknown tool %' AS unknown_tool
  FROM m WHERE role = 'tool' AND position > first_turn AND coalesce(tokens->>'not_run', '') <> 'true'
)
SELECT count(*) AS calls, count(*) FILTER (WHERE is_error) AS errors,
       count(*) FILTER (WHERE is_error AND bad_arguments) AS bad_arguments,
       count(*) FILTER (WHERE is_error AND unknown_tool) AS unknown_tool,
       (array_agg(DISTINCT rollout_id) FILTER (WHERE is_error AND (bad_arguments OR unknown_tool)))[1:(:examples)]
         AS examples
FROM t
""")

TASKS = sa.text("""
WITH t AS (
  SELECT task_id, min(id) AS first_id, count(*) FILTER (WHERE status = 'running') AS running,
         count(*) FILTER (WHERE status = 'completed' AND NOT masked AND reward IS NOT NULL) AS scored,
         count(*) FILTER (WHERE status = 'completed' AND NOT masked AND reward >= :threshold) AS passed
  FROM rollout_rows WHERE run_id = :run GROUP BY task_id
)
SELECT count(*) AS tasks, count(*) FILTER (WHERE scored = 0 AND running = 0) AS unscored,
       count(*) FILTER (WHERE scored > 0 AND passed = 0) AS never_solved,
       (array_agg(first_id ORDER BY task_id) FILTER (WHERE scored = 0 AND running = 0))[1:(:examples)] AS examples
FROM t
""")

IDENTITIES = sa.text("""
WITH r AS (SELECT id, task_id, sample_index FROM rollout_rows WHERE run_id = :run),
dups AS (SELECT task_id, sample_index, array_agg(id ORDER BY id) AS ids FROM r GROUP BY 1, 2 HAVING count(*) > 1),
odd AS (SELECT id FROM r WHERE id <> :run || '/' || task_id || '/' || sample_index)
SELECT (SELECT count(*) FROM r) AS rollouts, (SELECT coalesce(sum(cardinality(ids)), 0) FROM dups) AS duplicated,
       (SELECT count(*) FROM odd) AS misnamed,
       ARRAY(SELECT id FROM (SELECT unnest(ids) AS id FROM dups UNION SELECT id FROM odd) e ORDER BY id
             LIMIT :examples) AS examples
""")

# Tasks of the run whose prompt and tools are those of another task: samples of one prompt under several ids.
PROMPTS = sa.text("""
WITH t AS (
  SELECT task_id, md5(coalesce(body->'messages', 'null'::jsonb)::text || coalesce(body->'tools', 'null'::jsonb)::text)
           AS prompt
  FROM tasks WHERE run_id = :run
), g AS (SELECT prompt, array_agg(task_id ORDER BY task_id) AS ids FROM t GROUP BY prompt HAVING count(*) > 1)
SELECT (SELECT count(*) FROM t) AS tasks, (SELECT coalesce(sum(cardinality(ids) - 1), 0) FROM g) AS extra,
       (SELECT count(*) FROM g) AS groups,
       ARRAY(SELECT min(r.id) FROM g CROSS JOIN LATERAL unnest(g.ids) AS u(task_id)
             JOIN rollout_rows r ON r.run_id = :run AND r.task_id = u.task_id
             GROUP BY u.task_id ORDER BY u.task_id LIMIT :examples) AS examples
""")

OUTCOMES = sa.text("""
SELECT count(*) AS rollouts, count(*) FILTER (WHERE status = 'failed') AS failed,
       count(*) FILTER (WHERE masked) AS masked, count(*) FILTER (WHERE status = 'running') AS running
FROM rollout_rows WHERE run_id = :run
""")

FAILURE_TYPES_SQL = sa.text("""
SELECT coalesce(failure_type, 'none') AS failure_type, count(*) AS n, (array_agg(id ORDER BY id))[1:(:examples)] AS ids
FROM rollout_rows WHERE run_id = :run AND (status = 'failed' OR masked) GROUP BY 1 ORDER BY 2 DESC, 1
""")


# ---- runaway repetition, measured exactly on the pre-filter's candidates -----------------------------------

REPEAT_MIN_COVERAGE = 0.5  # "most of a reply"
REPEAT_MIN_OCCURRENCES = 4
MAX_CANDIDATES = 2000  # tails fetched at most (8,000 characters each): the check stays bounded on any run


def repetition_coverage(text: str) -> float:
    """The share of `text` covered by n-grams that occur at least 4 times in it: word 4-grams, or character
    16-grams for text with few spaces (a run of '!!!!' or of CJK). Linear: one counting pass, one marking pass."""
    words = text.split()
    if len(words) >= 32 and len(text) / len(words) < 20:
        units: list[str] = words
        n = 4
    else:
        units, n = list(text), 16
    if len(units) < 2 * n:
        return 0.0
    grams = [" ".join(units[i:i + n]) if n == 4 else text[i:i + n] for i in range(len(units) - n + 1)]
    counts = Counter(grams)
    covered, reach = 0, 0  # units covered so far; the end of the last repeated gram
    for i, gram in enumerate(grams):
        if counts[gram] >= REPEAT_MIN_OCCURRENCES:
            start = max(i, reach)
            reach = i + n
            covered += reach - start
    return covered / len(units)


# ---- the checks ---------------------------------------------------------------------------------------------


async def _one(session: AsyncSession, statement: sa.TextClause, **params: Any) -> Any:
    return (await session.execute(statement, {"examples": EXAMPLES, **params})).one()


async def _turn_checks(session: AsyncSession) -> list[Check]:
    r = await _one(session, TURN_COUNTS)
    turns = r.turns
    checks = [
        check("hollow_turns", "assistant turns with no text and no tool call", r.hollow, turns, "assistant turns",
              counts={"empty": r.hollow_empty, "whitespace_only": r.hollow_whitespace,
                      "reasoning_only": r.hollow_reasoning_only},
              examples=list(r.hollow_examples or []),
              detail="no content (or only whitespace) and no tool call; reasoning_only: only a reasoning text"),
    ]
    zero = check("zero_completion_tokens", "replies with zero completion tokens", r.zero_tokens,
                 r.usage_reported, "turns with usage reported", examples=list(r.zero_tokens_examples or []),
                 counts={"turns_without_usage": turns - r.usage_reported})
    if turns and not r.usage_reported:
        zero.detail = "not checkable: no turn reports token usage (a recorded model, or a server without usage)"
    checks += [zero, check("truncated_replies", "replies cut at max_tokens (finish_reason 'length')", r.truncated,
                           turns, "assistant turns", examples=list(r.truncated_examples or []))]
    rows = (await session.execute(REPEAT_CANDIDATES, {"limit": MAX_CANDIDATES})).all()
    hits = [rid for rid, tail in rows if repetition_coverage(tail) >= REPEAT_MIN_COVERAGE]
    detail = (f"a repeated n-gram (4 words, or 16 characters) covers >= {REPEAT_MIN_COVERAGE:.0%} of the reply's "
              "last 8,000 characters")
    if r.repeat_candidates > MAX_CANDIDATES:
        detail += f"; only the first {MAX_CANDIDATES} of {r.repeat_candidates} candidates were measured"
    checks.append(check("runaway_repetition", "replies that repeat themselves", len(hits), turns, "assistant turns",
                        counts={"candidates": r.repeat_candidates}, examples=sorted(set(hits))[:EXAMPLES],
                        detail=detail))
    return checks


async def _tool_check(session: AsyncSession) -> Check:
    r = await _one(session, TOOLS)
    failed = r.bad_arguments + r.unknown_tool
    return check("tool_call_parse_failures", "tool calls the environment could not parse or dispatch", failed,
                 r.calls, "tool calls", examples=list(r.examples or []),
                 counts={"bad_arguments": r.bad_arguments, "unknown_tool": r.unknown_tool,
                         "other_tool_errors": r.errors - failed},
                 detail="bad_arguments: not a JSON object (or too deep or long); unknown_tool: a name the task "
                        "does not offer; other_tool_errors (not counted): the tool refused or failed the call")


async def _drift_check(session: AsyncSession) -> Check:
    r = await _one(session, DRIFT)
    c = check("token_drift", "turns whose prompt token ids do not extend the previous turn's", r.drifted,
              r.rollouts, "rollouts with token ids on 2+ turns", examples=list(r.examples or []),
              counts={"turn_pairs": r.pairs, "drifted_pairs": r.drifted_pairs})
    if not r.pairs:
        c.verdict = "skip"
        c.detail = ("not checkable: no token ids are stored (set return_token_ids on the model)" if not
                    r.turns_with_ids else "not checkable: no rollout has token ids on two consecutive turns")
    else:
        c.detail = "turn k+1's prompt_token_ids must start with turn k's prompt_token_ids + generation_token_ids"
    return c


async def _task_checks(session: AsyncSession, run_id: str, threshold: float) -> list[Check]:
    t = await _one(session, TASKS, run=run_id, threshold=threshold)
    ids = await _one(session, IDENTITIES, run=run_id)
    p = await _one(session, PROMPTS, run=run_id)
    return [
        check("tasks_failing_every_sample", "tasks with no scored sample (every one failed or masked)", t.unscored,
              t.tasks, "tasks", examples=list(t.examples or []), counts={"never_solved": t.never_solved},
              detail=f"never_solved (not counted): scored, but no sample reached reward >= {threshold:g}; "
                     "`gymflow profile` lists them"),
        check("duplicate_rollout_identities", "rollouts sharing a (task, sample) or misnamed",
              ids.duplicated + ids.misnamed, ids.rollouts, "rollouts", examples=list(ids.examples or []),
              counts={"duplicated": ids.duplicated, "misnamed": ids.misnamed},
              detail="each rollout must be the only one of its (task, sample index), with id RUN/TASK/SAMPLE"),
        check("duplicate_prompts", "tasks whose prompt and tools repeat another task's", p.extra, p.tasks,
              "stored tasks", examples=list(p.examples or []), counts={"groups": p.groups},
              detail="the same prompt under several task ids weighs it more in every mean"),
    ]


async def _failure_check(session: AsyncSession, run_id: str) -> Check:
    o = await _one(session, OUTCOMES, run=run_id)
    types = (await session.execute(FAILURE_TYPES_SQL, {"run": run_id, "examples": EXAMPLES})).all()
    finished = o.rollouts - o.running
    outside = [t.failure_type for t in types if t.failure_type not in FAILURE_TYPES]
    c = check("failure_share", "rollouts failed or masked", o.failed + o.masked, finished, "finished rollouts",
              counts={"failed": o.failed, "masked": o.masked, "running": o.running,
                      **{f"type:{t.failure_type}": t.n for t in types}},
              examples=[i for t in types for i in t.ids][:EXAMPLES],
              detail=", ".join(f"{t.failure_type} {t.n / finished:.1%}" for t in types) if finished else "")
    if outside:
        c.verdict = "fail"
        c.detail += f"; types outside the closed set of docs/failures.md: {', '.join(outside)}"
    if o.running:
        c.detail += f"{'; ' if c.detail else ''}{o.running} rollout(s) still running were not counted"
    return c


async def known_run(session: AsyncSession, run_id: str) -> bool:
    return bool(await session.scalar(sa.text("SELECT EXISTS (SELECT 1 FROM rollout_rows WHERE run_id = :run)"),
                                     {"run": run_id}))


async def run_checks(session: AsyncSession, run_id: str, *, threshold: float = 1.0) -> list[Check] | None:
    """Every check of the run, in a stable order; None when the run has no rollouts."""
    if not await known_run(session, run_id):
        return None
    await session.execute(sa.text("DROP TABLE IF EXISTS health_chain, health_turns"))
    await session.execute(sa.text(CHAIN), {"run": run_id})
    await session.execute(sa.text(TURNS))
    checks = await _turn_checks(session)
    checks += [await _tool_check(session), await _drift_check(session)]
    checks += await _task_checks(session, run_id, threshold)
    checks.append(await _failure_check(session, run_id))
    await session.rollback()  # drops the temporary table
    return checks
