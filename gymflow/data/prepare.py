"""Data prep: validate a JSONL dataset against an environment's task type, write the rows that pass with
their environment routing, and describe them (counts, per-field statistics)."""

from __future__ import annotations

import json
import os
import stat
import tempfile
from collections import Counter, defaultdict
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from gymflow.data.datasets import DatasetError, ErrorLog, check_value, duplicate, iter_tasks, read_rows
from gymflow.data.routing import route_problem
from gymflow.environments.registry import get_environment
from gymflow.kernel.errors import GymflowError, TaskError
from gymflow.kernel.recorded_ids import NG_ROLLOUT_INDEX, NG_TASK_INDEX


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
    total: int = 0  # non-blank lines
    written: int = 0
    invalid: int = 0  # bad lines (all of them, though `errors` lists at most MAX_REPORTED_ERRORS)
    errors: list[DatasetError] = field(default_factory=list)
    fields: dict[str, FieldStats] = field(default_factory=lambda: defaultdict(FieldStats))
    turns: list[int] = field(default_factory=list)
    tools: list[int] = field(default_factory=list)


@dataclass
class JoinReport:
    written: int = 0
    unmatched: list[int] = field(default_factory=list)  # rollout lines with no task
    errors: list[DatasetError] = field(default_factory=list)  # bad lines of either file, skipped
    bad_lines: int = 0
    # Rollout files concatenated from several collections repeat a (task, sample) or reuse an id for another
    # prompt: such lines are renumbered or given their own id (line numbers here), never refused as duplicates.
    renumbered: list[int] = field(default_factory=list)
    renamed: list[int] = field(default_factory=list)


def refuse_to_overwrite(inputs: list[Path], out: Path) -> None:
    """Writing onto an input would destroy it (the old `--out X` on X truncated X to 0 bytes)."""
    for src in inputs:
        if out.exists() and src.exists() and os.path.samefile(src, out):
            raise GymflowError(f"{out} is the input file {src}: writing there would destroy it; "
                               "choose another output path")


@contextmanager
def atomic_output(target: Path) -> Iterator[IO[str]]:
    """The whole file or nothing: write a temporary file beside `target`, rename it over `target` at the end
    (atomic on one file system), so a crash or an error never leaves half a file or a truncated old one."""
    mode = stat.S_IMODE(target.stat().st_mode) if target.is_file() else 0o644
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as sink:
            yield sink
            sink.flush()
            os.fsync(sink.fileno())
        os.chmod(tmp, mode)  # mkstemp makes it private
        os.replace(tmp, target)
    except BaseException:
        with suppress(OSError):
            os.unlink(tmp)
        raise


_LINE_BREAKS = str.maketrans({"\u2028": "\\u2028", "\u2029": "\\u2029", "\x85": "\\u0085"})


def _line(row: dict[str, Any]) -> str:
    # Compact, so an output row is no larger than the line it came from (give or take the routing and
    # escapes) and still passes the size limits when the file is loaded. Unicode line breaks are escaped: readers that
    # split with str.splitlines() would cut the row in two.
    return json.dumps(row, ensure_ascii=False, separators=(",", ":")).translate(_LINE_BREAKS) + "\n"


def prepare(path: str | Path, env_name: str, out: str | Path) -> PrepareReport:
    """Check every row of `path` against `env_name`'s task type; write the good ones, routed, to `out`."""
    get_environment(env_name)  # an unknown name fails here, before anything is written
    src, target, report = Path(path), Path(out), PrepareReport()
    refuse_to_overwrite([src], target)
    errors = ErrorLog(str(src))
    seen: dict[str, int] = {}
    with atomic_output(target) as sink:
        for row, task in iter_tasks(src, env=env_name, errors=errors):
            problem = duplicate(seen, task.id, row.line)
            if problem is None:  # the environment's own check, and whether another environment fits it better
                problem = route_problem(env_name, task, row=row.value)
            if problem is not None:
                errors.add(DatasetError(str(src), row.line, problem))
                continue
            sink.write(_line({**row.value, "env": env_name}))
            report.written += 1
            for key, value in row.value.items():
                report.fields[key].add(value)
            report.turns.append(len(task.messages))
            report.tools.append(len(task.tools))
    report.errors, report.invalid = errors.errors, errors.bad_lines
    report.total = report.written + errors.bad_lines
    return report


def conversation_key(inp: Any) -> str:
    """The prompt as (role, content) pairs: rollout rows add item fields (`type`) that tasks lack."""
    if isinstance(inp, str):
        return inp
    # sort_keys: content parts are objects whose key order differs between task and rollout files.
    return json.dumps([(m.get("role"), m.get("content")) for m in inp if isinstance(m, dict)], ensure_ascii=False,
                      sort_keys=True)


def _conversation(value: Any) -> str:
    """The row's conversation key; TaskError naming the field when the row has none."""
    if not isinstance(value, dict):
        raise TaskError("row: expected a JSON object")
    if problem := check_value(value):
        raise TaskError(problem)
    params = value.get("responses_create_params")
    if not isinstance(params, dict):
        raise TaskError("responses_create_params: required (an object)")
    inp = params.get("input")
    if not isinstance(inp, (str, list)) or not inp:
        raise TaskError("responses_create_params.input: required (a non-empty string or list)")
    return conversation_key(inp)


def _keyed_rows(path: Path, errors: ErrorLog) -> Iterator[tuple[int, str, dict[str, Any]]]:
    for row in read_rows(path, errors):
        try:
            yield row.line, _conversation(row.value), row.value
        except TaskError as e:
            errors.add(DatasetError(str(path), row.line, str(e)))


def join(rollouts: str | Path, tasks: str | Path | None, out: str | Path) -> JoinReport:
    """Make a NeMo Gym rollout file replayable: give each recorded rollout row the verifier fields of its task
    (rollout files omit some, e.g. `exp_cal_state`), matched by conversation, and the fields our replay needs
    that NeMo Gym keeps elsewhere (`_replay_fields`). The samples of one task share its id or task index and are
    numbered (`_ng_rollout_index`), so they load as one task's recorded samples, not as duplicates. Without
    `tasks`, rows keep only what they recorded. Bad lines of either file are reported and skipped."""
    rollouts, target = Path(rollouts), Path(out)
    task_file = Path(tasks) if tasks is not None else None
    refuse_to_overwrite([rollouts, *([task_file] if task_file else [])], target)
    task_errors = ErrorLog(str(task_file)) if task_file else None
    rollout_errors, report = ErrorLog(str(rollouts)), JoinReport()
    # conversation -> (the task's index in its file, the task row): NeMo Gym's `_ng_task_index` is that index.
    index: dict[str, tuple[int, dict[str, Any]]] = {}
    at: dict[int, tuple[str, dict[str, Any]]] = {}  # every task by its index: tasks may share a prompt (a seed apart)
    if task_file is not None and task_errors is not None:
        at = {line - 1: (key, row) for line, key, row in _keyed_rows(task_file, task_errors)}  # errors reported
        index = {key: (position, row) for position, (key, row) in at.items()}
    after_tasks = max((position for position, _ in index.values()), default=-1) + 1
    unmatched_tasks: dict[str, int] = {}  # conversations of rows with no task: numbered after the file's tasks
    used: dict[str, set[int]] = {}  # sample indices written so far, per task
    conversation_of: dict[str, str] = {}  # the prompt each task id was first written with
    with atomic_output(target) as sink:
        for lineno, key, row in _keyed_rows(rollouts, rollout_errors):
            key, found, row = match_task(row, key, at, index)
            if found is None and task_file is not None:
                report.unmatched.append(lineno)
            position, task = found if found is not None else (None, {})
            merged = _replay_fields({**task, **row})  # the recording wins where both have a field
            if "id" not in merged and NG_TASK_INDEX not in merged:
                merged[NG_TASK_INDEX] = position if position is not None else \
                    unmatched_tasks.setdefault(key, after_tasks + len(unmatched_tasks))
            group = str(merged["id"]) if "id" in merged else f"task {merged[NG_TASK_INDEX]}"
            if conversation_of.setdefault(group, key) != key:  # the id names another prompt already
                merged["id"] = group = f"{merged.get('id', group)}-line{lineno}"
                conversation_of[group] = key
                report.renamed.append(lineno)
            taken = used.setdefault(group, set())
            sample = merged.get(NG_ROLLOUT_INDEX)
            if not isinstance(sample, int) or isinstance(sample, bool) or sample < 0 or sample in taken:
                if sample is not None:
                    report.renumbered.append(lineno)
                merged[NG_ROLLOUT_INDEX] = sample = max(taken, default=-1) + 1
            taken.add(sample)
            sink.write(json.dumps(merged, ensure_ascii=False).translate(_LINE_BREAKS) + "\n")
            report.written += 1
    report.errors = (task_errors.errors if task_errors else []) + rollout_errors.errors
    report.bad_lines = (task_errors.bad_lines if task_errors else 0) + rollout_errors.bad_lines
    return report


def tasks_by_position(path: Path) -> dict[int, tuple[str, dict[str, Any]]]:
    """Every good row of a task file by its index (NeMo Gym's `_ng_task_index`), with its conversation key."""
    return {line - 1: (key, row) for line, key, row in _keyed_rows(path, ErrorLog(str(path)))}


def match_task(row: dict[str, Any], key: str, at: dict[int, tuple[str, dict[str, Any]]],
               index: dict[str, tuple[int, dict[str, Any]]]
               ) -> tuple[str, tuple[int, dict[str, Any]] | None, dict[str, Any]]:
    """(conversation, (position, task) or None, the row) for a rollout row `key` is the conversation of: the task it
    names when that task's prompt is its own, else the task with its prompt, else the task its recording opened
    with an observation (the row then takes the task's prompt)."""
    found = _indexed_task(row, key, at) or index.get(key)
    if found is None and (opened := _opened_task(row, at)) is not None:
        return opened
    return key, found, row


def _indexed_task(row: dict[str, Any], key: str, at: dict[int, tuple[str, dict[str, Any]]]
                  ) -> tuple[int, dict[str, Any]] | None:
    """The task the rollout names (`_ng_task_index`) when its prompt is the rollout's: tasks that differ only in
    their verifier fields (a seed) share a prompt, so the prompt alone cannot tell them apart."""
    position = row.get(NG_TASK_INDEX)
    if isinstance(position, int) and not isinstance(position, bool) and position in at and at[position][0] == key:
        return position, at[position][1]
    return None


def _opened_task(row: dict[str, Any], at: dict[int, tuple[str, dict[str, Any]]]
                 ) -> tuple[str, tuple[int, dict[str, Any]], dict[str, Any]] | None:
    """(conversation, (position, task), the row with its task's prompt) for a rollout whose prompt is its task's
    (`_ng_task_index`) plus what the environment said first: NeMo Gym's gymnasium agent records /reset's
    observation in the input. The replay starts from the task's prompt, as that agent did (its /reset adds the
    observation again); None for any other row."""
    position = row.get(NG_TASK_INDEX)
    params = row.get("responses_create_params")
    if not isinstance(position, int) or isinstance(position, bool) or position not in at or \
            not isinstance(params, dict) or not isinstance(params.get("input"), list):
        return None
    key, task = at[position]
    prompt = (task.get("responses_create_params") or {}).get("input")
    recorded = params["input"]
    if not isinstance(prompt, list) or not prompt or len(recorded) <= len(prompt) or \
            conversation_key(recorded[:len(prompt)]) != key or \
            any(not isinstance(m, dict) or m.get("role") != "user" for m in recorded[len(prompt):]):
        return None
    return key, (position, task), {**row, "responses_create_params": {**params, "input": prompt}}


def _is_terminus(row: dict[str, Any]) -> bool:
    agent = row.get("agent_ref")
    name = agent.get("name") if isinstance(agent, dict) else None
    response = row.get("response")
    metadata = response.get("metadata") if isinstance(response, dict) else None
    return (isinstance(name, str) and "terminus" in name) or (isinstance(metadata, dict) and "terminus_2" in metadata)


def _first_user_text(row: dict[str, Any]) -> str | None:
    inp = row["responses_create_params"]["input"]  # checked by _conversation
    if isinstance(inp, str):
        return inp
    for message in inp:
        if isinstance(message, dict) and message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, str):
                return content
            if isinstance(content, list):  # content parts: their text, in order
                return "".join(p.get("text", "") for p in content if isinstance(p, dict)) or None
    return None


def _replay_fields(row: dict[str, Any]) -> dict[str, Any]:
    """What a replay needs that NeMo Gym keeps in its agent's config rather than the row: a Terminus-2 agent ends
    its episode with a completion tool (`completion_tool`) and its rows carry no `question` (the prompt is the
    question); a row recorded with the judge off (`judge_evaluations: null`) is replayed with it off."""
    if _is_terminus(row):
        row.setdefault("completion_tool", True)
        if "question" not in row and (question := _first_user_text(row)) is not None:
            row["question"] = question
    if "judge_evaluations" in row and row["judge_evaluations"] is None:
        row.setdefault("should_use_judge", False)
    return row


def join_rollouts(rollouts: str | Path, tasks: str | Path | None, out: str | Path) -> tuple[int, list[int]]:
    """`join` for callers that expect clean files: (rows written, rollout lines with no task); raises on bad lines."""
    report = join(rollouts, tasks, out)
    if report.errors:
        raise GymflowError("; ".join(str(e) for e in report.errors[:5]))
    return report.written, report.unmatched
