"""Training records: the multi-turn sequence, its loss mask and logprobs, and continuity (drift) checks."""

from __future__ import annotations

import random

from gymflow.training.records import TurnTokens, build_sequence, continuity_breaks


def _episode(turns: int, seed: int = 0) -> tuple[list[TurnTokens], list[int], list[int], list[float]]:
    """A consistent episode: each prompt extends the previous prompt + generation with environment tokens.
    Returns the rows and the expected ids, mask and logprobs, built independently of build_sequence."""
    rng = random.Random(seed)
    rows, ids, mask, lps = [], [], [], []
    for k in range(turns):
        env = [rng.randrange(50_000) for _ in range(rng.randrange(1, 6))]
        gen = [rng.randrange(50_000) for _ in range(rng.randrange(1, 6))]
        lp = [-rng.random() for _ in gen]
        ids, mask, lps = ids + env, mask + [0] * len(env), lps + [0.0] * len(env)
        prompt = list(ids)
        ids, mask, lps = ids + gen, mask + [1] * len(gen), lps + lp
        rows.append(TurnTokens(turn=k, prompt_token_ids=prompt, generation_token_ids=gen, generation_log_probs=lp,
                               policy_version=f"v{k}"))
    return rows, ids, mask, lps


def test_consistent_turns_join_with_mask_on_generated_tokens_only():
    rows, ids, mask, lps = _episode(3, seed=1)
    seq = build_sequence(reversed(rows), turns=3)  # row order does not matter
    assert seq.tokens_available and not seq.token_drift and seq.drift_turns == []
    assert seq.input_ids == ids and seq.loss_mask == mask and seq.logprobs == lps
    assert len(seq.input_ids) == len(seq.loss_mask) == len(seq.logprobs)
    assert seq.turns == seq.turns_in_sequence == 3 and seq.policy_versions == ["v0", "v1", "v2"]
    generated = [t for r in rows for t in r.generation_token_ids]
    assert [t for t, m in zip(seq.input_ids, seq.loss_mask, strict=True) if m] == generated
    # Each sampled token carries the version of its own turn (an episode spanning versions under "continue").
    expected, length = [], 0
    for r in rows:
        expected += [None] * (len(r.prompt_token_ids) - length) + [r.policy_version] * len(r.generation_token_ids)
        length = len(r.prompt_token_ids) + len(r.generation_token_ids)
    assert seq.token_versions == expected and len(seq.token_versions) == len(seq.input_ids)
    assert {v for v in seq.token_versions if v} == {"v0", "v1", "v2"}


def test_rows_from_mappings_and_stale_turns_ignored():
    rows, ids, _, _ = _episode(2, seed=2)
    stale = TurnTokens(turn=2, prompt_token_ids=[9, 9], generation_token_ids=[9])  # an earlier attempt's leftover
    mappings = [{"turn": r.turn, "prompt_token_ids": r.prompt_token_ids, "generation_token_ids":
                 r.generation_token_ids, "generation_log_probs": r.generation_log_probs} for r in rows]
    seq = build_sequence([*mappings, stale], turns=2)
    assert seq.input_ids == ids and seq.turns_in_sequence == 2 and seq.policy_versions == [None, None]


def test_drift_is_recorded_and_the_sequence_cut_at_the_last_consistent_turn():
    rows, _, _, _ = _episode(4, seed=3)
    # Turn 2's prompt re-tokenised one earlier token (what a template that rewrites history does).
    bad = list(rows[2].prompt_token_ids)
    bad[1] += 1
    rows[2] = TurnTokens(turn=2, prompt_token_ids=bad, generation_token_ids=rows[2].generation_token_ids,
                         generation_log_probs=rows[2].generation_log_probs)
    seq = build_sequence(rows, turns=4)
    assert seq.token_drift and seq.drift_turns == [2, 3]  # turn 3 does not extend turn 2's recorded tokens
    assert seq.turns_in_sequence == 2 and seq.tokens_available
    prefix, _, _, _ = _episode(2, seed=3)
    expected = build_sequence(prefix, turns=2)
    assert seq.input_ids == expected.input_ids and seq.loss_mask == expected.loss_mask
    assert "drift at turn 2" in (seq.problem or "")
    assert continuity_breaks(rows) == [2, 3]


def test_no_token_ids_means_unavailable_not_a_crash():
    rows = [TurnTokens(turn=0, generation_log_probs=[-0.1]), TurnTokens(turn=1)]
    seq = build_sequence(rows, turns=2)
    assert not seq.tokens_available and seq.input_ids == [] and seq.logprobs is None
    assert "return_token_ids" in (seq.problem or "")
    assert not build_sequence([], turns=1).tokens_available
    gap, _, _, _ = _episode(3)
    assert not build_sequence([gap[0], gap[2]], turns=3).tokens_available  # turn 1's row is missing


def test_missing_logprobs_null_the_whole_logprob_column():
    rows, ids, mask, _ = _episode(2, seed=4)
    rows[1] = TurnTokens(turn=1, prompt_token_ids=rows[1].prompt_token_ids,
                         generation_token_ids=rows[1].generation_token_ids,
                         generation_log_probs=rows[1].generation_log_probs[:-1])  # misaligned: one short
    seq = build_sequence(rows, turns=2)
    assert seq.input_ids == ids and seq.loss_mask == mask and seq.logprobs is None


def test_hostile_values_are_not_token_ids():
    base = [1, 2, 3]
    for bad in ("123", [1, "2"], [1, True], [1, -1], [1, 2**40], [1.0], {"a": 1}, [None], "\x00" * 10):
        seq = build_sequence([TurnTokens(turn=0, prompt_token_ids=base, generation_token_ids=bad)], turns=1)
        assert not seq.tokens_available, bad
    for bad_lp in ([float("nan")], [0.5], ["x"], [None], "-0.1"):
        seq = build_sequence([TurnTokens(turn=0, prompt_token_ids=base, generation_token_ids=[4],
                                         generation_log_probs=bad_lp)], turns=1)
        assert seq.tokens_available and seq.logprobs is None, bad_lp
    seq = build_sequence([TurnTokens(turn=0, prompt_token_ids=base, generation_token_ids=[4],
                                     policy_version={"not": "a string"})], turns=1)
    assert seq.policy_versions == [None]


def test_a_later_turn_without_ids_cuts_the_sequence_there():
    rows, _, _, _ = _episode(3, seed=5)
    rows[2] = TurnTokens(turn=2)
    seq = build_sequence(rows, turns=3)
    assert seq.tokens_available and seq.turns_in_sequence == 2 and not seq.token_drift
    assert "turn 2 has no token ids" in (seq.problem or "")
