"""Task ids and sample indices of recorded rollout rows: shared by the dataset loader and the recorded model, which
must name the same rows the same way."""

from __future__ import annotations

from typing import Any

# NeMo Gym's keys of a rollout file with several samples per task (`ng_collect_rollouts` with repeats): the
# task's index in its input file, and the sample's index among that task's rollouts.
NG_TASK_INDEX, NG_ROLLOUT_INDEX = "_ng_task_index", "_ng_rollout_index"


def _index(row: Any, key: str) -> int | None:
    value = row.get(key) if isinstance(row, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def default_task_id(stem: str, line: int, row: Any) -> str:
    """The id of a row with no `id`: from the file name and line, or, for a NeMo Gym rollout row, from the file
    name and its task index, so that the samples of one task share it."""
    task_index = _index(row, NG_TASK_INDEX)
    return f"{stem}-{line}" if task_index is None else f"{stem}-task{task_index}"


def recorded_sample(row: Any) -> int | None:
    """The row's sample index among its task's recorded rollouts (NeMo Gym's `_ng_rollout_index`), if any."""
    return _index(row, NG_ROLLOUT_INDEX)
