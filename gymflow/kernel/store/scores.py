"""Score versions (migration 0009): a rescore's scores, stored beside the collect's own, never over them.

Version 0 is the collect's own score (`rollout_rows`); versions 1, 2, ... are rescores. Each rescore row is
written once (`ON CONFLICT DO NOTHING` on (version, rollout)), so an interrupted rescore, run again, scores only
what it had not stored: no rollout twice, none skipped.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from gymflow.kernel.store.repo import Conn, storable

COLLECTED = "collected"  # the name of version 0: the score each rollout got when it was collected
LATEST = "latest"


@dataclass(frozen=True)
class ScoreVersion:
    id: str
    run_id: str
    name: str
    ordinal: int
    verifiers: dict[str, Any]
    options: dict[str, Any]
    finished: bool
    scored: int


def version_id(run_id: str, name: str) -> str:
    return f"{run_id}@{name}"


_VERSIONS = """
SELECT v.id, v.run_id, v.name, v.ordinal, v.verifiers, v.options, v.finished_at IS NOT NULL,
       (SELECT count(*) FROM rescored s WHERE s.score_version = v.id)
FROM score_versions v WHERE v.run_id = %(run)s ORDER BY v.ordinal
"""


async def versions(conn: Conn, run_id: str) -> list[ScoreVersion]:
    return [ScoreVersion(*row) for row in await (await conn.execute(_VERSIONS, {"run": run_id})).fetchall()]


async def open_version(conn: Conn, run_id: str, name: str | None, verifiers: dict[str, Any],
                       options: dict[str, Any]) -> tuple[ScoreVersion, bool]:
    """The version to write: `name`'s if it exists (resumed: its verifiers and options must be the same), else a
    new one (name default `v<ordinal>`); with no name, the run's latest unfinished version if its verifiers and
    options are these. (version, resumed)."""
    known = await versions(conn, run_id)
    if name is not None:
        same = [v for v in known if v.name == name]
        if same:
            _check_same(same[0], verifiers, options)
            return same[0], True
    else:
        unfinished = [v for v in known if not v.finished]
        if unfinished and (unfinished[-1].verifiers, unfinished[-1].options) == (storable(verifiers),
                                                                                    storable(options)):
            return unfinished[-1], True
    async with conn.transaction():
        # Serialised per run: two rescores started at once get distinct ordinals.
        await conn.execute("SELECT pg_advisory_xact_lock(hashtext('rescore:' || %(run)s))", {"run": run_id})
        row = await (await conn.execute("SELECT coalesce(max(ordinal), 0) + 1 FROM score_versions WHERE run_id = "
                                        "%(run)s", {"run": run_id})).fetchone()
        ordinal = int(row[0])
        chosen = name or f"v{ordinal}"
        await conn.execute(
            "INSERT INTO score_versions (id, run_id, name, ordinal, verifiers, options) VALUES (%(id)s, %(run)s, "
            "%(name)s, %(ordinal)s, %(verifiers)s, %(options)s)",
            {"id": version_id(run_id, chosen), "run": run_id, "name": chosen, "ordinal": ordinal,
             "verifiers": json.dumps(storable(verifiers)), "options": json.dumps(storable(options))})
    return ScoreVersion(version_id(run_id, chosen), run_id, chosen, ordinal, storable(verifiers), storable(options),
                        False, 0), False


def _check_same(version: ScoreVersion, verifiers: dict[str, Any], options: dict[str, Any]) -> None:
    if version.verifiers != storable(verifiers) or version.options != storable(options):
        raise ValueError(f"score version {version.name!r} of run {version.run_id!r} was made with other verifiers "
                         f"or options ({version.verifiers}, {version.options}); resume it with the same ones, or "
                         "give another --name")


# The run's scorable rollouts this version has not scored yet: completed with an episode (a failed rollout has no
# complete episode to verify; it stays failed in every version).
_PENDING = """
SELECT r.id, r.task_id, r.sample_index, r.model, r.head_id FROM rollout_rows r
WHERE r.run_id = %(run)s AND r.status = 'completed' AND r.head_id IS NOT NULL
  AND NOT EXISTS (SELECT 1 FROM rescored s WHERE s.score_version = %(version)s AND s.rollout_id = r.id)
ORDER BY r.id LIMIT %(limit)s
"""


async def pending(conn: Conn, version: str, run_id: str, limit: int = 1000) -> list[tuple[str, str, int, str, int]]:
    return [tuple(row) for row in await (await conn.execute(_PENDING, {"run": run_id, "version": version,
                                                                        "limit": limit})).fetchall()]


async def write_score(conn: Conn, version: str, rollout_id: str, *, reward: float | None, masked: bool,
                      failure_type: str | None, failure_message: str | None, details: dict[str, Any]) -> bool:
    """Store one rescore; False when this version already holds the rollout (a rerun, or a concurrent one)."""
    cur = await conn.execute(
        "INSERT INTO rescored (score_version, rollout_id, reward, masked, failure_type, failure_message, details) "
        "VALUES (%(v)s, %(r)s, %(reward)s, %(masked)s, %(ft)s, %(fm)s, %(details)s) ON CONFLICT DO NOTHING",
        {"v": version, "r": rollout_id, "reward": reward, "masked": masked, "ft": failure_type, "fm": failure_message,
         "details": json.dumps(storable(details))})
    return cur.rowcount == 1


async def finish(conn: Conn, version: str) -> None:
    await conn.execute("UPDATE score_versions SET finished_at = now() WHERE id = %(v)s AND finished_at IS NULL",
                       {"v": version})


async def resolve(conn: Conn, run_id: str, name: str) -> ScoreVersion | None:
    """`name` (a version name, `v<ordinal>`, `latest` = the newest finished) to its version; None for
    `collected` (version 0) or `latest` when no rescore has finished. LookupError for an unknown name."""
    if name == COLLECTED:
        return None
    known = await versions(conn, run_id)
    if name == LATEST:
        finished = [v for v in known if v.finished]
        return finished[-1] if finished else None
    for v in known:
        if v.name == name or f"v{v.ordinal}" == name:
            return v
    names = ", ".join([COLLECTED, LATEST, *(v.name for v in known)])
    raise LookupError(f"run {run_id!r} has no score version {name!r} (it has: {names})")


# The run's rollouts, each with the chosen version's score where it has one (a failed rollout keeps its own):
# substituted for `rollouts` in the report's queries. %(version)s NULL: the collect's own scores.
SCORED_ROLLOUTS = """(
  SELECT r.id, r.run_id, r.task_id, r.sample_index, r.env, r.model, r.status, r.latency_s, r.started_at,
         r.finished_at,
         CASE WHEN s.rollout_id IS NULL THEN r.reward ELSE s.reward END AS reward,
         coalesce(s.masked, r.masked) AS masked,
         CASE WHEN s.rollout_id IS NULL THEN r.failure_type ELSE s.failure_type END AS failure_type,
         CASE WHEN s.rollout_id IS NULL THEN r.failure_message ELSE s.failure_message END AS failure_message
  FROM rollout_rows r LEFT JOIN rescored s ON s.score_version = %(version)s AND s.rollout_id = r.id
  WHERE r.run_id = %(run)s
) AS rollouts"""

# Rewards that differ between two versions (None: the collect's own), with both sides' failure and details.
_FLIPS = """
WITH a AS (SELECT * FROM {a}), b AS (SELECT * FROM {b})
SELECT a.id, a.reward, b.reward, a.masked, b.masked, a.failure_type, b.failure_type, b.failure_message
FROM a JOIN b ON a.id = b.id
WHERE a.reward IS DISTINCT FROM b.reward OR a.masked IS DISTINCT FROM b.masked
ORDER BY a.id LIMIT %(limit)s
"""


def _side(param: str) -> str:
    return SCORED_ROLLOUTS.replace("%(version)s", f"%({param})s").removesuffix(" AS rollouts")


async def flips(conn: Conn, run_id: str, before: str | None, after: str | None, limit: int = 50
                ) -> tuple[int, list[tuple[Any, ...]]]:
    """(how many rollouts changed reward or mask between versions `before` and `after`, the first `limit`)."""
    sql = _FLIPS.format(a=_side("va"), b=_side("vb"))
    params = {"run": run_id, "va": before, "vb": after, "limit": limit}
    rows = [tuple(r) for r in await (await conn.execute(sql, params)).fetchall()]
    count_sql = f"SELECT count(*) FROM ({sql.replace('LIMIT %(limit)s', '')}) AS f"
    total = (await (await conn.execute(count_sql, params)).fetchone())[0]
    return int(total), rows
