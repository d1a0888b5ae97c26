"""Token-exact training records: one rollout's turns joined into one sequence with a loss mask.

Pure functions over `generations` rows, so every rule here is unit-testable without a database; then
`group_records` (and `Group.records`), which reads the rows of groups' rollouts through a client and joins them.

The sequence is prompt(0) + generation(0) + [tokens the environment added] + generation(1) + ... . Turn k's
prompt must start with turn k-1's prompt and generation tokens (the server saw exactly what the policy wrote);
the tokens after that prefix are the environment's (tool results, chat-template glue) and get mask 0. When a
turn's prompt does not start with that prefix the tokens drifted (the conversation was re-tokenised or
re-templated, e.g. a template that strips earlier reasoning): the turn is recorded in `drift_turns` and the
sequence is cut at the last consistent turn. It then holds turns 0..`turns_in_sequence`-1 exactly as the
policy saw and wrote them, never a stitched guess. Rows without token ids (a server without
`return_token_ids`) give a record with `tokens_available = False` and empty sequences.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gymflow.kernel.wire import RolloutSummary

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession

    from gymflow.client import GymflowClient
    from gymflow.training.groups import Group

MAX_TOKEN_ID = 2**31 - 1  # Parquet writes int32-safe ids; anything else is not a token id


@dataclass(frozen=True)
class TurnTokens:
    """One turn's generation row, as much of it as a record needs. Values are as stored (untrusted)."""

    turn: int
    prompt_token_ids: Any = None
    generation_token_ids: Any = None
    generation_log_probs: Any = None
    policy_version: Any = None

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> TurnTokens:
        return cls(turn=int(row["turn"]), prompt_token_ids=row.get("prompt_token_ids"),
                   generation_token_ids=row.get("generation_token_ids"),
                   generation_log_probs=row.get("generation_log_probs"), policy_version=row.get("policy_version"))


@dataclass
class TokenSequence:
    """The joined sequence. `logprobs` is None when any included turn lacks aligned logprobs."""

    input_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] | None = field(default_factory=list)
    policy_versions: list[str | None] = field(default_factory=list)  # one per turn of the rollout
    # One per token of input_ids: the version that sampled it (None for the environment's tokens). Under
    # stale="continue" an episode spans versions; an off-policy loss weighs each token by its own behaviour policy.
    token_versions: list[str | None] = field(default_factory=list)
    turns: int = 0  # turns the rollout had
    turns_in_sequence: int = 0
    drift_turns: list[int] = field(default_factory=list)
    tokens_available: bool = True
    problem: str | None = None  # why tokens are unavailable or the sequence was cut, for the export summary

    @property
    def token_drift(self) -> bool:
        return bool(self.drift_turns)


def _token_ids(value: Any) -> list[int] | None:
    """A list of plausible token ids, or None: a stored value is not trusted to be one."""
    if not isinstance(value, list):
        return None
    for t in value:
        if type(t) is not int or not 0 <= t <= MAX_TOKEN_ID:  # bool is an int subclass: refuse it too
            return None
    return value


def _log_probs(value: Any, n: int) -> list[float] | None:
    """Logprobs aligned one to one with `n` generated tokens, or None (missing, misaligned, not numbers)."""
    if not isinstance(value, list) or len(value) != n:
        return None
    out: list[float] = []
    for v in value:
        if type(v) not in (int, float) or v != v or v > 0:  # NaN or a positive logprob is garbage
            return None
        out.append(float(v))
    return out


def _version(value: Any) -> str | None:
    return value[:200] if isinstance(value, str) else None


def continuity_breaks(turns: Sequence[TurnTokens]) -> list[int]:
    """Turns k > 0 whose prompt does not start with turn k-1's prompt + generation (each pair on its own)."""
    breaks = []
    for prev, cur in zip(turns, turns[1:], strict=False):
        p, g, nxt = (_token_ids(prev.prompt_token_ids), _token_ids(prev.generation_token_ids),
                     _token_ids(cur.prompt_token_ids))
        if p is None or g is None or nxt is None:
            continue  # unavailable, not drift: build_sequence reports it
        head = p + g
        if nxt[:len(head)] != head:
            breaks.append(cur.turn)
    return breaks


def build_sequence(rows: Iterable[TurnTokens | Mapping[str, Any]], turns: int | None = None) -> TokenSequence:
    """Join a rollout's turns (any order) into one masked sequence. `turns` is how many turns the rollout
    finished with: rows at or past it are stale leftovers of an earlier attempt and are ignored."""
    parsed = sorted((r if isinstance(r, TurnTokens) else TurnTokens.from_row(r) for r in rows), key=lambda t: t.turn)
    if turns is not None:
        parsed = [t for t in parsed if 0 <= t.turn < turns]
    n = turns if turns is not None else len(parsed)
    seq = TokenSequence(turns=n, policy_versions=[None] * n)
    for t in parsed:
        if 0 <= t.turn < n:
            seq.policy_versions[t.turn] = _version(t.policy_version)
    if not parsed or [t.turn for t in parsed] != list(range(n)):
        return _unavailable(seq, "no generation rows" if not parsed else "generation rows missing for some turns")
    seq.drift_turns = continuity_breaks(parsed)
    for t in parsed:
        prompt, gen = _token_ids(t.prompt_token_ids), _token_ids(t.generation_token_ids)
        if prompt is None or gen is None:
            if t.turn == 0:
                return _unavailable(seq, "the server returned no token ids (enable return_token_ids)")
            seq.problem = f"turn {t.turn} has no token ids; sequence cut before it"
            break
        if t.turn > 0 and prompt[:len(seq.input_ids)] != seq.input_ids:
            seq.problem = f"token drift at turn {t.turn}; sequence cut before it"
            break
        added = prompt[len(seq.input_ids):]  # the environment's tokens (all of the prompt at turn 0)
        seq.input_ids += added + gen
        seq.loss_mask += [0] * len(added) + [1] * len(gen)
        seq.token_versions += [None] * len(added) + [seq.policy_versions[t.turn]] * len(gen)
        lp = _log_probs(t.generation_log_probs, len(gen))
        if seq.logprobs is not None and lp is not None:
            seq.logprobs += [0.0] * len(added) + lp
        else:
            seq.logprobs = None
        seq.turns_in_sequence += 1
    return seq


def _unavailable(seq: TokenSequence, why: str) -> TokenSequence:
    seq.tokens_available, seq.problem, seq.logprobs = False, why, None
    return seq


@dataclass(frozen=True)
class TrainingRecord:
    """One usable member of a group with its token-exact turns: `turns` are the stored rows of turns
    0..member.turns-1 in order (leftovers of an earlier attempt left out), `sequence` their joined ids, loss
    mask and logprobs. Check `sequence.tokens_available` (and `logprobs is not None`) before training on it."""

    member: RolloutSummary
    turns: tuple[TurnTokens, ...]
    sequence: TokenSequence

    @property
    def rollout_id(self) -> str:
        return self.member.rollout_id

    @property
    def reward(self) -> float:
        return float(self.member.reward or 0.0)

    @property
    def trainable(self) -> bool:
        """Token ids and aligned logprobs for every turn, no drift: the whole rollout as the policy saw it."""
        s = self.sequence
        return s.tokens_available and s.logprobs is not None and not s.token_drift


async def _turn_rows(session: AsyncSession, rollout_ids: list[str]) -> list[dict[str, Any]]:
    import sqlalchemy as sa

    from gymflow.kernel.store.models import Generation, Rollout

    # The accepted chain only: turns at or past the rollout's finished count are an earlier attempt's leftovers.
    result = await session.execute(sa.select(
        Generation.rollout_id, Generation.turn, Generation.prompt_token_ids, Generation.generation_token_ids,
        Generation.generation_log_probs, Generation.policy_version)
        .join(Rollout, Rollout.id == Generation.rollout_id)
        .where(Generation.rollout_id.in_(rollout_ids), Generation.turn < Rollout.turns)
        .order_by(Generation.rollout_id, Generation.turn))
    return [dict(r) for r in result.mappings()]


async def group_records(client: GymflowClient, groups: Sequence[Group]) -> list[list[TrainingRecord]]:
    """For each group (in order), a record per usable member (completed, scored, not masked; in member order),
    read in one transaction. Failed and masked members have no record: `group.failed` lists them."""
    from gymflow.training.groups import usable

    kept = [[m for m in g.members if usable(m)] for g in groups]
    ids = [m.rollout_id for ms in kept for m in ms]
    rows = await client.in_store(lambda s: _turn_rows(s, ids), "reading the groups' generations") if ids else []
    by_rollout: dict[str, list[TurnTokens]] = {}
    for r in rows:
        by_rollout.setdefault(r["rollout_id"], []).append(TurnTokens.from_row(r))
    out: list[list[TrainingRecord]] = []
    for ms in kept:
        records = []
        for m in ms:
            turns = tuple(by_rollout.get(m.rollout_id, ()))
            records.append(TrainingRecord(m, turns, build_sequence(turns, m.turns)))
        out.append(records)
    return out
