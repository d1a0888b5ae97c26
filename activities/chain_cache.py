"""Per-process cache of the episode chains this worker read or wrote last, one per rollout.

An episode is read at every turn (generate sends the whole prefix to the model; run_tools needs the head and
the state; finish verifies the whole). Keeping the chain a worker last saw makes each read fetch only what was
appended since (gymflow/kernel/store/episodes.py `read_chain_after`): a 200-turn episode costs O(turns) bytes
from Postgres instead of O(turns^2). Rows are append-only and ids never reused, so a cached prefix never goes
stale; a reset run's branch is detected and read whole. Bounded by an estimate of the bytes held, token ids
and logprobs included (a turn of a long prompt holds tens of thousands of them).
"""

from __future__ import annotations

import json
import os
from collections import OrderedDict
from collections.abc import Sequence

from gymflow.kernel.store.episodes import NewMessage, StoredMessage

DEFAULT_MB = 128


def message_size(body: dict) -> int:
    """A message's size as the episode limit counts it: its content plus its tool calls (cheap: no JSON)."""
    content = body.get("content")
    size = len(content) if isinstance(content, str) else len(repr(content)) if content is not None else 0
    for call in body.get("tool_calls") or ():
        size += len(str(call))
    return size


def state_size(state: dict | None) -> int:
    """The state's bytes as stored (JSON)."""
    return 0 if not state else len(json.dumps(state, default=str))


def _numbers(tokens: dict | None) -> int:
    return sum(len(v) for v in (tokens or {}).values() if isinstance(v, list))


# A stored number (token id or logprob) as the episode limit counts it: about what it takes as JSON.
STORED_BYTES_PER_NUMBER = 8


def new_message_size(message: NewMessage) -> int:
    """All a message stores, as limits.max_episode_bytes counts it: its content and tool calls, its state and its
    token data (a reply's 1.5 million token ids once went uncounted)."""
    return (message_size(message.body) + state_size(message.state)
            + STORED_BYTES_PER_NUMBER * _numbers(message.tokens))


# Stored messages never change (append-only, ids never reused): their sizes are kept, so counting an episode each
# turn serialises only the states it has not seen.
_SIZES: OrderedDict[int, int] = OrderedDict()
_SIZES_KEPT = 100_000


def stored_size(message: StoredMessage) -> int:
    """`new_message_size` of a stored message."""
    size = _SIZES.get(message.id)
    if size is None:
        size = (message_size(message.body) + state_size(message.state)
                + STORED_BYTES_PER_NUMBER * _numbers(message.tokens))
        _SIZES[message.id] = size
        if len(_SIZES) > _SIZES_KEPT:
            _SIZES.popitem(last=False)
    return size


# A token id or logprob held in a Python list: an 8-byte slot plus its int/float object (small ints are shared,
# token ids mostly are not).
_BYTES_PER_NUMBER = 32


def _size(message: StoredMessage) -> int:
    numbers = sum(len(v) for v in (message.tokens or {}).values() if isinstance(v, list))
    return 200 + message_size(message.body) + _BYTES_PER_NUMBER * numbers


class ChainCache:
    def __init__(self, max_bytes: int | None = None) -> None:
        self.max_bytes = max_bytes if max_bytes is not None else \
            int(float(os.environ.get("GYMFLOW_CHAIN_CACHE_MB", DEFAULT_MB)) * (1 << 20))
        self._chains: OrderedDict[str, tuple[tuple[StoredMessage, ...], int]] = OrderedDict()
        self._bytes = 0

    def get(self, rollout_id: str) -> tuple[StoredMessage, ...]:
        entry = self._chains.get(rollout_id)
        if entry is None:
            return ()
        self._chains.move_to_end(rollout_id)
        return entry[0]

    def put(self, rollout_id: str, chain: Sequence[StoredMessage]) -> None:
        self.drop(rollout_id)
        size = sum(_size(m) for m in chain)
        if size > self.max_bytes:
            return
        self._chains[rollout_id] = (tuple(chain), size)
        self._bytes += size
        while self._bytes > self.max_bytes:
            _, (_, dropped) = self._chains.popitem(last=False)
            self._bytes -= dropped

    def drop(self, rollout_id: str) -> None:
        entry = self._chains.pop(rollout_id, None)
        if entry is not None:
            self._bytes -= entry[1]
