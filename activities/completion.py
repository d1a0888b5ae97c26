"""One Chat Completions request and its reply, in gymflow's wire types: the request body for a model's config
(sampling, logprobs, token ids, a rollout header), the assistant message, and the per-turn token data.
"""

from __future__ import annotations

from typing import Any

from gymflow.activities.model_client import Completion, CompletionChoice, CompletionMessage

from gymflow.kernel.config import ModelConfig
from gymflow.kernel.wire import ChatMessage, FunctionCall, GenerateRequest, ToolCall


def request_body(cfg: ModelConfig, req: GenerateRequest) -> dict[str, Any]:
    body: dict[str, Any] = {"model": cfg.model, "messages": [m.to_openai() for m in req.messages]}
    if req.tools:
        body["tools"] = [t.to_openai() for t in req.tools]
    s = req.sampling
    for key in ("temperature", "top_p", "max_tokens", "seed"):
        if getattr(s, key) is not None:
            body[key] = getattr(s, key)
    if s.stop:
        body["stop"] = list(s.stop)
    if cfg.logprobs:
        body["logprobs"] = True
    extra = dict(cfg.extra_body)
    if cfg.return_token_ids:
        extra["return_token_ids"] = True
    if extra:
        body["extra_body"] = extra
    # Lets a model server (or a proxy, or the bench's mock) tell episodes apart, e.g. for prefix caching by episode.
    # Printable ASCII only: a header value may not carry what a task id may (non-ASCII, control characters).
    body["extra_headers"] = {"X-Gymflow-Rollout": "".join(c if " " <= c <= "~" else "?" for c in req.rollout_id)}
    return body


def to_message(msg: CompletionMessage) -> ChatMessage:
    calls = tuple(
        ToolCall(id=c.id or f"call_{i}", function=FunctionCall(name=c.function.name,
                                                               arguments=c.function.arguments or ""))
        for i, c in enumerate(msg.tool_calls or ())
    ) or None
    reasoning = msg.reasoning_content or msg.reasoning
    return ChatMessage(role="assistant", content=msg.content, tool_calls=calls,
                       reasoning_content=reasoning if isinstance(reasoning, str) else None)


def token_data(resp: Completion, choice: CompletionChoice, *, ids: bool = True, logprobs: bool = True
               ) -> dict[str, Any]:
    """The reply's token data, only what the model's config asked for (`return_token_ids`, `logprobs`): what an
    endpoint sends unasked is not stored (1.5 million unasked token ids once filled 24.8 MB of one turn)."""
    probs = None
    if logprobs and choice.logprobs is not None and choice.logprobs.content is not None:
        probs = [t.logprob for t in choice.logprobs.content]
    return {
        "prompt_token_ids": (resp.prompt_token_ids or choice.prompt_token_ids) if ids else None,
        "generation_token_ids": choice.token_ids if ids else None,
        "generation_log_probs": probs,
    }
