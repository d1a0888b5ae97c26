"""`gymflow profile RUN`: the per-task reward profile of a run (NeMo Gym's `gym eval profile`).

Per task: samples, how many were scored (completed with a reward), masked and failed ones (counted, never in a
rate), pass rate, reward mean/std/min/max, pass@k and majority@k; per run the mean of each over the tasks with at
least k scored samples, and the tasks always / never solved (the zero-variance groups GRPO learns nothing from).
SQL aggregates per task; only one short row per task (and at most max(k) outcomes) leaves the database.

majority@k: the pass/fail outcomes of a task's first k scored samples (by sample index); 1 when more than half of
them pass (reward >= threshold), 0 otherwise, so a tie counts as not solved. Environments have no common notion of
an extracted answer, so the vote is over outcomes, not answers.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession

from gymflow.data.datasets import row_to_task
from gymflow.data.prepare import atomic_output
from gymflow.kernel.errors import GymflowError, TaskError
from gymflow.kernel.responses_format import content_to_input
from gymflow.kernel.wire import ChatMessage, SamplingParams, Task
from gymflow.reports.stats import PASS_THRESHOLD, pass_at_k

CATEGORIES = ("mixed", "solved", "unsolved", "unscored")  # solved = every scored sample passed

PER_TASK = sa.text("""
WITH r AS (
  SELECT task_id, sample_index, status, masked, reward,
         status = 'completed' AND NOT masked AND reward IS NOT NULL AS scored
  FROM rollouts WHERE run_id = :run
)
SELECT task_id, count(*) AS samples, count(*) FILTER (WHERE scored) AS scored,
       count(*) FILTER (WHERE masked) AS masked, count(*) FILTER (WHERE status = 'failed') AS failed,
       count(*) FILTER (WHERE status = 'running') AS running,
       count(*) FILTER (WHERE scored AND reward >= :threshold) AS passed,
       avg(reward) FILTER (WHERE scored) AS mean, stddev_pop(reward) FILTER (WHERE scored) AS std,
       min(reward) FILTER (WHERE scored) AS min, max(reward) FILTER (WHERE scored) AS max,
       (array_agg(reward >= :threshold ORDER BY sample_index) FILTER (WHERE scored))[1:(:kmax)] AS outcomes
FROM r GROUP BY task_id ORDER BY task_id
""")

# Readers that split with str.splitlines() would cut a row at these (as gymflow/data/prepare.py escapes them).
_LINE_BREAKS = str.maketrans({"\u2028": "\\u2028", "\u2029": "\\u2029", "\x85": "\\u0085"})

TASK_BODIES = sa.text("SELECT task_id, body FROM tasks WHERE run_id = :run AND task_id = ANY(:ids) ORDER BY task_id")


@dataclass
class TaskProfile:
    task_id: str
    samples: int
    scored: int
    masked: int
    failed: int
    running: int
    passed: int
    mean: float | None
    std: float | None
    min: float | None
    max: float | None
    outcomes: list[bool]  # pass/fail of the first max(k) scored samples, by sample index

    @property
    def pass_rate(self) -> float | None:
        return self.passed / self.scored if self.scored else None

    @property
    def category(self) -> str:
        if not self.scored:
            return "unscored"
        return "solved" if self.passed == self.scored else "unsolved" if self.passed == 0 else "mixed"

    def pass_at(self, k: int) -> float | None:
        """Unbiased pass@k over the scored samples; None when there are fewer than k."""
        return pass_at_k(self.scored, self.passed, k) if self.scored >= k else None

    def majority_at(self, k: int) -> float | None:
        if len(self.outcomes) < k:
            return None
        return 1.0 if 2 * sum(self.outcomes[:k]) > k else 0.0

    def to_json(self, ks: Sequence[int]) -> dict[str, Any]:
        return {"task_id": self.task_id, "samples": self.samples, "scored": self.scored, "masked": self.masked,
                "failed": self.failed, "running": self.running, "passed": self.passed,
                "pass_rate": self.pass_rate, "mean": self.mean, "std": self.std, "min": self.min, "max": self.max,
                "category": self.category, "pass_at_k": {str(k): self.pass_at(k) for k in ks},
                "majority_at_k": {str(k): self.majority_at(k) for k in ks}}


@dataclass(frozen=True)
class AtK:
    k: int
    pass_at_k: float | None  # mean over `tasks`
    majority_at_k: float | None
    tasks: int  # tasks with at least k scored samples


@dataclass
class RunProfile:
    run_id: str
    threshold: float
    ks: list[int]
    tasks: list[TaskProfile]
    summary: list[AtK] = field(init=False)
    notes: list[str] = field(init=False)

    def __post_init__(self) -> None:
        self.summary, self.notes = [], []
        most = max((t.scored for t in self.tasks), default=0)
        for k in self.ks:
            passes = [v for t in self.tasks if (v := t.pass_at(k)) is not None]
            votes = [v for t in self.tasks if (v := t.majority_at(k)) is not None]
            self.summary.append(AtK(k, _mean(passes), _mean(votes), len(passes)))
            if k > most:
                self.notes.append(f"k={k} is more than any task's scored samples (at most {most}): pass@{k} and "
                                  f"majority@{k} are not computed")
            elif len(passes) < sum(1 for t in self.tasks if t.scored):
                short = sum(1 for t in self.tasks if 0 < t.scored < k)
                self.notes.append(f"k={k}: {short} task(s) have fewer than {k} scored samples and are left out of "
                                  f"pass@{k} and majority@{k}")

    def by_category(self, category: str) -> list[str]:
        return [t.task_id for t in self.tasks if t.category == category]

    def totals(self) -> dict[str, int]:
        return {key: sum(getattr(t, key) for t in self.tasks)
                for key in ("samples", "scored", "masked", "failed", "running", "passed")}

    def to_json(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "threshold": self.threshold, "ks": self.ks, "totals": self.totals(),
                "summary": [{"k": s.k, "pass_at_k": s.pass_at_k, "majority_at_k": s.majority_at_k,
                             "tasks": s.tasks} for s in self.summary],
                "categories": {c: self.by_category(c) for c in CATEGORIES}, "notes": self.notes,
                "tasks": [t.to_json(self.ks) for t in self.tasks]}


def _mean(values: Sequence[float]) -> float | None:
    return math.fsum(values) / len(values) if values else None


def _float(value: Any) -> float | None:
    return None if value is None else float(value)


def default_ks(most: int) -> list[int]:
    """1, 2, 4, ... up to the most scored samples of a task, and that number itself."""
    ks, k = [], 1
    while k <= most:
        ks.append(k)
        k *= 2
    return sorted({*ks, most}) if most else [1]


async def load_profile(session: AsyncSession, run_id: str, *, ks: Sequence[int] = (),
                       threshold: float = PASS_THRESHOLD) -> RunProfile | None:
    """The run's profile, or None when the run has no rollouts. Without `ks`, `default_ks`."""
    # Outcomes for majority@k are fetched up to the largest k asked for (or every one for the default ks).
    kmax = max(ks) if ks else 2**31 - 1
    result = await session.execute(PER_TASK, {"run": run_id, "threshold": threshold, "kmax": kmax})
    tasks = [TaskProfile(task_id=r.task_id, samples=r.samples, scored=r.scored, masked=r.masked, failed=r.failed,
                         running=r.running, passed=r.passed, mean=_float(r.mean), std=_float(r.std),
                         min=_float(r.min), max=_float(r.max), outcomes=list(r.outcomes or []))
             for r in result]
    if not tasks:
        return None
    chosen = sorted(set(ks)) if ks else default_ks(max(t.scored for t in tasks))
    return RunProfile(run_id=run_id, threshold=threshold, ks=chosen, tasks=tasks)


# ---- the chosen tasks as dataset rows -------------------------------------------------------------------


def task_to_row(task: Task) -> dict[str, Any]:
    """A dataset row that `load_jsonl` reads back as `task`: a chat `messages` row, or a Responses row when the
    task has sampling settings (only `responses_create_params` carries them). `id` and `env` are always written,
    so the file routes itself."""
    row: dict[str, Any] = {**task.data, "id": task.id, "env": task.env}
    tools = [t.to_openai() for t in task.tools]
    if task.sampling == SamplingParams():
        row["messages"] = [m.model_dump(mode="json", exclude_none=True) for m in task.messages]
        if tools:
            row["tools"] = tools
    else:
        s = task.sampling
        params = {"input": [item for m in task.messages for item in _input_items(m)], "tools": tools,
                  "temperature": s.temperature, "top_p": s.top_p, "max_output_tokens": s.max_tokens, "seed": s.seed}
        row["responses_create_params"] = {k: v for k, v in params.items() if v is not None}
    if task.max_turns is not None:
        row["max_turns"] = task.max_turns
    return row


def _input_items(m: ChatMessage) -> list[dict[str, Any]]:
    # The inverse of responses_format.input_to_messages for what it produces; anything else is caught by the
    # round-trip check in `rows_for_tasks`.
    if m.role == "tool":
        return [{"type": "function_call_output", "call_id": m.tool_call_id, "output": m.text or ""}]
    if m.role == "assistant" and m.tool_calls:
        return [{"type": "function_call", "call_id": c.id, "name": c.function.name, "arguments": c.function.arguments}
                for c in m.tool_calls]
    return [{"type": "message", "role": m.role, "content": content_to_input(m.content)}]


def _loads_back(row: dict[str, Any], task: Task) -> bool:
    """Whether the row loads as `task`. A task whose source row had no `id` or `env` field gains it in `data`
    (the only difference allowed: the file names both so it routes itself)."""
    try:
        loaded = row_to_task(row, env=None, default_id=task.id)
    except TaskError:
        return False
    added = {k: v for k, v in loaded.data.items() if not (k in ("id", "env") and k not in task.data)}
    return loaded.model_copy(update={"data": added}) == task


@dataclass
class TaskRows:
    rows: list[dict[str, Any]]
    missing: list[str]  # chosen tasks the run stored no row for
    not_exact: list[str]  # written, but they do not load back identically (e.g. a `stop` setting)


async def rows_for_tasks(session: AsyncSession, run_id: str, task_ids: Iterable[str]) -> TaskRows:
    """The stored task rows (`tasks` table) of `task_ids` as dataset rows, in task id order."""
    wanted = sorted(set(task_ids))
    found = {r.task_id: r.body for r in await session.execute(TASK_BODIES, {"run": run_id, "ids": wanted})}
    out = TaskRows([], [t for t in wanted if t not in found], [])
    for task_id in wanted:
        if task_id in found:
            task = Task.model_validate(found[task_id])
            row = task_to_row(task)
            out.rows.append(row)
            if not _loads_back(row, task):
                out.not_exact.append(task_id)
    return out


def write_rows(path: str | Path, rows: Sequence[dict[str, Any]]) -> None:
    """The rows as JSONL, all or nothing (never half a file, never a truncated old one)."""
    target = Path(path)
    if target.is_dir():
        raise GymflowError(f"--out-tasks {target}: is a directory")
    if not target.parent.is_dir():
        raise GymflowError(f"--out-tasks {target}: folder {target.parent} does not exist")
    with atomic_output(target) as sink:
        for row in rows:
            sink.write(json.dumps(row, ensure_ascii=False, separators=(",", ":")).translate(_LINE_BREAKS) + "\n")
