"""The generation activity (GPU pool): one Chat Completions call per turn, heartbeating while it waits.

Token ids and logprobs are written to Postgres here, keyed by (rollout, turn); the workflow only gets
the assistant message and usage.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import openai
from sqlalchemy.ext.asyncio import async_sessionmaker
from temporalio import activity

from activities.boundary import boundary
from activities.model_client import ModelClients, classify
from activities.recorded import recorded
from gymflow.kernel import names
from gymflow.kernel.config import ModelConfig
from gymflow.kernel.store.repo import save_generation
from gymflow.kernel.wire import ChatMessage, FunctionCall, GenerateRequest, GenerateResult, ToolCall, Usage


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
    return body


def _to_message(msg: Any) -> ChatMessage:
    calls = tuple(
        ToolCall(id=c.id or f"call_{i}", function=FunctionCall(name=c.function.name,
                                                               arguments=c.function.arguments or ""))
        for i, c in enumerate(msg.tool_calls or ())
    ) or None
    reasoning = getattr(msg, "reasoning_content", None) or getattr(msg, "reasoning", None)
    return ChatMessage(role="assistant", content=msg.content, tool_calls=calls,
                       reasoning_content=reasoning if isinstance(reasoning, str) else None)


def _token_data(resp: Any, choice: Any) -> dict[str, Any]:
    logprobs = None
    if choice.logprobs is not None and choice.logprobs.content is not None:
        logprobs = [t.logprob for t in choice.logprobs.content]
    extra = resp.model_extra or {}
    return {
        "prompt_token_ids": extra.get("prompt_token_ids") or (choice.model_extra or {}).get("prompt_token_ids"),
        "generation_token_ids": (choice.model_extra or {}).get("token_ids"),
        "generation_log_probs": logprobs,
    }


class GenerateActivities:
    def __init__(self, models: ModelClients, sessions: async_sessionmaker) -> None:
        self._models = models
        self._sessions = sessions

    async def _call_with_heartbeats(self, req: GenerateRequest, body: dict[str, Any]) -> Any:
        hb = activity.info().heartbeat_timeout
        every = min(hb.total_seconds() / 3, 5.0) if hb else 5.0
        call = asyncio.ensure_future(self._models.client(req.model).chat.completions.create(**body))
        try:
            while True:
                done, _ = await asyncio.wait({call}, timeout=every)
                if done:
                    return call.result()
                activity.heartbeat(req.turn)
        finally:
            call.cancel()

    async def _replay(self, cfg: ModelConfig, req: GenerateRequest, attempt: int) -> GenerateResult:
        assert cfg.recorded is not None
        with boundary():
            message = recorded(cfg.recorded).turn(req.task_id, req.turn)
        async with self._sessions.begin() as session:
            await save_generation(session, rollout_id=req.rollout_id, turn=req.turn, attempt=attempt, model=req.model,
                                  finish_reason="recorded", message=message.model_dump(exclude_none=True))
        return GenerateResult(message=message, finish_reason="recorded", attempt=attempt)

    @activity.defn(name=names.GENERATE)
    async def generate(self, req: GenerateRequest) -> GenerateResult:
        cfg = self._models.config(req.model)
        attempt = activity.info().attempt
        if cfg.recorded:
            return await self._replay(cfg, req, attempt)
        started = time.monotonic()
        async with self._models.limit(req.model):
            try:
                resp = await self._call_with_heartbeats(req, _request_body(cfg, req))
            except openai.OpenAIError as e:
                activity.logger.warning("generation failed: %s", type(e).__name__)
                raise classify(e, req.model) from None
        choice = resp.choices[0]
        message = _to_message(choice.message)
        usage = Usage(prompt_tokens=resp.usage.prompt_tokens if resp.usage else 0,
                      completion_tokens=resp.usage.completion_tokens if resp.usage else 0)
        async with self._sessions.begin() as session:
            await save_generation(
                session, rollout_id=req.rollout_id, turn=req.turn, attempt=attempt, model=req.model,
                finish_reason=choice.finish_reason, prompt_tokens=usage.prompt_tokens,
                completion_tokens=usage.completion_tokens, latency_s=time.monotonic() - started,
                message=message.model_dump(exclude_none=True), **_token_data(resp, choice),
            )
        return GenerateResult(message=message, finish_reason=choice.finish_reason, usage=usage, attempt=attempt)
