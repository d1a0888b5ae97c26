"""Environment checks on a model's text run in linear time (issue "Hardening, round two"): twelve replies of
`"[" * 99_000` once held every supervised process for its 30 s verify limit. The linear scans return what the
reference regexes return, on random texts over the characters that matter, and finish hostile inputs at once."""

from __future__ import annotations

import random
import re
import time

import pytest
from gymflow.environments import instruction_following_checks as checks
from gymflow.environments import linear_scans as scans


def _texts(alphabet: str, count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 14))) for _ in range(count)]


@pytest.mark.parametrize("seed", [0, 1])
def test_the_linear_scans_return_what_the_reference_regexes_return(seed):
    for t in _texts("[]<>*- \n\ta.b\u00a0", 20_000, seed):
        assert scans.count_bracketed(t) == len(re.findall(r"\[.*?\]", t)), repr(t)
        assert scans.double_angle_spans(t) == re.findall(r"<<[^\n]+>>", t), repr(t)
        assert scans.count_bullets(t, "*") == len(re.findall(r"^\s*\*[^\*].*$", t, flags=re.MULTILINE)), repr(t)
        assert scans.count_bullets(t, "-") == len(re.findall(r"^\s*-.*$", t, flags=re.MULTILINE)), repr(t)
    for t in _texts("ab c\n", 20_000, seed):
        assert scans.word_span_matches(t, "a", "c") == re.findall(r"a .*? c", t), repr(t)
        assert scans.word_span_matches(t, "ab", "a") == re.findall(r"ab .*? a", t), repr(t)


def test_the_postscript_check_matches_the_reference_pattern():
    for t in _texts("p.s P\n \t", 20_000, 2):
        for marker, pattern in (("P.S.", r"\s*p\.\s?s\..*$"), ("P.P.S", r"\s*p\.\s?p\.\s?s.*$")):
            assert checks.postscript(t, marker) == bool(re.findall(pattern, t.lower(), flags=re.MULTILINE)), t


HOSTILE = {"brackets": "[" * 99_000, "newlines": "\n" * 99_000, "spaces": " " * 99_000,
           "blank lines": " \n" * 49_500, "angles": "<<" * 49_500, "words": "a " * 49_500}


@pytest.mark.parametrize("name", HOSTILE)
def test_hostile_replies_are_checked_at_once(name):
    text = HOSTILE[name]
    started = time.monotonic()
    assert checks.number_placeholders(text, 1) is False
    assert checks.number_bullet_lists(text, 1) is False
    assert checks.title(text) is False
    assert checks.postscript(text, "P.S.") is False
    assert checks.repeat_phrase(text, "a b c", 2) is False
    assert time.monotonic() - started < 2.0  # each was minutes (quadratic) before


@pytest.mark.parametrize("size", [1_000, 8_000_000])
async def test_math_with_judge_scans_a_long_reply_off_the_workers_loop(size):
    from gymflow.environments.base import VerifyContext
    from gymflow.environments.math_with_judge import MathWithJudgeEnvironment, last_boxed

    from gymflow.kernel.wire import ChatMessage, Task

    isolated: list[str] = []

    async def run_isolated(fn, *args):  # what the worker hands a verifier that runs in its loop
        isolated.append(fn.__name__)
        return fn(*args)

    env = MathWithJudgeEnvironment(judge_backoff_s=0)
    task = Task(id="m", env="math_with_judge", messages=(ChatMessage(role="user", content="2+2?"),),
                data={"question": "2+2?", "expected_answer": "4"})
    reply = "x" * size + "{"  # no box: neither the library nor a judge runs, only the scan
    transcript = (*task.messages, ChatMessage(role="assistant", content=reply))
    score = await env.verify(env.parse_task(task), transcript, {}, VerifyContext("p", None, {}, run_isolated))
    assert score.reward == 0.0
    assert isolated == ([last_boxed.__name__] if size > 64 * 1024 else [])
