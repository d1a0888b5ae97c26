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


def recorded_model(folder: str) -> str:
    return f"recorded_{folder}"


def build(out_dir: Path) -> dict[str, Path]:
    """One joined rollouts file per environment, usable as both the dataset and the recorded model."""
    from tests.workplace_gold import GOLD_FOR_ROLLOUTS

    files = {}
    for folder in ENVS:
        if folder == "math_with_judge_terminus":
            out = files[folder] = out_dir / f"{folder}.jsonl"
            rows = [json.loads(line) for line in TERMINUS.read_text().splitlines()]
            # The task field these rows lack is the prompt itself (NeMo Gym's verifier reads only expected_answer);
            # completion_tool offers the tool their agent ended with.
            rows = [{**r, "question": r["responses_create_params"]["input"][0]["content"], "should_use_judge": False,
                     "completion_tool": True} for r in rows]
            out.write_text("".join(json.dumps(r) + "\n" for r in rows))
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
