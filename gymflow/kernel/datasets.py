"""Load JSONL datasets (NeMo Gym rows or chat rows) into wire `Task`s, reporting bad lines by file and line."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from gymflow.kernel.errors import TaskError
from gymflow.kernel.responses_format import input_to_messages, sampling_from, tool_to_spec
from gymflow.kernel.wire import ChatMessage, Task

_NOT_VERIFIER_DATA = {"responses_create_params", "agent_ref", "messages", "tools"}


@dataclass(frozen=True)
class DatasetError:
    path: str
    line: int
    message: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.message}"


def row_to_task(row: Any, *, env: str | None, default_id: str) -> Task:
    """`env` routes every row when given; otherwise each row names its own in an `env` field."""
    if not isinstance(row, dict):
        raise TaskError("row must be a JSON object")
    if "responses_create_params" in row:
        params = row["responses_create_params"]
        if not isinstance(params, dict):
            raise TaskError("responses_create_params: expected an object")
        if "input" not in params:
            raise TaskError("responses_create_params.input: required")
        messages = input_to_messages(params["input"])
        raw_tools = params.get("tools") or []
        where = "responses_create_params.tools"
        sampling = sampling_from(params)
    elif "messages" in row:
        try:
            messages = [ChatMessage.model_validate(m) for m in row["messages"]]
        except (ValidationError, TypeError) as e:
            raise TaskError(f"messages: {e}") from None
        raw_tools, where, sampling = row.get("tools") or [], "tools", sampling_from({})
    else:
        raise TaskError("responses_create_params: required (or a chat `messages` list)")
    if not isinstance(raw_tools, list):
        raise TaskError(f"{where}: expected a list")
    tools = [tool_to_spec(t, f"{where}[{i}]") for i, t in enumerate(raw_tools)]
    task_id = str(row.get("id", default_id))
    if "/" in task_id:
        raise TaskError(f"id: {task_id!r} must not contain '/' (it is part of the workflow id)")
    row_env = env or row.get("env")
    if not isinstance(row_env, str) or not row_env:
        raise TaskError("env: required (route the row with an `env` field, or choose one with --env)")
    data = {k: v for k, v in row.items() if k not in _NOT_VERIFIER_DATA}
    return Task(id=task_id, env=row_env, messages=tuple(messages), tools=tuple(tools), sampling=sampling,
                data=data)


def load_jsonl(path: str | Path, *, env: str | None) -> tuple[list[Task], list[DatasetError]]:
    """Parse every line; bad lines become `DatasetError`s (file, line, field) and the rest still load."""
    p = Path(path)
    tasks: list[Task] = []
    errors: list[DatasetError] = []
    seen: dict[str, int] = {}
    with p.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                task = row_to_task(row, env=env, default_id=f"{p.stem}-{lineno}")
            except json.JSONDecodeError as e:
                errors.append(DatasetError(str(p), lineno, f"invalid JSON: {e.msg} at column {e.colno}"))
                continue
            except TaskError as e:
                errors.append(DatasetError(str(p), lineno, str(e)))
                continue
            if task.id in seen:
                errors.append(DatasetError(str(p), lineno, f"id: {task.id!r} repeats line {seen[task.id]}"))
                continue
            seen[task.id] = lineno
            tasks.append(task)
    return tasks, errors
