"""Parity inputs: NeMo Gym's recorded rollouts, joined with their tasks' verifier fields."""

from __future__ import annotations

import json
from pathlib import Path

from gymflow.data.prepare import join_rollouts
from tests.conftest import SHARED

# data folder -> environment
ENVS = {"example_single_tool_call": "single_tool", "math_with_judge": "math_with_judge", "code_gen": "code_gen",
        "calendar": "calendar", "workplace_assistant": "workplace_assistant",
        "math_with_judge_terminus": "math_with_judge"}
# NeMo Gym's Terminus-2 agent rollouts of math_with_judge (multi-turn, ended by mark_task_complete twice); rollout
# rows that carry their task's fields, recorded with the judge off.
TERMINUS = Path(__file__).parent / "data" / "nemo_gym" / "math_with_judge" / "example_rollouts_terminus_2.jsonl"


# Recorded samples of one task: the Terminus-2 rollout of task 0 (answer 32, reward 1) with its answer changed to 33
# (reward 0), then task 4's one rollout (reward 0), then task 0's as recorded. No `_ng_*` keys or replay fields:
# `gymflow data join` alone makes the file replayable (task 0's rollouts become its samples 0 and 1).
SAMPLES = "math_with_judge_terminus_samples"


def _samples_rollouts(path: Path) -> Path:
    rows = {r["_ng_task_index"]: r for r in map(json.loads, TERMINUS.read_text().splitlines())}
    bare = [{k: v for k, v in rows[i].items() if not k.startswith("_ng_")} for i in (0, 4)]
    wrong = json.loads(json.dumps(bare[0]).replace("boxed{32}", "boxed{33}"))
    path.write_text("".join(json.dumps({**r, "reward": reward}) + "\n"
                            for r, reward in ((wrong, 0.0), (bare[1], 0.0), (bare[0], 1.0))))
    return path


def recorded_model(folder: str) -> str:
    return f"recorded_{folder}"


def build(out_dir: Path) -> dict[str, Path]:
    """One joined rollouts file per environment, usable as both the dataset and the recorded model."""
    from tests.workplace_gold import GOLD_FOR_ROLLOUTS

    files = {}
    files[SAMPLES] = out_dir / f"{SAMPLES}.jsonl"
    assert join_rollouts(_samples_rollouts(out_dir / "samples-recorded.jsonl"), None, files[SAMPLES]) == (3, [])
    for folder in ENVS:
        if folder == "math_with_judge_terminus":
            # No task file: `join` alone gives these rows what the replay needs (the prompt as `question`, the
            # completion tool their agent ended with, the judge off as recorded).
            out = files[folder] = out_dir / f"{folder}.jsonl"
            written, unmatched = join_rollouts(TERMINUS, None, out)
            assert (written, unmatched) == (5, [])
            continue
        out = out_dir / f"{folder}.jsonl"
        data = SHARED / folder
        written, unmatched = join_rollouts(data / "example_rollouts.jsonl", data / "example.jsonl", out)
        assert written == 5
        if folder == "workplace_assistant":
            # Its rollouts are of tasks not in example.jsonl, and rollout rows omit ground_truth.
            assert unmatched == [1, 2, 3, 4, 5]
            rows = [json.loads(line) for line in out.read_text().splitlines()]
            for row, gold in zip(rows, GOLD_FOR_ROLLOUTS, strict=True):
                row["ground_truth"] = [{"name": n, "arguments": json.dumps(a)} for n, a in gold]
            out.write_text("".join(json.dumps(r) + "\n" for r in rows))
        else:
            assert unmatched == [], folder
        files[folder] = out
    return files
