"""The model runtime: transformers on CPU, one sequence at a time, with our own sampling loop so that every
sampled token comes with its id and its logprob (log-softmax of the raw logits, before temperature and top-p,
as vLLM reports by default).

Not thread-safe by design: the server calls `generate` and `swap` from one worker thread only, which is what
makes a weight swap atomic between requests.
"""

from __future__ import annotations

import inspect
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache, PreTrainedModel

from gymflow.localmodel.request import BadRequest, ChatRequest
from gymflow.localmodel.tools import parse_tool_call, render_messages, template_supports_tools

log = logging.getLogger(__name__)


@dataclass
class Generation:
    text: str
    token_ids: list[int]
    logprobs: list[float]
    top_logprobs: list[list[tuple[int, float]]]
    prompt_token_ids: list[int]
    finish_reason: str
    tool_calls: list[dict[str, Any]] = field(default_factory=list)


def load_model(source: Path, gguf_file: str | None = None) -> PreTrainedModel:
    """A float32 model from a GGUF file (dequantized by transformers) or a HF safetensors directory."""
    kwargs: dict[str, Any] = {"gguf_file": gguf_file} if gguf_file else {}
    model = AutoModelForCausalLM.from_pretrained(str(source), dtype=torch.float32, **kwargs)
    if gguf_file:
        _drop_gguf_marker(model)
    return model.eval()


def _drop_gguf_marker(model: PreTrainedModel) -> None:
    """The weights are plain float tensors once dequantized, but transformers keeps a GGUF "quantizer" that makes
    `save_pretrained` refuse; drop it so that a trainer can save the checkpoint that `load_weights` reads."""
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    try:
        model.is_quantized = False
    except AttributeError:  # a read-only property in some transformers versions
        pass


def check_weights_dir(path: str | Path, shown: str | None = None) -> Path:
    """`path` when it holds a save_pretrained checkpoint; errors name it as `shown` (what the caller sent)."""
    p, shown = Path(path), shown if shown is not None else str(path)
    if not p.is_dir():
        raise BadRequest(f"`path` {shown!r} is not a directory")
    if not (p / "config.json").is_file() or not any(p.glob("*.safetensors")):
        raise BadRequest(f"`path` {shown!r} must hold config.json and *.safetensors (a model.save_pretrained "
                         "directory)")
    return p


class Engine:
    def __init__(self, model: PreTrainedModel, tokenizer: Any, version: str, name: str) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.version = version
        self.name = name
        self.context = int(getattr(model.config, "max_position_embeddings", 2048))
        self._tool_template = template_supports_tools(getattr(tokenizer, "chat_template", None))
        # Stop at the template's end-of-turn token and at any end-of-sequence token the model declares.
        ids = {tokenizer.eos_token_id, *(_as_list(getattr(model.generation_config, "eos_token_id", None)))}
        self.stop_ids = frozenset(i for i in ids if isinstance(i, int))

    @classmethod
    def from_source(cls, source: Path, gguf_file: str | None, version: str, name: str) -> Engine:
        started = time.monotonic()
        kwargs = {"gguf_file": gguf_file} if gguf_file else {}
        tokenizer = AutoTokenizer.from_pretrained(str(source), **kwargs)
        engine = cls(load_model(source, gguf_file), tokenizer, version, name)
        log.info("loaded %s (%s) in %.1fs", name, version, time.monotonic() - started)
        return engine

    def swap(self, model: PreTrainedModel, version: str) -> None:
        self.model, self.version = model, version

    def prompt_ids(self, req: ChatRequest) -> list[int]:
        if self._tool_template:
            msgs = [{k: v for k, v in m.items() if v or k == "content"} for m in req.messages]
            kwargs: dict[str, Any] = {"tools": req.tools or None}
        else:
            msgs, kwargs = render_messages(req.messages, req.tools), {}
        out = self.tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True, **kwargs)
        ids = out["input_ids"] if hasattr(out, "keys") else out
        return [int(i) for i in ids]

    def _budget(self, req: ChatRequest, n_prompt: int) -> int:
        room = self.context - n_prompt
        if req.max_tokens is None:
            if room < 1:
                raise _too_long(self.context, n_prompt, 1)
            return room
        if req.max_tokens > room:
            raise _too_long(self.context, n_prompt, req.max_tokens)
        return req.max_tokens

    def generate(self, req: ChatRequest) -> Generation:
        result = self.generate_batch([req])[0]
        if isinstance(result, Exception):
            raise result
        return result

    def generate_batch(self, reqs: list[ChatRequest]) -> list[Generation | BadRequest]:
        """Generate for several requests at once; the results in request order."""
        results: dict[int, Generation | BadRequest] = {}
        self.generate_continuous(list(zip(reqs, range(len(reqs)), strict=True)), lambda _free: [],
                                 results.__setitem__, max_rows=max(1, len(reqs)))
        return [results[i] for i in range(len(reqs))]

    @torch.inference_mode()
    def generate_continuous(self, first: list[tuple[ChatRequest, Any]],
                            admit: Callable[[int], list[tuple[ChatRequest, Any]]],
                            done: Callable[[Any, Generation | BadRequest], None], *, max_rows: int,
                            stopping: Callable[[], bool] = lambda: False, waiting: Callable[[], bool] = lambda: False,
                            check_every: int = 8) -> None:
        """Continuous batching on CPU: rows run together (left-padded, one forward pass per step for all of them,
        which on CPU costs about the same for 1 row as for 8: it is bound by reading the weights). Each row is
        handed to `done(handle, result)` the step it finishes, so a short request never waits for a long one.
        Every `check_every` steps, when `admit(free_rows)` brings new requests, the batch is rebuilt: finished rows
        leave, new ones join, and unfinished rows go on from their prompt plus what they generated so far (one
        re-prefill: the same logits, so ids and logprobs are those of an uninterrupted run). `stopping()` ends
        every row at once with a 503, so a server stops within a step; `waiting()` says whether requests wait to
        join (cheap: it is asked every `check_every` steps)."""
        active = self._start_rows(first, done)

        def should_yield() -> bool:  # rebuilding costs a prefill: only for a free row and someone to take it
            return stopping() or (sum(r.finish is None for _, r in active) < max_rows and waiting())

        while active:
            self._run(active, done, should_yield, check_every)
            if stopping():
                for handle, row in active:
                    if row.finish is None:
                        done(handle, BadRequest("the local model is shutting down", status=503))
                return
            active = [(h, r) for h, r in active if r.finish is None]
            if len(active) < max_rows:
                active += self._start_rows(admit(max_rows - len(active)), done)

    def _start_rows(self, jobs: list[tuple[ChatRequest, Any]], done: Callable[[Any, Generation | BadRequest], None],
                    ) -> list[tuple[Any, _Row]]:
        rows = []
        for req, handle in jobs:
            try:
                prompt = self.prompt_ids(req)
                rng = torch.Generator().manual_seed(req.seed % (1 << 64)) if req.seed is not None else None
                rows.append((handle, _Row(req, prompt, self._budget(req, len(prompt)), rng)))
            except BadRequest as e:
                done(handle, e)
        return rows

    def _run(self, active: list[tuple[Any, _Row]], done: Callable[[Any, Generation | BadRequest], None],
             should_yield: Callable[[], bool], check_every: int) -> None:
        """Step `active` until every row finishes, or until a check point (every `check_every` steps) finds that
        it should yield (the server stopping, or requests waiting to join)."""
        rows = [r for _, r in active]
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else min(self.stop_ids)
        contexts = [r.prompt + r.ids for r in rows]
        width = max(len(c) for c in contexts)
        input_ids = torch.tensor([[pad] * (width - len(c)) + c for c in contexts])
        mask = torch.tensor([[0] * (width - len(c)) + [1] * len(c) for c in contexts])
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        cache = {_cache_kwarg(self.model): DynamicCache(config=self.model.config)}  # filled in place, step by step
        step = 0
        while True:
            out = self.model(input_ids=input_ids, attention_mask=mask, position_ids=positions, use_cache=True,
                             logits_to_keep=1, **cache)
            logits = out.logits[:, -1].float()
            logprobs = torch.log_softmax(logits, dim=-1)
            for b, (handle, row) in enumerate(active):
                if row.finish is None:
                    row.advance(logits[b], logprobs[b], self)
                    if row.finish is not None:
                        done(handle, row.result(self.tokenizer))
            step += 1
            if all(r.finish for r in rows):
                return
            if step % check_every == 0 and should_yield():
                return
            # A finished row keeps stepping with its last token (wasted, ignored) until the batch is rebuilt.
            input_ids = torch.tensor([[r.ids[-1]] for r in rows])
            mask = torch.cat([mask, torch.ones((len(rows), 1), dtype=mask.dtype)], dim=1)
            positions = positions[:, -1:] + 1


@dataclass
class _Row:
    """One request's state inside a batch."""

    req: ChatRequest
    prompt: list[int]
    budget: int
    rng: torch.Generator | None
    ids: list[int] = field(default_factory=list)
    lps: list[float] = field(default_factory=list)
    tops: list[list[tuple[int, float]]] = field(default_factory=list)
    finish: str | None = None
    cut_text: str | None = None  # the text, when a stop string ended it

    def advance(self, logits: torch.Tensor, logprobs: torch.Tensor, engine: Engine) -> None:
        req = self.req
        token = _sample(logits, req.temperature, req.top_p, self.rng)
        self.ids.append(token)
        self.lps.append(float(logprobs[token]))
        if req.top_logprobs:
            top = torch.topk(logprobs, req.top_logprobs)
            self.tops.append([(int(i), float(v)) for v, i in zip(top.values, top.indices, strict=True)])
        if token in engine.stop_ids and not req.ignore_eos:
            self.finish = "stop"
        elif req.stop:
            text = engine.tokenizer.decode(self.ids, skip_special_tokens=True)
            cut = min((i for i in (text.find(s) for s in req.stop) if i >= 0), default=-1)
            if cut >= 0:  # vLLM: the text stops before the stop string; the token ids keep it
                self.cut_text, self.finish = text[:cut], "stop"
        if self.finish is None and len(self.ids) >= self.budget:
            self.finish = "length"

    def result(self, tokenizer: Any) -> Generation:
        text = self.cut_text if self.cut_text is not None else tokenizer.decode(self.ids, skip_special_tokens=True)
        call = parse_tool_call(text, self.req.tools) if self.finish == "stop" else None
        return Generation(text=text, token_ids=self.ids, logprobs=self.lps, top_logprobs=self.tops,
                          prompt_token_ids=self.prompt, finish_reason="tool_calls" if call else self.finish or "length",
                          tool_calls=[call] if call else [])


def _sample(logits: torch.Tensor, temperature: float, top_p: float, gen: torch.Generator | None) -> int:
    if temperature == 0.0:
        return int(torch.argmax(logits))
    probs = torch.softmax(logits / temperature, dim=-1)
    if top_p < 1.0:
        sorted_p, order = torch.sort(probs, descending=True)
        keep = torch.cumsum(sorted_p, dim=-1) - sorted_p < top_p  # the smallest prefix reaching top_p
        probs = torch.zeros_like(probs).scatter(0, order[keep], sorted_p[keep])
    return int(torch.multinomial(probs, 1, generator=gen))


def _too_long(context: int, n_prompt: int, wanted: int) -> BadRequest:
    # Worded like vLLM/OpenAI so that clients classify it as a context-length error.
    return BadRequest(f"This model's maximum context length is {context} tokens. However, you requested "
                      f"{n_prompt + wanted} tokens ({n_prompt} in the messages, {wanted} in the completion). "
                      "Please reduce the length of the messages or completion.", code="context_length_exceeded")


def _cache_kwarg(model: PreTrainedModel) -> str:
    # transformers renamed `past_key_values` to `cache` (5.x); use whichever this version's forward takes.
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def finite(x: float) -> float:
    """JSON has no -inf: a token of zero probability under the raw logits (possible only after a weight update
    that broke the model) is reported as the most negative float."""
    return x if math.isfinite(x) else -3.4e38
