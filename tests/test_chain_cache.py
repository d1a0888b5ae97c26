"""The chain cache's byte bound counts what a cached chain holds: text, tool calls, and token ids and logprobs."""

from __future__ import annotations

from gymflow.activities.chain_cache import ChainCache

from gymflow.kernel.store.episodes import StoredMessage


def _turn(i: int, tokens: int) -> StoredMessage:
    meta = {"prompt_token_ids": list(range(tokens)), "generation_log_probs": [-0.5] * tokens, "model": "m"}
    return StoredMessage(i, i - 1 if i else None, i, "assistant", {"role": "assistant", "content": "ok"}, None, meta)


def test_token_data_counts_against_the_bound():
    cache = ChainCache(max_bytes=1 << 20)
    cache.put("small", [_turn(0, 10)])
    cache.put("long-prompt", [_turn(0, 20_000)])  # 40,000 numbers: over a MiB held, though its text is tiny
    assert cache.get("long-prompt") == ()  # too large to keep at all
    assert cache.get("small") != ()


def test_the_oldest_chain_goes_first_when_the_bound_is_passed():
    cache = ChainCache(max_bytes=1 << 20)
    for name in ("a", "b", "c"):
        cache.put(name, [_turn(0, 5_000)])  # ~320 KB each as counted: three fit, a fourth does not
    cache.get("a")  # used: now the newest
    cache.put("d", [_turn(0, 5_000)])
    assert [n for n in "abcd" if cache.get(n)] == ["a", "c", "d"]
