"""Every environment end to end on the local stack, the model being the scripted HTTP server."""

from __future__ import annotations

import json

from gymflow.environments.calendar import CalendarEnvironment, gold_calendar
from gymflow.environments.reasoning_gym_env import ReasoningGymEnvironment, entry_for, make_tasks

from gymflow.data.datasets import load_jsonl
from gymflow.testing.scripted_openai import text, tool_call
from tests.conftest import SHARED


def _first(folder: str, env: str):
    tasks, errors = load_jsonl(SHARED / folder / "example.jsonl", env=env)
    assert not errors
    return tasks


async def _run(gf, run_id, task, model="policy"):
    return await gf.run_rollout(gf.make_input(run_id, task, 0, model, max_turns=10))


async def test_math_with_judge(gf, scripted, run_id):
    task = _first("math_with_judge", "math_with_judge")[0]
    scripted.script(text(f"So the answer is \\boxed{{{task.data['expected_answer']}}}."))
    assert (await _run(gf, run_id, task)).reward == 1.0


async def test_math_wrong_answer_scores_zero_without_failing(gf, scripted, run_id):
    task = _first("math_with_judge", "math_with_judge")[0]
    # The configured judge is a recorded one with no verdicts for this task: unscorable -> masked.
    scripted.script(text("\\boxed{definitely not it}"))
    summary = await _run(gf, run_id, task)
    assert summary.status == "completed" and summary.masked and summary.reward is None
    assert summary.failure_type == "judge_failed"
    assert (await gf.temporal.count_workflows(f"GymflowRun = '{run_id}' AND GymflowStatus = 'masked'")).count == 1


async def test_calendar(gf, scripted, run_id):
    task = _first("calendar", "calendar")[0]
    data = CalendarEnvironment().parse_task(task)
    scripted.script(text(json.dumps(gold_calendar(data.exp_cal_state))))
    assert (await _run(gf, run_id, task)).reward == 1.0


async def test_workplace_assistant_tools_then_answer(gf, scripted, sql, run_id):
    task = _first("workplace_assistant", "workplace_assistant")[0]
    calls = [tool_call(c["name"], c["arguments"]) for c in task.data["ground_truth"]]
    scripted.script(*calls, text("Done."))
    summary = await _run(gf, run_id, task)
    assert summary.reward == 1.0 and summary.tool_calls == len(calls)
    (transcript,) = sql("SELECT transcript FROM rollouts WHERE id = %s", summary.rollout_id)[0]
    assert all(not m["content"].startswith("Error") for m in transcript if m["role"] == "tool")


async def test_reasoning_gym(gf, scripted, run_id):
    task = make_tasks("leg_counting", size=3, seed=7)[0]
    answer = entry_for(ReasoningGymEnvironment().parse_task(task))["answer"]
    scripted.script(text(f"<answer>{answer}</answer>"))
    assert (await _run(gf, run_id, task)).reward == 1.0


async def test_code_gen(gf, scripted, run_id):
    solved = [json.loads(line) for line in (SHARED / "code_gen" / "example_rollouts.jsonl").read_text().splitlines()]
    row = next(r for r in solved if r["reward"] == 1.0)
    tasks = _first("code_gen", "code_gen")
    prompt = row["responses_create_params"]["input"][-1]["content"]
    task = next(t for t in tasks if t.messages[-1].content == prompt)
    scripted.script(text(f"```python\n{row['extracted_model_code']}\n```"))
    assert (await _run(gf, run_id, task)).reward == 1.0
