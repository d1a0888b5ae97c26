"""A recorded model backend: replays the model outputs of a NeMo Gym rollout file turn by turn.

The episode still runs through our workflow, tools and verifier; only the model's words are recorded.
Rows are keyed by the task ids `load_jsonl` gives the same file, so a rollout file works as the dataset
and as the model at once. A task with several recorded samples (NeMo Gym's `_ng_rollout_index`) replays its
k-th recorded sample, in index order, as sample k. Recorded judge answers (`judge_evaluations`) are replayed
the same way.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any

from gymflow.kernel.errors import GymflowError
from gymflow.kernel.failures import RECORDING_EXHAUSTED
from gymflow.kernel.recorded_ids import default_task_id, recorded_sample
from gymflow.kernel.wire import ChatMessage, FunctionCall, ToolCall


def _output_text(item: dict[str, Any]) -> str:
    return "".join(p.get("text", "") for p in item.get("content") or [] if isinstance(p, dict))


def split_turns(output: Sequence[dict[str, Any]]) -> list[ChatMessage]:
    """Responses `output` items -> one assistant message per model turn (a turn ends at tool outputs, and at a
    user message: a gymnasium environment's observation)."""
    turns: list[ChatMessage] = []
    text: list[str] = []
    reasoning: list[str] = []
    calls: list[ToolCall] = []

    def close() -> None:
        if text or calls or reasoning:
            turns.append(ChatMessage(role="assistant", content="".join(text) if text else None,
                                     tool_calls=tuple(calls) or None,
                                     reasoning_content="\n".join(reasoning) if reasoning else None))
        text.clear(), reasoning.clear(), calls.clear()

    for item in output:
        kind = item.get("type")
        if kind == "function_call_output":
            if calls:
                close()
        elif kind == "function_call":
            calls.append(ToolCall(id=item.get("call_id") or item.get("id") or f"call_{len(calls)}",
                                  function=FunctionCall(name=item["name"], arguments=item.get("arguments", ""))))
        elif kind == "message" and item.get("role", "assistant") != "assistant":
            close()  # the environment's observation (NeMo Gym's gymnasium agent records it): the model's turn ended
        elif kind == "message":
            text.append(_output_text(item))
        elif kind == "reasoning":
            reasoning.extend(s.get("text", "") for s in item.get("summary") or [] if isinstance(s, dict))
    close()
    return turns


def _judge_answers(row: dict[str, Any]) -> list[str]:
    answers = []
    for ev in row.get("judge_evaluations") or []:
        out = (ev.get("response") or {}).get("output") or []
        answers.append("".join(_output_text(i) for i in out if i.get("type") == "message"))
    return answers


class RecordedRollouts:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        found: dict[str, list[tuple[int, dict[str, Any]]]] = {}
        with self.path.open(encoding="utf-8") as f:
            for lineno, line in enumerate(f, start=1):
                if line.strip():
                    row = json.loads(line)
                    task_id = str(row.get("id", default_task_id(self.path.stem, lineno, row)))
                    found.setdefault(task_id, []).append((recorded_sample(row) or 0, row))
        # Sample k of a task: its k-th recorded rollout by sample index (sort is stable: file order for ties).
        self._rows = {task_id: [row for _, row in sorted(rows, key=lambda r: r[0])] for task_id, rows in found.items()}

    def _row(self, task_id: str, sample: int = 0) -> dict[str, Any]:
        rows = self._rows.get(task_id)
        if rows is None:
            raise GymflowError(f"{self.path}: no recorded rollout for task {task_id!r}",
                               failure_type=RECORDING_EXHAUSTED)
        if sample >= len(rows):
            raise GymflowError(f"{self.path}: task {task_id!r} has {len(rows)} recorded sample(s), asked for sample "
                               f"{sample}", failure_type=RECORDING_EXHAUSTED)
        return rows[sample]

    def turn(self, task_id: str, turn: int, sample: int = 0) -> ChatMessage:
        turns = split_turns(self._row(task_id, sample).get("response", {}).get("output") or [])
        if turn >= len(turns):
            raise GymflowError(f"{self.path}: task {task_id!r} has {len(turns)} recorded turns, asked for turn "
                               f"{turn + 1}", failure_type=RECORDING_EXHAUSTED)
        return turns[turn]

    def judge(self, task_id: str, sample: int = 0) -> RecordedJudge:
        return RecordedJudge(_judge_answers(self._row(task_id, sample)))


class RecordedJudge:
    """A judge `chat` function that answers with the recorded verdicts, in the order they were given."""

    def __init__(self, answers: list[str]) -> None:
        self._answers = list(answers)

    async def __call__(self, model: str, messages: Sequence[ChatMessage]) -> str:
        if not self._answers:
            raise GymflowError("the recording holds no further judge answers", failure_type=RECORDING_EXHAUSTED)
        return self._answers.pop(0)


@cache
def recorded(path: str) -> RecordedRollouts:
    return RecordedRollouts(path)
