"""Policy versions in the store: the trainer declares which policy is current per model; generation stamps every turn.

A version is free text (a checkpoint name, an endpoint, a weights tag). Each declaration gets the next ordinal
for its model (1, 2, ...); the highest is current. Staleness of a turn = current ordinal - the turn's ordinal.
Declaring the version that is already current is a no-op, so a restarted trainer does not age every rollout.

Generation reads the current version through `PolicyCache` (at most ~0.5 s old, one query per model per
interval per process). A model server that reports its own `policy_version` in the completion wins: it knows
exactly which weights answered; its ordinal is the latest declaration of that text (0 when never declared).
The trainer's calls (through a client) are in gymflow/training/policy.py.
"""

from __future__ import annotations

import time
import unicodedata
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession

from gymflow.kernel.store.models import Generation, PolicyVersion, Rollout
from gymflow.kernel.store.repo import Conn, driver

MAX_VERSION_CHARS = 200
CACHE_TTL_S = 0.5
NO_VERSION_ORDINAL = 0  # a turn generated before any declaration, or under a version never declared


@dataclass(frozen=True)
class Current:
    model: str
    version: str
    ordinal: int


def version_problem(version: object) -> str | None:
    """Why `version` cannot be a policy version (stored as text, shown in reports), or None."""
    if not isinstance(version, str):
        return f"policy version: must be a string, got {type(version).__name__}"
    if not version.strip():
        return "policy version: empty"
    if len(version) > MAX_VERSION_CHARS:
        return f"policy version: {len(version):,} characters; at most {MAX_VERSION_CHARS}"
    bad = next((ch for ch in version if unicodedata.category(ch) in ("Cc", "Cs", "Zl", "Zp")), None)
    if bad is not None:
        return f"policy version {version[:40]!r}: control character U+{ord(bad):04X}"
    return None


_CURRENT = "SELECT version, ordinal FROM policy_versions WHERE model = %s ORDER BY ordinal DESC LIMIT 1"
_ORDINAL = "SELECT max(ordinal) FROM policy_versions WHERE model = %s AND version = %s"


async def _conn(db: AsyncSession | Conn) -> Conn:
    """psycopg for these reads: generation's are on the episode's own connections (kernel/store/direct.py), a
    trainer's inside its session's transaction."""
    return await driver(db) if isinstance(db, AsyncSession) else db


async def current_version(db: AsyncSession | Conn, model: str) -> Current | None:
    row = await (await (await _conn(db)).execute(_CURRENT, (model,))).fetchone()
    return Current(model, row[0], row[1]) if row else None


async def ordinal_of(db: AsyncSession | Conn, model: str, version: str) -> int:
    """The latest ordinal declared for `version` of `model`; NO_VERSION_ORDINAL when never declared."""
    row = await (await (await _conn(db)).execute(_ORDINAL, (model, version))).fetchone()
    return int(row[0]) if row and row[0] is not None else NO_VERSION_ORDINAL


async def set_policy_version(session: AsyncSession, model: str, version: str) -> Current:
    """Declare `version` current for `model` (inside the caller's transaction); returns it with its ordinal."""
    if problem := version_problem(version):
        raise ValueError(problem)
    if not isinstance(model, str) or not model.strip():
        raise ValueError(f"policy version: model must be a non-empty string, got {model!r}")
    # Serialise declarations per model, so ordinals never collide or skip.
    await session.execute(sa.select(sa.func.pg_advisory_xact_lock(sa.func.hashtext("policy:" + model))))
    now = await current_version(session, model)
    if now is not None and now.version == version:
        return now
    ordinal = (now.ordinal if now else 0) + 1
    session.add(PolicyVersion(model=model, ordinal=ordinal, version=version))
    await session.flush()
    return Current(model, version, ordinal)


def reported_version(resp: Any) -> str | None:
    """The completion's own top-level `policy_version` (the local model server sends one), if usable.

    The reply is the model server's: any type, any size. Only a short clean string (or an integer) counts."""
    value = getattr(resp, "policy_version", None)
    extra = getattr(resp, "model_extra", None)
    if value is None and isinstance(extra, dict):  # an openai response object keeps unknown fields here
        value = extra.get("policy_version")
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    return value if isinstance(value, str) and version_problem(value) is None else None


Reader = Callable[[Callable[[Conn], Awaitable[Any]]], Awaitable[Any]]


class PolicyCache:
    """Per-process view of the current versions, at most `ttl_s` old: generation asks on every turn."""

    def __init__(self, ttl_s: float = CACHE_TTL_S) -> None:
        self.ttl_s = ttl_s
        self._current: dict[str, tuple[float, Current | None]] = {}
        self._ordinals: dict[tuple[str, str], tuple[float, int]] = {}

    async def current(self, model: str, read: Reader) -> Current | None:
        hit = self._current.get(model)
        if hit and time.monotonic() - hit[0] < self.ttl_s:
            return hit[1]
        value = await read(lambda s: current_version(s, model))
        self._current[model] = (time.monotonic(), value)
        return value

    async def turn_meta(self, model: str, read: Reader, now: Current | None, reported: str | None
                        ) -> dict[str, Any]:
        """`policy_version` and `policy_ordinal` for a turn's stored metadata: `now` is what was current when
        the request went out, `reported` what the server said answered (it wins)."""
        if reported is None or (now is not None and reported == now.version):
            return {"policy_version": now.version if now else None,
                    "policy_ordinal": now.ordinal if now else NO_VERSION_ORDINAL}
        key = (model, reported)
        hit = self._ordinals.get(key)
        if not (hit and time.monotonic() - hit[0] < self.ttl_s):
            hit = (time.monotonic(), await read(lambda s: ordinal_of(s, model, reported)))
            self._ordinals[key] = hit
            if len(self._ordinals) > 1024:  # a server inventing a version per reply must not grow this
                self._ordinals.clear()
        return {"policy_version": reported, "policy_ordinal": hit[1]}


async def oldest_ordinals(session: AsyncSession, rollout_ids: Sequence[str]) -> dict[str, int]:
    """Per finished rollout, the ordinal of its oldest turn (from `generations`, the accepted chain only).

    A turn without a version, or with one never declared for its model, counts as NO_VERSION_ORDINAL (stale
    against any declared version). Rollouts without turns are absent."""
    ordinal = (sa.select(sa.func.max(PolicyVersion.ordinal))
               .where(PolicyVersion.model == Rollout.model, PolicyVersion.version == Generation.policy_version)
               .correlate(Rollout, Generation).scalar_subquery())
    rows = await session.execute(
        sa.select(Generation.rollout_id, sa.func.min(sa.func.coalesce(ordinal, NO_VERSION_ORDINAL)))
        .join(Rollout, Rollout.id == Generation.rollout_id)
        .where(Generation.rollout_id.in_(list(rollout_ids)), Generation.turn < Rollout.turns)  # no leftovers
        .group_by(Generation.rollout_id))
    return {rid: int(o) for rid, o in rows}
