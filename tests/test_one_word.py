"""The one_word environment: exact one-word answers score 1, near misses 0.5, anything else 0; bad rows are named."""

from __future__ import annotations

import pytest
from gymflow.environments.one_word import OneWordEnvironment, OneWordTask, score_reply
from gymflow.environments.registry import get_environment

from gymflow.kernel.errors import TaskError
from gymflow.kernel.wire import ChatMessage, Task

ENV = OneWordEnvironment()
DATA = OneWordTask(choices=["yes", "no"], answer="yes")


@pytest.mark.parametrize(("reply", "reward"), [
    ("yes", 1.0), ("  Yes.", 1.0), ('"YES!"', 1.0), ("**yes**", 1.0),
    ("no", 0.5),  # the format is right, the choice is not
    ("Yes, it is.", 0.5), ("fire - yes", 0.5), ("No it is not", 0.25),
    ("Yes, fire is hot because it burns", 0.0),  # a choice, but in more than 5 words
    ("maybe", 0.0), ("yesterday", 0.0), ("", 0.0), ("   ", 0.0), (None, 0.0), (42, 0.0),
    ("\x00yes\x00", 0.5),  # NUL bytes are not part of a word, nor the exact answer
    ("yes " * 100_000, 0.0),
])
def test_score_reply(reply, reward):
    assert score_reply(DATA, reply)[0] == reward


def test_without_answer_any_choice_is_right():
    data = OneWordTask(choices=["red", "blue"])
    assert score_reply(data, "Blue")[0] == 1.0 and score_reply(data, "red")[0] == 1.0


@pytest.mark.parametrize(("data", "field"), [
    ({}, "choices"), ({"choices": []}, "choices"), ({"choices": ["two words"]}, "choices.0"),
    ({"choices": ["yes", "Yes"]}, "choices"), ({"choices": ["yes"], "answer": "no"}, "answer"),
    ({"choices": ["yes"], "near_words": 0}, "near_words"),
])
def test_bad_rows_name_the_field(data, field):
    task = Task(id="t", env="one_word", messages=(ChatMessage(role="user", content="?"),), data=data)
    with pytest.raises(TaskError, match=field.split(".")[0]):
        ENV.parse_task(task)


async def test_registered_and_gold_scores_one():
    env = get_environment("one_word")  # the entry point in pyproject.toml
    task = Task(id="t", env="one_word", messages=(ChatMessage(role="user", content="Is fire hot?"),),
                data={"choices": ["yes", "no"], "answer": "yes"})
    assert (await env.validate(task)).reward == 1.0
    reply = ChatMessage(role="assistant", content="It is hot, so yes, but I would say that it depends.")
    score = await env.verify(env.parse_task(task), (*task.messages, reply), {}, None)
    assert score.reward == 0.0
