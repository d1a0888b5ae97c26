"""The generation activity (GPU pool): one Chat Completions call per turn, heartbeating while it waits.

Token ids and logprobs are written to Postgres here, keyed by (rollout, turn); the workflow only gets
the assistant message and usage.
"""

from __future__ import annotations

import time
from typing import Any

from pydantic import ValidationError
from sqlalchemy.ext.asyncio import async_sessionmaker
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities import metrics
from activities.boundary import STORE_RETRY_S, boundary, heartbeating, retry_read, retry_store
from activities.model_client import Completion, CompletionChoice, CompletionMessage, ModelClients, bad_response
from activities.recorded import recorded
from gymflow.kernel import names
from gymflow.kernel.config import ModelConfig
from gymflow.kernel.failures import short_message
from gymflow.kernel.store.repo import save_generation
from gymflow.kernel.wire import ChatMessage, FunctionCall, GenerateRequest, GenerateResult, ToolCall, Usage
from gymflow.training.policy import PolicyCache, reported_version

_POLICIES = PolicyCache()  # the current policy version per model, at most ~0.5 s old


def _request_body(cfg: ModelConfig, req: GenerateRequest) -> dict[str, Any]:
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


def _to_message(msg: CompletionMessage) -> ChatMessage:
    calls = tuple(
        ToolCall(id=c.id or f"call_{i}", function=FunctionCall(name=c.function.name,
                                                               arguments=c.function.arguments or ""))
        for i, c in enumerate(msg.tool_calls or ())
    ) or None
    reasoning = msg.reasoning_content or msg.reasoning
    return ChatMessage(role="assistant", content=msg.content, tool_calls=calls,
                       reasoning_content=reasoning if isinstance(reasoning, str) else None)


def _token_data(resp: Completion, choice: CompletionChoice) -> dict[str, Any]:
    logprobs = None
    if choice.logprobs is not None and choice.logprobs.content is not None:
        logprobs = [t.logprob for t in choice.logprobs.content]
    return {
        "prompt_token_ids": resp.prompt_token_ids or choice.prompt_token_ids,
        "generation_token_ids": choice.token_ids,
        "generation_log_probs": logprobs,
    }


class GenerateActivities:
    def __init__(self, models: ModelClients, sessions: async_sessionmaker,
                 store_retry_s: float = STORE_RETRY_S) -> None:
        self._models = models
        self._sessions = sessions
        self.store_retry_s = store_retry_s

    async def _replay(self, cfg: ModelConfig, req: GenerateRequest, attempt: int) -> GenerateResult:
        assert cfg.recorded is not None
        message = recorded(cfg.recorded).turn(req.task_id, req.turn)
        await self._save(req, dict(attempt=attempt, model=req.model, finish_reason="recorded",
                                   message=message.model_dump(exclude_none=True)))
        return GenerateResult(message=message, finish_reason="recorded", attempt=attempt)

    async def _read_policy(self, read: Any) -> Any:
        return await retry_read(self._sessions, read, "reading the policy version", budget_s=self.store_retry_s)

    async def _save(self, req: GenerateRequest, values: dict[str, Any]) -> None:
        """Write the turn's generation. The model call is paid for: retry the write here, never the call."""
        async def write() -> None:
            async with self._sessions.begin() as session:
                await save_generation(session, rollout_id=req.rollout_id, turn=req.turn, **values)

        await retry_store(write, f"saving generation turn {req.turn}", req.turn, budget_s=self.store_retry_s)

    @activity.defn(name=names.GENERATE)
    async def generate(self, req: GenerateRequest) -> GenerateResult:
        with boundary(where=f"generate turn {req.turn}"):
            return await self._generate(req)

    async def _generate(self, req: GenerateRequest) -> GenerateResult:
        cfg = self._models.config(req.model)
        attempt = activity.info().attempt
        if cfg.recorded:
            return await self._replay(cfg, req, attempt)
        policy = await _POLICIES.current(req.model, self._read_policy)  # current as the request goes out
        started = time.monotonic()
        try:  # heartbeat while waiting for a slot of the model's concurrency limit too, not only the call
            resp = await heartbeating(self._models.limited_create(req.model, _request_body(cfg, req)), req.turn)
        except ApplicationError as e:
            activity.logger.debug("generation failed: %s", e.type)  # the SDK logs the failure once
            metrics.generation_failed(req.model, e.type)
            raise
        choice = resp.choices[0]
        try:
            message = _to_message(choice.message)
        except ValidationError as e:  # e.g. a tool call id or name our wire types refuse
            raise bad_response(req.model, short_message(e, 200)) from None
        usage = Usage(prompt_tokens=(resp.usage and resp.usage.prompt_tokens) or 0,
                      completion_tokens=(resp.usage and resp.usage.completion_tokens) or 0)
        metrics.generation_done(req.model, time.monotonic() - started, usage)
        # The version that made this turn, as the episode shape records it (the server's own report wins).
        version = (await _POLICIES.turn_meta(req.model, self._read_policy, policy, reported_version(resp)))[
            "policy_version"]
        await self._save(req, dict(policy_version=version,
            attempt=attempt, model=req.model, finish_reason=choice.finish_reason, prompt_tokens=usage.prompt_tokens,
            completion_tokens=usage.completion_tokens, latency_s=time.monotonic() - started,
            message=message.model_dump(exclude_none=True), **_token_data(resp, choice)))
        return GenerateResult(message=message, finish_reason=choice.finish_reason, usage=usage, attempt=attempt)
