"""The columns TRL's GRPOTrainer takes from a `rollout_func`, built from gymflow groups. Pure functions.

Per completion (one per copy of a prompt, in the order TRL sent them): `prompt_ids` (turn 0's prompt as the
server tokenised it), `completion_ids` (everything after it: the model's turns and, between them, the tokens
the environment added), `logprobs` (the server's, 0.0 on environment tokens), `env_mask` (1 on generated
tokens, 0 on the environment's) and `gymflow_reward` (None where the member is not usable: TRL then gives it no
advantage). A member without a usable record (failed, masked, without token ids, or its group withheld) gets
a one-token stand-in whose mask is 0, so TRL learns nothing from it but still counts one completion per copy.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from gymflow.training.groups import Group
from gymflow.training.records import TrainingRecord, _token_ids

TRL_COLUMNS = ("prompt_ids", "completion_ids", "logprobs", "env_mask", "gymflow_reward", "gymflow_rollout_id",
               "gymflow_group_id", "gymflow_policy_versions")


@dataclass
class Completion:
    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float] | None
    env_mask: list[int]
    reward: float | None
    rollout_id: str
    group_id: str
    policy_versions: list[str | None] = field(default_factory=list)
    stand_in: bool = False  # no usable record: masked out entirely


def prompt_ids_of(record: TrainingRecord) -> list[int] | None:
    """Turn 0's prompt ids, when the record has a usable sequence."""
    if not record.sequence.tokens_available or not record.turns:
        return None
    return _token_ids(record.turns[0].prompt_token_ids)


def completion_of(record: TrainingRecord, group_id: str) -> Completion | None:
    """The record split where TRL wants it: the prompt, then the rest with its mask. None without tokens."""
    prompt = prompt_ids_of(record)
    seq = record.sequence
    if prompt is None or len(seq.input_ids) <= len(prompt) or seq.input_ids[:len(prompt)] != prompt:
        return None
    cut = len(prompt)
    return Completion(prompt, seq.input_ids[cut:], seq.logprobs[cut:] if seq.logprobs is not None else None,
                      seq.loss_mask[cut:], record.reward, record.rollout_id, group_id, list(seq.policy_versions))


def stand_in(prompt_ids: list[int], end_id: int, rollout_id: str, group_id: str) -> Completion:
    return Completion(list(prompt_ids), [end_id], [0.0], [0], None, rollout_id, group_id, stand_in=True)


def group_completions(group: Group, records: Sequence[TrainingRecord], fallback_prompt: Callable[[], list[int]],
                      end_id: int) -> list[Completion]:
    """One completion per member, in member order. A withheld group (dropped, stale) trains nothing.
    `fallback_prompt()` (the trainer's own tokenisation) is called only when no member has prompt ids."""
    by_id = {r.rollout_id: r for r in records}
    real = {m.rollout_id: completion_of(by_id[m.rollout_id], group.group_id) if group.trainable and
            m.rollout_id in by_id else None for m in group.members}
    # A stand-in reuses a sibling's prompt ids (the server's own tokenisation) when there is one.
    prompt = next((c.prompt_ids for c in real.values() if c is not None), None)
    if prompt is None:
        prompt = fallback_prompt()
    return [real[m.rollout_id] or stand_in(prompt, end_id, m.rollout_id, group.group_id) for m in group.members]


def trl_output(completions: Sequence[Completion]) -> dict[str, Any]:
    """The dict `rollout_func` returns. `logprobs` is None for the whole batch when a real completion has none
    (a server without logprobs): TRL then computes its own and skips the sampling correction."""
    with_lp = all(c.logprobs is not None for c in completions)
    return {
        "prompt_ids": [c.prompt_ids for c in completions],
        "completion_ids": [c.completion_ids for c in completions],
        "logprobs": [c.logprobs for c in completions] if with_lp else None,
        "env_mask": [c.env_mask for c in completions],
        "gymflow_reward": [c.reward for c in completions],
        "gymflow_rollout_id": [c.rollout_id for c in completions],
        "gymflow_group_id": [c.group_id for c in completions],
        "gymflow_policy_versions": [c.policy_versions for c in completions],
    }


def gymflow_reward(completions: Sequence[Any], gymflow_reward: Sequence[float | None] | None = None,
                   **_: Any) -> list[float | None]:
    """TRL reward function: the verifier's reward gymflow stored for each completion (None: not usable)."""
    if gymflow_reward is None:
        raise ValueError("gymflow_reward: no `gymflow_reward` column; use it with gymflow's rollout_func "
                         "(gymflow.integrations.trl.GymflowRollout)")
    if len(gymflow_reward) != len(completions):
        raise ValueError(f"gymflow_reward: {len(gymflow_reward)} rewards for {len(completions)} completions")
    return list(gymflow_reward)
