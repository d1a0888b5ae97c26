"""`gymflow export`: stream one run's rollouts from Postgres into an RL, SFT or DPO file.

Rows come through a server-side cursor (`stream` + `yield_per`) and leave through RowWriter's batches, so
memory does not grow with the run. Only completed, unmasked rollouts are used unless asked otherwise; what
was left out, and why, is counted in the summary.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession

from gymflow.kernel.store.models import Generation, Rollout, Run, TaskRow
from gymflow.training.groups import epoch_of
from gymflow.training.records import TurnTokens, build_sequence
from gymflow.training.rows import SCHEMAS, dpo_row, rl_row, sft_row
from gymflow.training.writer import RowWriter, check_out_path

if TYPE_CHECKING:
    from gymflow.client import GymflowClient

FORMATS = tuple(SCHEMAS)
SFT_DEFAULT_MIN_REWARD = 1.0
YIELD_PER = 200  # rows per cursor fetch; an RL row per turn can hold tens of thousands of token ids

_ROLLOUT_COLS = (Rollout.id, Rollout.run_id, Rollout.task_id, Rollout.sample_index, Rollout.reward, Rollout.masked)
_TURN_COLS = (Generation.turn, Generation.prompt_token_ids, Generation.generation_token_ids,
              Generation.generation_log_probs, Generation.policy_version)


@dataclass
class ExportSummary:
    fmt: str
    out: Path
    rows: int = 0
    excluded: Counter[str] = field(default_factory=Counter)  # reason -> rollouts (groups for dpo ties)
    flagged: Counter[str] = field(default_factory=Counter)  # written, but marked (token drift)

    def line(self) -> str:
        what = "pairs" if self.fmt == "dpo" else "rows"
        parts = [f"exported {self.rows} {self.fmt} {what} to {self.out}"]
        if self.excluded:
            parts.append("left out: " + ", ".join(f"{n} {why}" for why, n in sorted(self.excluded.items())))
        if self.flagged:
            parts.append("written but flagged: " + ", ".join(f"{n} {why}" for why, n in sorted(self.flagged.items())))
        return "; ".join(parts)


def _eligible(run_id: str, fmt: str, min_reward: float | None, include_masked: bool) -> list[sa.ColumnElement]:
    where = [Rollout.run_id == run_id, Rollout.status == "completed"]
    if not include_masked or fmt == "dpo":
        where.append(Rollout.masked.is_(False))
    if fmt == "dpo":
        where.append(Rollout.reward.is_not(None))
    if min_reward is not None:
        where.append(Rollout.reward >= min_reward)
    return where


async def _count_excluded(session: AsyncSession, summary: ExportSummary, run_id: str, min_reward: float | None,
                          include_masked: bool) -> int:
    """Count the run's rollouts by why they are left out, in one aggregate query; returns the run's total."""
    reason = sa.case(
        (Rollout.status == "failed", "failed"),
        (Rollout.status != "completed", "unfinished"),
        (sa.and_(Rollout.masked.is_(True), sa.literal(not include_masked or summary.fmt == "dpo")), "masked"),
        (sa.and_(Rollout.reward.is_(None), sa.literal(summary.fmt == "dpo")), "without reward"),
        (sa.and_(sa.literal(min_reward is not None), sa.func.coalesce(Rollout.reward, -1e308) < (min_reward or 0)),
         f"below min reward {min_reward}"),
        else_="",
    )
    rows = (await session.execute(sa.select(reason, sa.func.count()).where(Rollout.run_id == run_id)
                                  .group_by(reason))).all()
    for why, n in rows:
        if why:
            summary.excluded[why] += n
    return sum(n for _, n in rows)


async def _rl_rows(session: AsyncSession, where: list[sa.ColumnElement], summary: ExportSummary,
                   per_task: int | None) -> AsyncIterator[dict[str, Any]]:
    # One row per (rollout, turn), in order, so one rollout's turns arrive together; stale turns of an earlier
    # attempt (turn >= turns) are not joined.
    stmt = (sa.select(*_ROLLOUT_COLS, Rollout.turns, *_TURN_COLS)
            .outerjoin(Generation, sa.and_(Generation.rollout_id == Rollout.id, Generation.turn < Rollout.turns))
            .where(*where).order_by(Rollout.id, Generation.turn).execution_options(yield_per=YIELD_PER))
    current: Mapping[str, Any] | None = None
    turns: list[TurnTokens] = []
    result = await session.stream(stmt)
    async for row in result.mappings():
        if current is None or row["id"] != current["id"]:
            if current is not None:
                out = _rl_record(current, turns, summary, per_task)
                if out is not None:
                    yield out
            current, turns = dict(row), []
        if row["turn"] is not None:
            turns.append(TurnTokens.from_row(row))
    if current is not None:
        out = _rl_record(current, turns, summary, per_task)
        if out is not None:
            yield out


def _rl_record(r: Mapping[str, Any], turns: list[TurnTokens], summary: ExportSummary, per_task: int | None
               ) -> dict[str, Any] | None:
    seq = build_sequence(turns, r["turns"])
    if not seq.tokens_available:
        summary.excluded["without token ids"] += 1
        return None
    if seq.token_drift:
        summary.flagged["with token drift (sequence cut at the last consistent turn)"] += 1
    return rl_row(r, seq, per_task)


async def _sft_rows(session: AsyncSession, where: list[sa.ColumnElement], per_task: int | None
                    ) -> AsyncIterator[dict[str, Any]]:
    # The task's tool schemas ride along (TRL's `tools` column); a run collected without stored tasks has none.
    stmt = (sa.select(*_ROLLOUT_COLS, Rollout.transcript, TaskRow.tools)
            .outerjoin(TaskRow, sa.and_(TaskRow.run_id == Rollout.run_id, TaskRow.task_id == Rollout.task_id))
            .where(*where).order_by(Rollout.id).execution_options(yield_per=YIELD_PER))
    result = await session.stream(stmt)
    async for row in result.mappings():
        yield sft_row(row, per_task)


async def _dpo_rows(session: AsyncSession, where: list[sa.ColumnElement], summary: ExportSummary,
                    per_task: int | None) -> AsyncIterator[dict[str, Any]]:
    # One pair per group (a task's samples in one epoch: the iterator's epochs are different policies), best
    # first within it: the group's first row is `chosen`, its last `rejected`. Only those two transcripts are
    # held at a time.
    epoch = Rollout.sample_index // per_task if per_task else sa.literal(0)
    stmt = (sa.select(*_ROLLOUT_COLS, Rollout.transcript).where(*where)
            .order_by(Rollout.task_id, epoch, Rollout.reward.desc(), Rollout.sample_index)
            .execution_options(yield_per=YIELD_PER))
    best: Mapping[str, Any] | None = None
    worst: Mapping[str, Any] | None = None

    def key(r: Mapping[str, Any]) -> tuple[str, int]:
        return r["task_id"], epoch_of(r["sample_index"], per_task)

    result = await session.stream(stmt)
    async for row in result.mappings():
        if best is not None and key(row) != key(best):
            pair = _pair(best, worst, summary, per_task)
            if pair is not None:
                yield pair
            best = None
        if best is None:
            best, worst = dict(row), None
        else:
            worst = dict(row)
    if best is not None:
        pair = _pair(best, worst, summary, per_task)
        if pair is not None:
            yield pair


def _pair(best: Mapping[str, Any], worst: Mapping[str, Any] | None, summary: ExportSummary, per_task: int | None
          ) -> dict[str, Any] | None:
    if worst is None:
        summary.excluded["groups with one scored sample"] += 1
        return None
    if best["reward"] == worst["reward"]:
        summary.excluded["groups tied (highest = lowest reward)"] += 1
        return None
    row = dpo_row(best, worst, per_task)
    if row is None:
        summary.excluded["groups whose samples had different prompts"] += 1
    return row


async def export_run(session: AsyncSession, run_id: str, fmt: str, out: Path, *, min_reward: float | None = None,
                     include_masked: bool = False, batch_rows: int | None = None) -> ExportSummary:
    """Write run `run_id` as `fmt` (rl, sft, dpo) to `out` (.parquet or .jsonl). Raises ValueError on bad
    arguments or an unknown run, before any file is created."""
    if fmt not in FORMATS:
        raise ValueError(f"--format {fmt!r}: must be one of {', '.join(FORMATS)}")
    if fmt == "dpo" and (min_reward is not None or include_masked):
        raise ValueError("--min-reward and --include-masked do not apply to dpo: pairs are ranked by reward, "
                         "and a masked rollout has none")
    if fmt == "sft" and min_reward is None:
        min_reward = SFT_DEFAULT_MIN_REWARD
    check_out_path(out)
    summary = ExportSummary(fmt=fmt, out=out)
    if not await _count_excluded(session, summary, run_id, min_reward, include_masked):
        raise ValueError(f"run {run_id!r} has no rollouts")
    where = _eligible(run_id, fmt, min_reward, include_masked)
    # Samples per task, when the run recorded it (`gymflow collect`, the trainer iterator): sample index e*n + i
    # is epoch e, and groups are per epoch.
    per_task = (await session.execute(sa.select(Run.samples_per_task).where(Run.id == run_id))).scalar()
    rows = (_rl_rows(session, where, summary, per_task) if fmt == "rl" else
            _sft_rows(session, where, per_task) if fmt == "sft" else _dpo_rows(session, where, summary, per_task))
    kw = {"batch_rows": batch_rows} if batch_rows else {}
    with RowWriter(out, SCHEMAS[fmt], **kw) as writer:
        async for row in rows:
            writer.write(row)
    summary.rows = writer.rows
    return summary


async def export(client: GymflowClient, run_id: str, fmt: str, out: str | Path, *, min_reward: float | None = None,
                 include_masked: bool = False) -> ExportSummary:
    """`export_run` through a client (what `gymflow export` does): `fmt` is rl, sft or dpo; `out` a .parquet or
    .jsonl path. Raises ValueError on bad arguments or an unknown run."""
    return await client.in_store(lambda s: export_run(s, run_id, fmt, Path(out), min_reward=min_reward,
                                                      include_masked=include_masked), f"exporting run {run_id!r}")
