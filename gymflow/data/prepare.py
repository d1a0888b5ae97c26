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


def join(rollouts: str | Path, tasks: str | Path, out: str | Path) -> JoinReport:
    """Give each recorded rollout row the verifier fields of its task (NeMo Gym rollout files omit some,
    e.g. `exp_cal_state`), matched by conversation. Bad lines of either file are reported and skipped."""
    rollouts, tasks, target = Path(rollouts), Path(tasks), Path(out)
    refuse_to_overwrite([rollouts, tasks], target)
    task_errors, rollout_errors, report = ErrorLog(str(tasks)), ErrorLog(str(rollouts)), JoinReport()
    index = {key: row for _, key, row in _keyed_rows(tasks, task_errors)}
    with atomic_output(target) as sink:
        for lineno, key, row in _keyed_rows(rollouts, rollout_errors):
            task = index.get(key)
            if task is None:
                report.unmatched.append(lineno)
            merged = {**(task or {}), **row}  # the recording wins where both have a field
            sink.write(json.dumps(merged, ensure_ascii=False).translate(_LINE_BREAKS) + "\n")
            report.written += 1
    report.errors = task_errors.errors + rollout_errors.errors
    report.bad_lines = task_errors.bad_lines + rollout_errors.bad_lines
    return report


def join_rollouts(rollouts: str | Path, tasks: str | Path, out: str | Path) -> tuple[int, list[int]]:
    """`join` for callers that expect clean files: (rows written, rollout lines with no task); raises on bad lines."""
    report = join(rollouts, tasks, out)
    if report.errors:
        raise GymflowError("; ".join(str(e) for e in report.errors[:5]))
    return report.written, report.unmatched
