"""The learning half of examples/grpo_local.py: group-normalised advantages and one clipped policy-gradient
step on token-exact records (gymflow/training/records.py). Plain PyTorch; nothing here knows about gymflow's
stack."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from gymflow.training.records import TokenSequence


@dataclass
class Sample:
    seq: TokenSequence  # input_ids, loss_mask (1 on generated tokens), logprobs (the server's, old policy)
    advantage: float


@dataclass
class StepStats:
    loss: float
    grad_norm: float
    weight_change: float  # L2 norm of (new - old) parameters: proof the update moved the weights
    samples: int
    tokens: int
    clip_fraction: float  # of generated tokens, averaged over the epochs
    max_logprob_gap: float  # |trainer logprob - server logprob| before the update; ~1e-5 when on-policy


def group_advantages(rewards: Sequence[float], eps: float = 1e-6) -> list[float]:
    """GRPO's (r - mean) / std within one group; all zeros when every member scored the same (nothing to
    learn from that group)."""
    if not rewards:
        return []
    mean = sum(rewards) / len(rewards)
    std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / len(rewards))
    if std < eps:
        return [0.0] * len(rewards)
    return [(r - mean) / std for r in rewards]


def _batch(samples: Sequence[Sample]) -> tuple[torch.Tensor, ...]:
    """Right-padded ids, attention mask, loss mask and old logprobs, shifted so that position t predicts t+1."""
    width = max(len(s.seq.input_ids) for s in samples)
    ids = torch.zeros(len(samples), width, dtype=torch.long)
    attn = torch.zeros(len(samples), width, dtype=torch.long)
    mask = torch.zeros(len(samples), width, dtype=torch.float32)
    old = torch.zeros(len(samples), width, dtype=torch.float32)
    for i, s in enumerate(samples):
        n = len(s.seq.input_ids)
        ids[i, :n] = torch.tensor(s.seq.input_ids)
        attn[i, :n] = 1
        mask[i, :n] = torch.tensor(s.seq.loss_mask, dtype=torch.float32)
        old[i, :n] = torch.tensor(s.seq.logprobs or [0.0] * n)
    return ids, attn, mask[:, 1:], old[:, 1:]


def _token_logprobs(model: torch.nn.Module, ids: torch.Tensor, attn: torch.Tensor, mask: torch.Tensor
                    ) -> torch.Tensor:
    """log p(token t+1 | ..t) where `mask` is set, 0 elsewhere. The 49k-wide output layer runs only on the
    generated positions: on CPU it would otherwise cost as much as the rest of the model for the prompt."""
    hidden = model.base_model(input_ids=ids, attention_mask=attn).last_hidden_state[:, :-1]
    where = mask.bool()
    logits = model.get_output_embeddings()(hidden[where]).float()
    picked = torch.log_softmax(logits, dim=-1).gather(-1, ids[:, 1:][where][:, None]).squeeze(-1)
    out = torch.zeros(mask.shape, dtype=picked.dtype)
    out[where] = picked
    return out


def policy_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, samples: Sequence[Sample],
                clip_eps: float = 0.2, max_grad_norm: float = 1.0, epochs: int = 1) -> StepStats:
    """`epochs` optimizer steps on one batch of the clipped surrogate -min(ratio * A, clip(ratio) * A), each
    sequence's tokens averaged, then averaged over sequences (GRPO; no KL term). `ratio` is against the
    behaviour logprobs, the server's, token by token (whichever policy version sampled each token), so it is an
    importance ratio: 1 on a fresh batch's first epoch, and the clip acts from the second epoch on or when the
    batch was sampled by an older version (the off-policy mode of examples/grpo_local.py)."""
    learnable = [s for s in samples if s.advantage != 0.0 and s.seq.logprobs is not None and any(s.seq.loss_mask)]
    if not learnable:
        return StepStats(0.0, 0.0, 0.0, 0, 0, 0.0, 0.0)
    ids, attn, mask, old = _batch(learnable)
    adv = torch.tensor([s.advantage for s in learnable], dtype=torch.float32)[:, None]
    before = [p.detach().clone() for p in model.parameters()]
    tokens = float(mask.sum())
    clip_fracs, gap, loss, grad_norm = [], 0.0, torch.tensor(0.0), torch.tensor(0.0)
    for epoch in range(epochs):
        model.train()
        new = _token_logprobs(model, ids, attn, mask)
        ratio = torch.exp(new - old)
        clipped = torch.clamp(ratio, 1 - clip_eps, 1 + clip_eps)
        per_token = -torch.minimum(ratio * adv, clipped * adv)
        per_seq = (per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1)
        loss = per_seq.mean()  # ~0 on a fresh batch (advantages sum to 0 per group); its gradient is not
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
        optimizer.step()
        with torch.no_grad():
            clip_fracs.append(float((((ratio - clipped).abs() > 1e-6).float() * mask).sum() / max(tokens, 1.0)))
            if epoch == 0:
                gap = float(((new - old).abs() * mask).max())
    model.eval()
    with torch.no_grad():
        change = math.sqrt(sum(float((p - b).pow(2).sum()) for p, b in zip(model.parameters(), before, strict=True)))
    return StepStats(float(loss.detach()), float(grad_norm), change, len(learnable), int(tokens),
                     sum(clip_fracs) / len(clip_fracs), gap)
