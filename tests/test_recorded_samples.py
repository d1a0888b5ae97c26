"""A NeMo Gym rollout file with several samples per task (`ng_collect_rollouts` with repeats) replays as one task
per prompt, its k-th recorded sample as sample k, each scored by our verifier on the real stack; a sample past the
recording fails typed, never scored 0."""

from __future__ import annotations

import io
import json

from gymflow.activities.recorded import RecordedRollouts
from rich.console import Console

from gymflow.cli.collect_cmd import collect_dataset
from gymflow.data.datasets import load_jsonl
from gymflow.data.prepare import join
from gymflow.kernel.failures import RECORDING_EXHAUSTED
from tests.parity import SAMPLES, recorded_model


def test_join_numbers_the_samples_of_one_prompt_and_the_loader_groups_them(parity_files):
    rows = [json.loads(line) for line in parity_files[SAMPLES].read_text().splitlines()]
    assert [(r["_ng_task_index"], r["_ng_rollout_index"]) for r in rows] == [(0, 0), (1, 0), (0, 1)]
    assert all(r["completion_tool"] is True and r["should_use_judge"] is False and r["question"] for r in rows)
    samples: dict[str, int] = {}
    tasks, errors = load_jsonl(parity_files[SAMPLES], env="math_with_judge", samples=samples)
    assert errors == [] and len(tasks) == 2
    assert samples == {tasks[0].id: 2, tasks[1].id: 1}


def test_samples_that_disagree_on_their_prompt_or_repeat_an_index_are_errors(tmp_path, parity_files):
    rows = [json.loads(line) for line in parity_files[SAMPLES].read_text().splitlines()]
    repeated = tmp_path / "repeated.jsonl"
    repeated.write_text("".join(json.dumps(r) + "\n" for r in [rows[0], {**rows[2], "_ng_rollout_index": 0}]))
    _, errors = load_jsonl(repeated, env="math_with_judge")
    assert [(e.line, "repeats line 1" in e.message) for e in errors] == [(2, True)]
    other = dict(rows[2], responses_create_params={**rows[2]["responses_create_params"], "input": "another prompt"})
    differing = tmp_path / "differing.jsonl"
    differing.write_text("".join(json.dumps(r) + "\n" for r in [rows[0], other]))
    _, errors = load_jsonl(differing, env="math_with_judge")
    assert [(e.line, "prompt differs from line 1" in e.message) for e in errors] == [(2, True)]


def test_join_mends_concatenated_files_repeated_samples_and_reused_ids(tmp_path, parity_files):
    rows = [json.loads(line) for line in parity_files[SAMPLES].read_text().splitlines()]
    # Two collections appended: task 0's sample 0 twice (graphwalks ships this), and an id given to two prompts
    # (iheval's `id: 1`).
    a, b = {**rows[0], "id": "q1"}, {**rows[1], "id": "q1"}
    raw = tmp_path / "concatenated.jsonl"
    raw.write_text("".join(json.dumps(r) + "\n" for r in [rows[0], rows[0], a, b]))
    out = tmp_path / "joined.jsonl"
    report = join(raw, None, out)
    assert report.renumbered == [2] and report.renamed == [4] and report.errors == []
    joined = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["_ng_rollout_index"] for r in joined[:2]] == [0, 1] and joined[3]["id"] == "q1-line4"
    samples: dict[str, int] = {}
    tasks, errors = load_jsonl(out, env="math_with_judge", samples=samples)
    assert errors == [] and sorted(samples.values()) == [1, 1, 2] and len(tasks) == 3


def test_join_gives_the_samples_of_a_task_file_row_its_id(tmp_path):
    tasks, rollouts, out = tmp_path / "tasks.jsonl", tmp_path / "rollouts.jsonl", tmp_path / "out.jsonl"
    tasks.write_text(json.dumps({"id": "t1", "responses_create_params": {"input": "q"}, "gold": 1}) + "\n")
    rollouts.write_text("".join(json.dumps({"responses_create_params": {"input": "q"}, "reward": r}) + "\n"
                                for r in (1, 0, 1)))
    report = join(rollouts, tasks, out)
    assert report.written == 3 and report.unmatched == []
    got = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["id"], r["_ng_rollout_index"], r["gold"]) for r in got] == [("t1", 0, 1), ("t1", 1, 1), ("t1", 2, 1)]
    assert [len(RecordedRollouts(out)._rows["t1"])] == [3]  # noqa: SLF001


def test_join_finds_the_task_of_a_recording_that_holds_its_first_observation(tmp_path):
    """NeMo Gym's gymnasium agent records /reset's observation in the input: its task is `_ng_task_index`'s when that
    task's prompt begins it, and the replay starts from the task's prompt with the task's fields (the seed)."""
    tasks, rollouts, out = tmp_path / "tasks.jsonl", tmp_path / "rollouts.jsonl", tmp_path / "out.jsonl"
    prompt = [{"role": "system", "content": "Solve it."}]
    tasks.write_text("".join(json.dumps({"seed": seed, "responses_create_params": {"input": [
        *prompt, {"role": "user", "content": f"Go {seed}."}]}}) + "\n" for seed in (7, 8)))
    opened = [*prompt, {"role": "user", "content": "Go 8."},
              {"role": "user", "content": "board 8", "type": "message"}]
    rows = [{"_ng_task_index": 1, "responses_create_params": {"input": opened}, "reward": 1},
            # its index names a task whose prompt does not begin it, or the extra item is not the environment's
            {"_ng_task_index": 0, "responses_create_params": {"input": opened}, "reward": 0},
            {"_ng_task_index": 1, "responses_create_params": {"input": [*opened[:2], {"role": "assistant",
                                                                                     "content": "x"}]}}]
    rollouts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    report = join(rollouts, tasks, out)
    assert report.written == 3 and report.unmatched == [2, 3]
    first, second, third = (json.loads(line) for line in out.read_text().splitlines())
    assert first["seed"] == 8 and first["responses_create_params"]["input"] == opened[:2]
    assert "seed" not in second and second["responses_create_params"]["input"] == opened
    assert "seed" not in third


def test_sample_k_is_the_row_with_sample_index_k_wherever_it_is_in_the_file(tmp_path):
    def row(index: int, answer: str) -> str:
        return json.dumps({"id": "t", "_ng_rollout_index": index, "responses_create_params": {"input": "q"},
                           "response": {"output": [{"type": "message", "role": "assistant",
                                                    "content": [{"type": "output_text", "text": answer}]}]}}) + "\n"

    path = tmp_path / "r.jsonl"
    path.write_text(row(1, "second") + row(0, "first"))
    recorded = RecordedRollouts(path)
    assert [recorded.turn("t", 0, sample=k).content for k in (0, 1)] == ["first", "second"]


async def test_each_recorded_sample_replays_with_its_own_reward(gf, parity_files, sql, run_id):
    tasks, errors = load_jsonl(parity_files[SAMPLES], env="math_with_judge")
    assert errors == []
    results = [r.summary async for r in gf.collect(run_id, tasks, n=3, model=recorded_model(SAMPLES), max_turns=50)]
    by = {(s.task_id, s.sample_index): s for s in results}
    two, one = tasks[0].id, tasks[1].id
    assert [(by[two, k].status, by[two, k].reward) for k in (0, 1)] == [("completed", 0.0), ("completed", 1.0)]
    assert (by[one, 0].status, by[one, 0].reward) == ("completed", 0.0)
    for key in ((two, 2), (one, 1), (one, 2)):  # past the recording: typed, not a 0
        assert by[key].reward is None and by[key].failure_type == RECORDING_EXHAUSTED, by[key]
    stored = {(t, k): r for t, k, r in sql("SELECT task_id, sample_index, reward FROM rollouts WHERE run_id = %s",
                                           run_id)}
    assert stored == {(s.task_id, s.sample_index): s.reward for s in results}


async def test_collect_says_when_the_file_holds_more_samples_than_it_replays(gf, settings, parity_files, run_id):
    output = io.StringIO()
    tally = await collect_dataset(settings, str(parity_files[SAMPLES]), env="math_with_judge",
                                  model=recorded_model(SAMPLES), n=1, run_id=run_id, max_turns=50,
                                  console=Console(file=output, width=1000), probe=False)
    assert f"{parity_files[SAMPLES]} holds up to 2 recorded samples per task; -n 1 replays the first 1 of each" in \
        output.getvalue()
    assert tally.total == 2


def test_join_tells_tasks_that_share_a_prompt_apart_by_their_index(tmp_path):
    """grl_sokoban's tasks are one prompt a seed apart: each recording gets the seed of the task it names."""
    tasks, rollouts, out = tmp_path / "tasks.jsonl", tmp_path / "rollouts.jsonl", tmp_path / "out.jsonl"
    prompt = {"input": [{"role": "user", "content": "Solve it."}]}
    tasks.write_text("".join(json.dumps({"seed": seed, "responses_create_params": prompt}) + "\n"
                             for seed in (7, 8, 9)))
    rollouts.write_text("".join(json.dumps({"_ng_task_index": i, "responses_create_params": prompt}) + "\n"
                                for i in (2, 0, 1)))
    assert join(rollouts, tasks, out).unmatched == []
    assert [json.loads(line)["seed"] for line in out.read_text().splitlines()] == [9, 7, 8]
