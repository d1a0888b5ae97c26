"""Human review labels (migration 0010): write one, pick what to review next, and measure the verifier against
the reviewers. Append-only: a reviewer's newest label of a rollout counts, the older ones stay."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from gymflow.kernel.store.repo import Conn

VERDICTS = ("right", "wrong", "unsure")  # of the verifier's score
QUEUES = ("random", "disagreements", "near-threshold", "failure")
MAX_REVIEWER_CHARS, MAX_TAGS, MAX_TAG_CHARS, MAX_COMMENT_CHARS = 200, 20, 100, 10_000


class ReviewError(ValueError):
    """A label that cannot be stored, with the field that is wrong."""


@dataclass(frozen=True)
class Label:
    rollout_id: str
    reviewer: str
    verdict: str
    reward: float | None = None
    tags: tuple[str, ...] = ()
    comment: str | None = None

    def problems(self) -> list[str]:
        out = []
        if not self.reviewer.strip() or len(self.reviewer) > MAX_REVIEWER_CHARS:
            out.append(f"reviewer: 1 to {MAX_REVIEWER_CHARS} characters")
        if self.verdict not in VERDICTS:
            out.append(f"verdict: {self.verdict[:40]!r} is not one of {', '.join(VERDICTS)}")
        if self.reward is not None and (isinstance(self.reward, bool) or not math.isfinite(self.reward)):
            out.append(f"reward: {self.reward!r} is not a finite number")
        if len(self.tags) > MAX_TAGS or any(not t.strip() or len(t) > MAX_TAG_CHARS for t in self.tags):
            out.append(f"tags: at most {MAX_TAGS}, each 1 to {MAX_TAG_CHARS} characters")
        if self.comment is not None and len(self.comment) > MAX_COMMENT_CHARS:
            out.append(f"comment: {len(self.comment)} characters, at most {MAX_COMMENT_CHARS}")
        texts = (("reviewer", self.reviewer), ("comment", self.comment or ""), *(("tags", t) for t in self.tags))
        for name, text in texts:
            if "\x00" in text:
                out.append(f"{name}: contains a NUL character")
        return out


async def add_review(conn: Conn, label: Label) -> int:
    """Store `label`; its id. ReviewError naming the field, or LookupError for a rollout that does not exist."""
    if problems := label.problems():
        raise ReviewError("; ".join(problems))
    row = await (await conn.execute(
        "INSERT INTO reviews (rollout_id, reviewer, verdict, reward, tags, comment) "
        "SELECT id, %(reviewer)s, %(verdict)s, %(reward)s, %(tags)s, %(comment)s FROM rollout_rows WHERE id = %(rid)s "
        "RETURNING id",
        {"rid": label.rollout_id, "reviewer": label.reviewer.strip(), "verdict": label.verdict,
         "reward": label.reward, "tags": list(label.tags), "comment": label.comment})).fetchone()
    if row is None:
        raise LookupError(f"no rollout {label.rollout_id!r} (ids are RUN/TASK/SAMPLE; `gymflow report RUN` lists some)")
    return int(row[0])


# Each reviewer's newest label of each rollout.
LATEST = """SELECT DISTINCT ON (rollout_id, reviewer) * FROM reviews ORDER BY rollout_id, reviewer, id DESC"""

_NOT_REVIEWED = "NOT EXISTS (SELECT 1 FROM reviews v WHERE v.rollout_id = r.id AND v.reviewer = %(reviewer)s)"
_QUEUE_WHERE = {
    # A sample of the scored rollouts, in an order fixed by the seed (the same queue on every call).
    "random": "r.status = 'completed' AND NOT r.masked",
    # The samples of tasks whose samples disagree: a verifier error shows as a group split.
    "disagreements": """r.status = 'completed' AND NOT r.masked AND (r.run_id, r.task_id) IN (
        SELECT run_id, task_id FROM rollout_rows WHERE run_id = %(run)s AND status = 'completed' AND NOT masked
        GROUP BY run_id, task_id HAVING min(reward) IS DISTINCT FROM max(reward))""",
    # Rewards within `margin` of `threshold` (a judge's or a partial-credit verifier's close calls).
    "near-threshold": "r.status = 'completed' AND NOT r.masked AND abs(r.reward - %(threshold)s) <= %(margin)s",
    "failure": "(r.status = 'failed' OR r.masked) AND coalesce(r.failure_type, 'none') = %(failure_type)s",
}


async def queue(conn: Conn, run_id: str, kind: str, reviewer: str, *, n: int = 20, failure_type: str | None = None,
                threshold: float = 0.5, margin: float = 0.25, seed: str = "") -> list[dict[str, Any]]:
    """Up to `n` rollouts of the run for `reviewer` to label next (ones they have not labelled)."""
    if kind not in QUEUES:
        raise ReviewError(f"queue: {kind!r} is not one of {', '.join(QUEUES)}")
    if kind == "failure" and not failure_type:
        raise ReviewError("queue failure: give the failure type (e.g. verifier_timeout)")
    order = "md5(r.id || %(seed)s)" if kind == "random" else "r.task_id, r.sample_index"
    sql = (f"SELECT r.id, r.task_id, r.sample_index, r.env, r.status, r.reward, r.masked, r.failure_type "
           f"FROM rollout_rows r WHERE r.run_id = %(run)s AND {_QUEUE_WHERE[kind]} AND {_NOT_REVIEWED} "
           f"ORDER BY {order} LIMIT %(n)s")
    cur = await conn.execute(sql, {"run": run_id, "reviewer": reviewer, "n": n, "failure_type": failure_type,
                                   "threshold": threshold, "margin": margin, "seed": seed})
    names = [c.name for c in cur.description]
    return [dict(zip(names, row, strict=True)) for row in await cur.fetchall()]


# Per environment, the verifier against its reviewers' newest labels. A label's truth: the reviewer's reward when
# they gave one, else the verifier's own outcome if they called it right and the opposite if wrong. `unsure`
# labels and masked rollouts are counted, never in precision or recall.
_AGREEMENT = f"""
WITH labels AS (
  SELECT l.*, r.env, r.reward AS verifier_reward, r.masked, r.status,
         (r.reward >= %(threshold)s) AS verifier_pass
  FROM ({LATEST}) l JOIN rollout_rows r ON r.id = l.rollout_id WHERE r.run_id = %(run)s
), judged AS (
  SELECT *, CASE WHEN verdict = 'unsure' OR masked OR verifier_reward IS NULL THEN NULL
                 WHEN reward IS NOT NULL THEN reward >= %(threshold)s
                 WHEN verdict = 'right' THEN verifier_pass ELSE NOT verifier_pass END AS human_pass
  FROM labels
)
SELECT env, count(*) AS labels, count(DISTINCT rollout_id) AS rollouts, count(DISTINCT reviewer) AS reviewers,
       count(*) FILTER (WHERE verdict = 'right') AS agree, count(*) FILTER (WHERE verdict = 'wrong') AS disagree,
       count(*) FILTER (WHERE verdict = 'unsure') AS unsure, count(*) FILTER (WHERE masked) AS masked,
       count(*) FILTER (WHERE verifier_pass AND human_pass) AS tp,
       count(*) FILTER (WHERE verifier_pass AND NOT human_pass) AS fp,
       count(*) FILTER (WHERE NOT verifier_pass AND human_pass) AS fn,
       count(*) FILTER (WHERE NOT verifier_pass AND NOT human_pass) AS tn,
       (array_agg(rollout_id ORDER BY rollout_id) FILTER (WHERE verifier_pass AND NOT human_pass))[1:%(examples)s]
         AS fp_examples,
       (array_agg(rollout_id ORDER BY rollout_id) FILTER (WHERE NOT verifier_pass AND human_pass))[1:%(examples)s]
         AS fn_examples,
       (array_agg(coalesce(comment, '') ORDER BY rollout_id) FILTER (WHERE verdict = 'wrong'))[1:%(examples)s]
         AS wrong_comments
FROM judged GROUP BY env ORDER BY env
"""


async def agreement(conn: Conn, run_id: str, *, threshold: float = 1.0, examples: int = 5) -> list[dict[str, Any]]:
    """Per environment: labels, agree/disagree/unsure, the confusion counts of reward >= threshold (verifier vs
    reviewers), precision and recall of the verifier's passes, and example rollouts of each kind of miss."""
    cur = await conn.execute(_AGREEMENT, {"run": run_id, "threshold": threshold, "examples": examples})
    names = [c.name for c in cur.description]
    out = []
    for row in await cur.fetchall():
        d = dict(zip(names, row, strict=True))
        d["precision"] = d["tp"] / (d["tp"] + d["fp"]) if d["tp"] + d["fp"] else None
        d["recall"] = d["tp"] / (d["tp"] + d["fn"]) if d["tp"] + d["fn"] else None
        out.append(d)
    return out


async def labels(conn: Conn, run_id: str) -> list[dict[str, Any]]:
    """Every reviewer's newest label of the run's rollouts (what `gymflow review export` writes)."""
    cur = await conn.execute(
        f"SELECT l.rollout_id, l.reviewer, l.verdict, l.reward, l.tags, l.comment, l.created_at, "
        f"r.reward AS verifier_reward, r.masked FROM ({LATEST}) l JOIN rollout_rows r ON r.id = l.rollout_id "
        f"WHERE r.run_id = %(run)s ORDER BY l.rollout_id, l.reviewer", {"run": run_id})
    names = [c.name for c in cur.description]
    return [dict(zip(names, row, strict=True)) for row in await cur.fetchall()]


async def of_rollout(conn: Conn, rollout_id: str) -> list[dict[str, Any]]:
    """Every label of one rollout, newest first (the view shows them all)."""
    cur = await conn.execute("SELECT id, reviewer, verdict, reward, tags, comment, created_at FROM reviews "
                             "WHERE rollout_id = %(rid)s ORDER BY id DESC", {"rid": rollout_id})
    names = [c.name for c in cur.description]
    return [dict(zip(names, row, strict=True)) for row in await cur.fetchall()]
