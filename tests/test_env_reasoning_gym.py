"""The reasoning_gym environment: items regenerated offline, scored by each dataset's own `score_answer`."""

from __future__ import annotations

import json

import pytest
from gymflow.activities.env_activities import verify_episode
from gymflow.environments.base import VerifyContext
from gymflow.environments.reasoning_gym_env import (
    ReasoningGymEnvironment,
    entry_for,
    extract_final_answer,
    get_dataset,
    make_tasks,
    write_jsonl,
)

from gymflow.data.datasets import load_jsonl, row_to_task
from gymflow.kernel.errors import TaskError
from gymflow.kernel.failures import VERIFIER_FAILED
from gymflow.kernel.wire import ChatMessage, Task

ENV = ReasoningGymEnvironment()
DATASETS = ["leg_counting", "basic_arithmetic", "chain_sum"]


async def score(task: Task, answer: str | None):
    final = ChatMessage(role="assistant", content=answer)
    return await ENV.verify(ENV.parse_task(task), (*task.messages, final), {}, VerifyContext("m"))


def gold(task: Task) -> str:
    return str(entry_for(ENV.parse_task(task))["answer"])


@pytest.mark.parametrize("name", DATASETS)
async def test_right_answers_score_one(name):
    task = make_tasks(name, 3, seed=11)[0]
    for answer in (f"<answer>{gold(task)}</answer>", f"<think>maybe 999999</think>\n<answer>{gold(task)}</answer>",
                   f"{gold(task)}", f"<answer>1</answer> no wait <answer> {gold(task)} </answer>"):
        s = await score(task, answer)
        assert s.reward == 1.0, answer
        assert s.details == {"dataset": name, "extracted_answer": gold(task)}


@pytest.mark.parametrize("name", DATASETS)
async def test_wrong_answer_scores_zero(name):
    task = make_tasks(name, 3, seed=11)[0]
    wrong = str(int(float(gold(task))) + 1000001)
    assert (await score(task, f"<answer>{wrong}</answer>")).reward == 0.0


@pytest.mark.parametrize("name", DATASETS)
@pytest.mark.parametrize("answer", ["<answer>forty-two</answer>", "<answer></answer> I cannot say", "¯\\_(ツ)_/¯"])
async def test_malformed_answer_scores_zero(name, answer):
    assert (await score(make_tasks(name, 1, seed=3)[0], answer)).reward == 0.0


@pytest.mark.parametrize("name", DATASETS)
@pytest.mark.parametrize("answer", ["", None, "   ", "<think>the answer must be 12 because"])
async def test_empty_answer_scores_zero(name, answer):
    s = await score(make_tasks(name, 1, seed=3)[0], answer)
    assert (s.reward, s.details["reason"]) == (0.0, "no_answer")


@pytest.mark.parametrize("text, answer", [
    ("<think>a</think><answer>7</answer>", "7"),
    ("reasoning the template opened</think>\n7", "7"),  # <think> was in the prompt
    ("<answer>3</answer> then <answer>7</answer>", "7"),
    ("  7\n", "7"),
    ("7 <think>second thoughts", "7"),
])
def test_answer_extraction(text, answer):
    assert extract_final_answer(text) == answer


@pytest.mark.parametrize("name", DATASETS)
async def test_validate_scores_gold_one(name):
    for task in make_tasks(name, 10, seed=42):
        s = await ENV.validate(task)
        assert s is not None and s.reward == 1.0, task.id


def test_make_tasks_are_reproducible_references():
    a, b = make_tasks("chain_sum", 4, seed=5), make_tasks("chain_sum", 4, seed=5)
    assert a == b and [t.id for t in a] == [f"chain_sum-5-{i}" for i in range(4)]
    ds = get_dataset("chain_sum", 5, 4)
    assert [t.messages[-1].content for t in a] == [ds[i]["question"] for i in range(4)]
    assert a[2].data == {"dataset": "chain_sum", "seed": 5, "size": 4, "index": 2}
    assert get_dataset("chain_sum", 5, 4) is ds  # cached per (name, seed, size, config)


def test_make_tasks_with_config_and_system_prompt():
    tasks = make_tasks("basic_arithmetic", 2, seed=1, config={"min_terms": 2, "max_terms": 2},
                       system_prompt="Answer inside <answer></answer>.")
    assert [m.role for m in tasks[0].messages] == ["system", "user"]
    assert tasks[0].data["config"] == {"min_terms": 2, "max_terms": 2}


async def test_dataset_file_round_trip(tmp_path):
    path = write_jsonl(make_tasks("leg_counting", 3, seed=9), tmp_path / "rg.jsonl")
    tasks, errors = load_jsonl(path, env="reasoning_gym")
    assert not errors and [t.id for t in tasks] == [f"leg_counting-9-{i}" for i in range(3)]
    for task in tasks:
        assert (await ENV.validate(task)).reward == 1.0


async def test_full_entry_row_as_nemo_gym_writes_it():
    entry = json.loads(json.dumps(get_dataset("basic_arithmetic", 8, 5)[1]))  # tuples -> lists, as in a file
    row = {"responses_create_params": {"input": [{"role": "user", "content": entry["question"]}]}, **entry}
    task = row_to_task(row, env="reasoning_gym", default_id="r1")
    assert (await score(task, f"<answer>{entry['answer']}</answer>")).reward == 1.0
    assert (await ENV.validate(task)).reward == 1.0


def test_reference_row_without_messages_asks_the_question():
    task = Task(id="q", env="reasoning_gym", messages=(), data={"dataset": "leg_counting", "seed": 1, "index": 0})
    data = ENV.parse_task(task)
    assert ENV.initial_messages(task, data)[0].content == entry_for(data)["question"]


@pytest.mark.parametrize("data, message", [
    ({"dataset": "no_such_dataset", "seed": 1, "index": 0}, "unknown reasoning-gym dataset"),
    ({"dataset": "leg_counting", "index": 0}, "seed is required"),
    ({"dataset": "leg_counting", "seed": 1}, "either dataset"),
    ({"seed": 1, "index": 0}, "dataset: required"),
    ({"dataset": "leg_counting", "seed": 1, "index": -1}, "index"),
])
def test_bad_rows_are_task_errors(data, message):
    with pytest.raises(TaskError, match=message):
        ENV.parse_task(Task(id="x", env="reasoning_gym", messages=(), data=data))


async def test_index_past_size_is_a_task_error():
    task = Task(id="x", env="reasoning_gym", messages=(),
                data={"dataset": "leg_counting", "seed": 1, "size": 2, "index": 5})
    with pytest.raises(TaskError, match="past the dataset's size"):
        await ENV.validate(task)


def test_bad_config_is_a_task_error():
    with pytest.raises(TaskError, match="config"):
        get_dataset("leg_counting", 1, 2, {"min_animals": 0, "no_such_option": 1})


@pytest.mark.parametrize(("error", "expected"), [
    (ValueError("could not convert 'forty' to int"), "zero"),  # the answer's fault: 0, as NeMo Gym
    (OSError("[Errno 24] Too many open files"), "masked"),  # the platform's: never 0
    (ImportError("No module named 'sympy'"), "masked"),
])
async def test_a_scorer_that_raises_scores_zero_only_when_the_answer_is_why(monkeypatch, error, expected):
    task = make_tasks("leg_counting", 2, seed=5)[1]
    dataset = get_dataset("leg_counting", 5, 2)

    def raising(answer, entry):
        raise error

    monkeypatch.setattr(dataset, "score_answer", raising)
    transcript = (*task.messages, ChatMessage(role="assistant", content="<answer>forty</answer>"))
    s = await verify_episode(ENV, ENV.parse_task(task), transcript, {}, VerifyContext("m"))
    if expected == "zero":
        assert s.reward == 0.0 and s.details["reason"] == "scorer_error" and not s.masked
    else:
        assert s.masked and s.reward is None and s.failure_type == VERIFIER_FAILED, s
