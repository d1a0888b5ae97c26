"""instruction_following: NeMo Gym's rows load unchanged (both layouts), rewards and per-instruction verdicts match
its recorded rollouts, each of the 54 instructions passes and fails where it should, IFEval's strict/loose
verdicts, bad rows are rejected by field, nothing is downloaded, and hostile answers are bounded."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from gymflow.environments.base import VerifyContext
from gymflow.environments.instruction_following import InstructionFollowingEnvironment, loose_variants
from gymflow.environments.instruction_following_checks import CHECKS

from gymflow.data.datasets import load_jsonl, row_to_task
from gymflow.kernel.errors import TaskError, VerifierError
from gymflow.kernel.wire import ChatMessage, Task

DATA = Path(__file__).parent / "data" / "nemo_gym" / "instruction_following"
ENV = "instruction_following"


@pytest.fixture(scope="module")
def env() -> InstructionFollowingEnvironment:
    return InstructionFollowingEnvironment()


def task(ids: list[str], kwargs: list[dict[str, Any] | None], **vm: Any) -> Task:
    metadata = {"instruction_id_list": ids, "kwargs": kwargs, "prompt": "p", **vm}
    return Task(id="t", env=ENV, messages=(ChatMessage(role="user", content="p"),),
                data={"verifier_metadata": metadata})


async def score(env: InstructionFollowingEnvironment, t: Task, answer: str | None, options: dict | None = None):
    transcript = (*t.messages, ChatMessage(role="assistant", content=answer))
    return await env.verify(env.parse_task(t), transcript, {}, VerifyContext("policy", None, options or {}))


# ---- NeMo Gym's rows --------------------------------------------------------------------------------


async def test_example_rows_load_unchanged(env: InstructionFollowingEnvironment) -> None:
    tasks, errors = load_jsonl(DATA / "example.jsonl", env=ENV)
    assert not errors and len(tasks) == 5
    for t in tasks:
        assert await env.validate(t) is None  # no gold answer; the row still parses
        assert env.parse_task(t).verifier_metadata.instruction_id_list == t.data["instruction_id_list"]


async def test_replay_matches_nemo_gym(env: InstructionFollowingEnvironment) -> None:
    rows = [json.loads(line) for line in (DATA / "example_rollouts.jsonl").read_text().splitlines() if line.strip()]
    for i, row in enumerate(rows):
        t = row_to_task(row, env=ENV, default_id=f"r{i}")
        answer = row["response"]["output"][-1]["content"][0]["text"]
        s = await score(env, t, answer)
        assert s.reward == row["reward"], i
        assert s.details["follow_instruction_list"] == row["follow_instruction_list"], i
        assert s.details["follow_all_instructions"] == row["follow_all_instructions"], i


def test_verifier_metadata_wins_over_legacy_top_level() -> None:
    env = InstructionFollowingEnvironment()
    data = {"instruction_id_list": ["punctuation:no_comma"], "kwargs": [{}], "prompt": "old",
            "verifier_metadata": {"prompt": "new"}}
    vm = env.parse_task(Task(id="t", env=ENV, messages=(), data=data)).verifier_metadata
    assert vm.prompt == "new" and vm.instruction_id_list == ["punctuation:no_comma"] and vm.grading_mode == "binary"


@pytest.mark.parametrize(("vm", "message"), [
    ({"instruction_id_list": ["nope:nope"], "kwargs": [{}]}, "instruction_id_list[0]: unknown instruction 'nope:nope'"),
    ({"instruction_id_list": [], "kwargs": []}, "instruction_id_list"),
    ({"instruction_id_list": ["punctuation:no_comma"], "kwargs": [{}, {}]}, "kwargs: 2 entries for 1 instructions"),
    ({"instruction_id_list": ["length_constraints:number_words"], "kwargs": [{"num_words": 5}]},
     "kwargs[0].relation: required"),
    ({"instruction_id_list": ["length_constraints:number_words"],
      "kwargs": [{"num_words": -1, "relation": "at least"}]},
     "kwargs[0].num_words: expected a non-negative integer"),
    ({"instruction_id_list": ["length_constraints:number_words"], "kwargs": [{"num_words": 5, "relation": "about"}]},
     "kwargs[0].relation: expected one of"),
    ({"instruction_id_list": ["punctuation:no_comma"], "kwargs": [{"x": 1}]}, "kwargs[0]: punctuation:no_comma takes"),
    ({"instruction_id_list": ["keywords:existence"], "kwargs": [{"keywords": ["(("]}]}, "not a valid regular expr"),
    ({"instruction_id_list": ["punctuation:no_comma"], "kwargs": [{}], "grading_mode": "half"}, "grading_mode"),
    ({"kwargs": [{}]}, "instruction_id_list"),
])
def test_bad_rows_are_rejected_by_field(vm: dict[str, Any], message: str) -> None:
    with pytest.raises(TaskError, match=message.replace("[", r"\[").replace("(", r"\(")):
        InstructionFollowingEnvironment().parse_task(Task(id="t", env=ENV, messages=(),
                                                          data={"verifier_metadata": {"prompt": "p", **vm}}))


# ---- the 54 instructions ----------------------------------------------------------------------------

LONG = " ".join(["word"] * 60)
# id -> (kwargs, an answer that follows it, one that does not)
CASES: dict[str, tuple[dict[str, Any], str, str]] = {
    "keywords:existence": ({"keywords": ["apple", "pie"]}, "Apple and PIE.", "Apple only."),
    "keywords:frequency": ({"keyword": "cat", "frequency": 2, "relation": "at least"}, "cat Cat", "cat"),
    "keywords:forbidden_words": ({"forbidden_words": ["bad"]}, "badly good", "a bad thing"),
    "keywords:letter_frequency": ({"letter": "z", "let_frequency": 2, "let_relation": "less than"}, "zoo", "zzz"),
    "language:response_language": ({"language": "fr"}, "Bonjour tout le monde, comment allez-vous aujourd'hui ?",
                                   "Hello everyone, how are you doing today my friends?"),
    "length_constraints:number_sentences": ({"num_sentences": 3, "relation": "at least"},
                                            "Mr. Smith came. He sat. He left.", "Mr. Smith came. He left."),
    "length_constraints:number_paragraphs": ({"num_paragraphs": 2}, "one\n***\ntwo", "one\n***\n\n***\ntwo"),
    "length_constraints:number_words": ({"num_words": 3, "relation": "less than"}, "two words", "one two three"),
    "length_constraints:nth_paragraph_first_word": (
        {"num_paragraphs": 2, "nth_paragraph": 2, "first_word": "crash"}, "a b\n\n\"Crash, he said", "a\n\nboom"),
    "detectable_content:number_placeholders": ({"num_placeholders": 2}, "[a] at [b]", "[a] only"),
    "detectable_content:postscript": ({"postscript_marker": "P.S."}, "Hi.\nP.S. bye", "Hi. PS bye"),
    "detectable_format:number_bullet_lists": ({"num_bullets": 2}, "* a\n- b", "* a\n* b\n* c"),
    "detectable_format:constrained_response": ({}, "My answer is yes.", "Yes."),
    "detectable_format:number_highlighted_sections": ({"num_highlights": 2}, "*one* and **two**", "*one* only"),
    "detectable_format:multiple_sections": ({"section_spliter": "Section", "num_sections": 2},
                                            "Section 1\na\nSection 2\nb", "Section 1\na"),
    "detectable_format:json_format": ({}, "```json\n{\"a\": 1}\n```", "{a: 1}"),
    "detectable_format:title": ({}, "<<My Title>>\ntext", "<< >> text"),
    "combination:two_responses": ({}, "one******two", "one******one"),
    "combination:repeat_prompt": ({"prompt_to_repeat": "Say hi"}, "say hi. Hi!", "Hi! Say hi"),
    "startend:end_checker": ({"end_phrase": "Any other questions?"}, "Done. Any other questions?\"", "Any other? no"),
    "change_case:capital_word_frequency": ({"capital_frequency": 2, "capital_relation": "at least"},
                                           "I DON'T know", "I know"),
    "change_case:english_capital": ({}, "THIS IS AN ENGLISH SENTENCE WRITTEN IN CAPITALS.", "This is English."),
    "change_case:english_lowercase": ({}, "this is an english sentence written in lowercase.", "This is English."),
    "punctuation:no_comma": ({}, "no commas here", "a, b"),
    "startend:quotation": ({}, ' "quoted" ', '"half'),
    "copy:repeat_phrase": ({"phrase": "the quick brown fox", "small_n": 2},
                           "the slow brown fox and the quick red fox", "the quick brown fox and the quick brown fox"),
    "copy:copy": ({"prompt_to_repeat": "Copy Me"}, " copy me ", "copy me!"),
    "new:copy_span_idx": ({"prompt_to_repeat": "Hello world", "n_start": 0, "n_end": 5}, "hello", "world"),
    "detectable_format:sentence_hyphens": ({}, "One.-Two.", "One. - Two."),
    "keywords:no_adjacent_consecutive": ({}, "apple cat egg", "apple banana"),
    "detectable_format:square_brackets": ({}, "[a] [b]", "[a] b"),
    "keywords:word_once": ({"keyword": "sun"}, "the sun", "sun and sun"),
    "keywords:word_count_different_numbers": ({"keyword": "sun", "frequency": 2, "relation": "less than"},
                                              "sun", "sun sun"),
    "keywords:exclude_word_harder": ({"keyword": "very"}, "veryfine", "a very fine"),
    "paragraphs:paragraphs": ({}, "one *** two", "one two"),
    "paragraphs:paragraphs2": ({}, "one\n\ntwo", "one\n\ntwo\n\nthree"),
    "first_word:first_word_sent": ({"first_word": "so"}, "So it is. so it goes.", "So it is. It goes."),
    "first_word:first_word_answer": ({"first_word": "so"}, "SO there", "Well so"),
    "last_word:last_word_sent": ({"last_word": "end"}, "The end. Not the end!", "The end. Not yet."),
    "last_word:last_word_answer": ({"last_word": "contest"}, "a contest.", "a contest and more"),
    "detectable_format:bigram_wrapping": ({}, "<<I am>> <<at home>>", "<<I am>> at home"),
    "copy:copying_simple": ({"prompt_to_repeat": "Repeat this"}, "repeat this", "repeat that"),
    "copy:copying_multiple": ({"prompt_to_repeat": "Hi", "N": 2}, "Hi******hi", "Hi******Hi******Hi"),
    "punctuation:punctuation_dot": ({}, "no dots", "a dot."),
    "punctuation:punctuation_exclamation": ({}, "calm", "wow!"),
    "count:lowercase_counting": ({"N": 2}, "Two lower Words only", "three lower words"),
    "letters:letter_counting": ({"N": 5, "relation": "at least"}, "abcde", "abcd 123"),
    "letters:letter_counting2": ({"letter": "a", "let_frequency": 2, "let_relation": "at least"}, "Aa", "a"),
    "count:counting_composition": ({"n_sent": 1, "n_words": 4},  # Treebank tokens: "." counts
                                   "I am here. *** You are there. *** We are both.", "I am here. *** You are."),
    "count:count_unique": ({}, "every word differs", "the word the"),
    "count:count_increment_word": ({"keyword1": "one", "keyword2": "two"}, "one two two", "one two"),
    "keywords:palindrome": ({}, "a racecar", "no pals here"),
    "keywords:keyword_specific_position": ({"keyword": "cat", "n": 2, "m": 2},
                                           "Hello there. The cat sat.", "Hello there. A dog sat."),
    "keywords:start_end": ({}, "Stop and think, then stop", "Stop and think"),
}


def test_every_instruction_has_a_case() -> None:
    assert sorted(CASES) == sorted(CHECKS) and len(CHECKS) == 54


@pytest.mark.parametrize("iid", sorted(CASES))
async def test_instruction(env: InstructionFollowingEnvironment, iid: str) -> None:
    kwargs, good, bad = CASES[iid]
    t = task([iid], [kwargs])
    assert (await score(env, t, good)).reward == 1.0, good
    assert (await score(env, t, bad)).reward == 0.0, bad


# ---- scoring ----------------------------------------------------------------------------------------


async def test_fraction_grading_and_accuracies(env: InstructionFollowingEnvironment) -> None:
    ids = ["punctuation:no_comma", "punctuation:punctuation_dot", "punctuation:punctuation_exclamation"]
    t = task(ids, [{}, None, {}], grading_mode="fraction")
    s = await score(env, t, "fine, really!")
    assert s.reward == pytest.approx(1 / 3) and s.details["follow_instruction_list"] == [False, True, False]
    assert s.details["inst_level_strict_acc"] == pytest.approx(1 / 3) and s.details["prompt_level_strict_acc"] == 0.0
    binary = await score(env, task(ids, [{}, {}, {}]), "fine, really!")
    assert binary.reward == 0.0


async def test_loose_forgives_a_preamble_and_markdown(env: InstructionFollowingEnvironment) -> None:
    t = task(["startend:quotation", "detectable_format:json_format"], [{}, {}])
    s = await score(env, t, "Sure! Here it is:\n\"{\"a\": 1}\"")
    assert s.details["strict_follow_instruction_list"] == [False, False]
    assert s.details["loose_follow_instruction_list"] == [True, False]
    assert s.details["prompt_level_loose_acc"] == 0.0 and s.details["inst_level_loose_acc"] == 0.5
    assert len(loose_variants("a\nb\nc")) == 8


async def test_empty_answer_fails_strict_but_nemo_reward_is_kept(env: InstructionFollowingEnvironment) -> None:
    t = task(["punctuation:no_comma"], [{}])
    for answer in (None, "", "   "):
        s = await score(env, t, answer)
        assert s.reward == 1.0  # NeMo Gym: an empty answer has no comma
        assert s.details["strict_follow_instruction_list"] == [False] and s.details["loose_follow_instruction_list"] \
            == [False]


async def test_checker_exception_scores_not_followed(env: InstructionFollowingEnvironment) -> None:
    s = await score(env, task(["keywords:no_adjacent_consecutive"], [{}]), "İstanbul jolly")  # 'İ'.lower() is 2 chars
    assert s.reward == 0.0


# ---- offline, hostile -------------------------------------------------------------------------------


async def test_no_download_at_run_time(env: InstructionFollowingEnvironment, monkeypatch: pytest.MonkeyPatch) -> None:
    import nltk

    def refuse(*a: Any, **k: Any) -> None:
        raise AssertionError("tried to download or load NLTK data")

    monkeypatch.setattr(nltk, "download", refuse)
    monkeypatch.setattr(nltk.data, "load", refuse)
    monkeypatch.setattr(nltk.data, "find", refuse)
    t = task(["length_constraints:number_sentences", "keywords:start_end", "language:response_language"],
             [{"num_sentences": 2, "relation": "at least"}, {}, {"language": "en"}])
    assert (await score(env, t, "Well, this is an English answer. It ends well")).reward == 1.0


async def test_huge_answer_is_bounded(env: InstructionFollowingEnvironment) -> None:
    t = task(list(CASES), [CASES[i][0] for i in CASES])
    start = time.monotonic()
    s = await score(env, t, "Hello world. " * 20_000 + "x" * 200_000)
    assert s.reward == 0.0 and s.details["failure_reason"].startswith("response_too_long")
    s = await score(env, t, ("A sentence, with-words. " * 4000)[:99_000])
    assert time.monotonic() - start < 60 and s.reward == 0.0 and len(s.details["follow_instruction_list"]) == 54


async def test_nul_bytes(env: InstructionFollowingEnvironment) -> None:
    t = task(["punctuation:no_comma", "length_constraints:number_words"],
             [{}, {"num_words": 2, "relation": "at least"}])
    assert (await score(env, t, "one\x00two\x00three")).reward == 1.0


async def test_bad_option_is_a_config_error(env: InstructionFollowingEnvironment) -> None:
    with pytest.raises(VerifierError, match="max_response_chars"):
        await score(env, task(["punctuation:no_comma"], [{}]), "x", {"max_response_chars": "lots"})
