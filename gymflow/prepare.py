"""Data prep: validate a JSONL dataset against an environment's task type, write the rows that pass with
their environment routing, and describe them (counts, per-field statistics)."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from environments.registry import get_environment
from gymflow.kernel.datasets import DatasetError, row_to_task
from gymflow.kernel.errors import TaskError


@dataclass
class FieldStats:
    present: int = 0
    types: Counter[str] = field(default_factory=Counter)
    sizes: list[float] = field(default_factory=list)  # string/list length, or the number itself

    def add(self, value: Any) -> None:
        self.present += 1
        self.types[type(value).__name__] += 1
        if isinstance(value, bool):
            return
        if isinstance(value, (int, float)):
            self.sizes.append(float(value))
        elif isinstance(value, (str, list, dict)):
            self.sizes.append(float(len(value)))


@dataclass
class PrepareReport:
    total: int = 0
    written: int = 0
    errors: list[DatasetError] = field(default_factory=list)
    fields: dict[str, FieldStats] = field(default_factory=lambda: defaultdict(FieldStats))
    turns: list[int] = field(default_factory=list)
    tools: list[int] = field(default_factory=list)


def prepare(path: str | Path, env_name: str, out: str | Path) -> PrepareReport:
    env = get_environment(env_name)
    src, report = Path(path), PrepareReport()
    with src.open(encoding="utf-8") as f, Path(out).open("w", encoding="utf-8") as sink:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            report.total += 1
            try:
                row = json.loads(line)
                task = row_to_task(row, env=env_name, default_id=f"{src.stem}-{lineno}")
                env.parse_task(task)
            except json.JSONDecodeError as e:
                report.errors.append(DatasetError(str(src), lineno, f"invalid JSON: {e.msg} at column {e.colno}"))
                continue
            except TaskError as e:
                report.errors.append(DatasetError(str(src), lineno, str(e)))
                continue
            routed = {**row, "env": env_name}
            sink.write(json.dumps(routed, ensure_ascii=False) + "\n")
            report.written += 1
            for key, value in row.items():
                report.fields[key].add(value)
            report.turns.append(len(task.messages))
            report.tools.append(len(task.tools))
    return report


def conversation_key(inp: Any) -> str:
    """The prompt as (role, content) pairs: rollout rows add item fields (`type`) that tasks lack."""
    if isinstance(inp, str):
        return inp
    return json.dumps([(m.get("role"), m.get("content")) for m in inp if isinstance(m, dict)], ensure_ascii=False)


def join_rollouts(rollouts: str | Path, tasks: str | Path, out: str | Path) -> tuple[int, list[int]]:
    """Give each recorded rollout row the verifier fields of its task (NeMo Gym rollout files omit some,
    e.g. `exp_cal_state`), matched by conversation. Returns (rows written, rollout lines with no task)."""
    index: dict[str, dict[str, Any]] = {}
    for line in Path(tasks).read_text(encoding="utf-8").splitlines():
        if line.strip():
            row = json.loads(line)
            index[conversation_key(row["responses_create_params"]["input"])] = row
    written, unmatched = 0, []
    with Path(out).open("w", encoding="utf-8") as sink:
        for lineno, line in enumerate(Path(rollouts).read_text(encoding="utf-8").splitlines(), start=1):
            if not line.strip():
                continue
            row = json.loads(line)
            task = index.get(conversation_key(row["responses_create_params"]["input"]))
            if task is None:
                unmatched.append(lineno)
            merged = {**(task or {}), **row}  # the recording wins where both have a field
            sink.write(json.dumps(merged, ensure_ascii=False) + "\n")
            written += 1
    return written, unmatched
