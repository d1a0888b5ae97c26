"""The OpenAI-compatible HTTP server in front of `Engine`.

An aiohttp event loop (its own thread) parses and validates requests; one worker thread runs the model, in
arrival order, with continuous batching (each row returns when it finishes; waiting requests join as rows free up,
so a long row never holds a short one), and a weight swap lands between two batches, never inside one. A waiting
request holds a future, not a thread. No request content is ever logged. The control endpoint
(`/v1/load_weights`) needs the control token and loads only from under the weights root (control.py).
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path
from typing import Any

from aiohttp import web

from gymflow.http_service import ThreadedHTTPService, json_app, listen_host, read_body
from gymflow.localmodel.control import WeightsRoot, authorized
from gymflow.localmodel.engine import Engine, Generation, check_weights_dir, finite, load_model
from gymflow.localmodel.request import BadRequest, ChatRequest, parse_request
from gymflow.localmodel.weights import fill_module, state_module

log = logging.getLogger(__name__)
MAX_BODY_BYTES = 16 << 20
MAX_VERSION_CHARS = 200
CONTROL_PATHS = frozenset({"/v1/load_weights"})  # need the control token


class _Worker:
    """One thread that runs every model call and every weight swap, in arrival order. Chat requests run with
    continuous batching (up to `max_batch` rows at once: each finishes on its own, waiting ones join as rows
    free up); a swap waits until the running rows finish and no chat request joins past it, so it is never inside
    a batch. Callers wait with a timeout."""

    QUEUED_NOTICE_S = 10.0  # at most one "queued" line per this many seconds

    def __init__(self, queue_size: int, max_batch: int, run_chats: Callable[..., None]) -> None:
        self._jobs: deque[tuple[str, Any, Future]] = deque()
        self._cond = threading.Condition()
        self._queue_size, self._max_batch, self._run_chats = queue_size, max_batch, run_chats
        self._stopping = False
        self._running = 0  # chat rows now in the batch
        self._last_notice = 0.0
        self.largest_batch = 0  # for tests and benchmarks
        self._thread = threading.Thread(target=self._run, name="localmodel-worker", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._thread.join(timeout=30)

    def _take(self) -> list[tuple[str, Any, Future]] | None:
        with self._cond:
            while not self._jobs and not self._stopping:
                self._cond.wait()
            if self._stopping:
                return None
            taken = [self._jobs.popleft()]
            while taken[0][0] == "chat" and self._jobs and self._jobs[0][0] == "chat" and len(taken) < self._max_batch:
                taken.append(self._jobs.popleft())
        return [job for job in taken if job[2].set_running_or_notify_cancel()]  # drop those whose caller left

    def _admit(self, free: int) -> list[tuple[Any, Future]]:
        """Chat requests at the head of the queue, to join the running batch (never past a waiting swap)."""
        taken = []
        with self._cond:
            while self._jobs and self._jobs[0][0] == "chat" and len(taken) < free:
                _, payload, fut = self._jobs.popleft()
                if fut.set_running_or_notify_cancel():
                    taken.append((payload, fut))
        return taken

    def _chat_waiting(self) -> bool:
        jobs = self._jobs  # read without the lock: a stale answer only moves a rebuild by a few steps
        return bool(jobs) and jobs[0][0] == "chat"

    def _run(self) -> None:
        while (jobs := self._take()) is not None:
            if not jobs:
                continue
            if jobs[0][0] == "call":
                fut = jobs[0][2]
                try:
                    fut.set_result(jobs[0][1]())
                except BaseException as e:  # noqa: BLE001 - handed to the waiting caller
                    fut.set_exception(e)
                continue
            self._chats([(payload, fut) for _, payload, fut in jobs])

    def _chats(self, first: list[tuple[Any, Future]]) -> None:
        pending: set[Future] = {fut for _, fut in first}

        def admit(free: int) -> list[tuple[Any, Future]]:
            joined = self._admit(free)
            pending.update(fut for _, fut in joined)
            self._running = len(pending)
            self.largest_batch = max(self.largest_batch, len(pending))
            return joined

        def done(fut: Future, result: Any) -> None:
            pending.discard(fut)
            self._running = len(pending)
            fut.set_exception(result) if isinstance(result, BaseException) else fut.set_result(result)

        self._running = len(pending)
        self.largest_batch = max(self.largest_batch, len(pending))
        try:
            self._run_chats(first, admit, done, lambda: self._stopping, self._chat_waiting)
        except BaseException as e:  # noqa: BLE001 - a bug or a broken model: every waiting request gets it
            for fut in pending:
                fut.set_exception(e)
        finally:
            self._running = 0

    def _submit(self, kind: str, payload: Any) -> Future:
        fut: Future = Future()
        with self._cond:
            if len(self._jobs) >= self._queue_size:
                raise BadRequest("the local model's queue is full; retry later", status=503)
            self._jobs.append((kind, payload, fut))
            self._cond.notify()
            if kind == "chat" and self._running >= self._max_batch:
                self._say_queued()
        return fut

    def _say_queued(self) -> None:
        now = time.monotonic()
        if now - self._last_notice >= self.QUEUED_NOTICE_S:
            self._last_notice = now
            log.info("request queued: %d rows running (--max-batch %d), %d waiting; each starts as a row finishes",
                     self._running, self._max_batch, sum(kind == "chat" for kind, _, _ in self._jobs))

    def call(self, fn: Callable[[], Any], timeout_s: float) -> Any:
        """From a thread: wait for `fn` to have run on the worker."""
        fut = self._submit("call", fn)
        try:
            return fut.result(timeout=timeout_s)
        except FutureTimeout:
            fut.cancel()
            raise _late(timeout_s) from None

    async def chat(self, req: ChatRequest, timeout_s: float) -> Any:
        """From the event loop: the completion, the loop free while the request waits and runs."""
        try:  # a timeout cancels the wrapped future, so a request not yet taken is dropped from its batch
            return await asyncio.wait_for(asyncio.wrap_future(self._submit("chat", req)), timeout_s)
        except TimeoutError:
            raise _late(timeout_s) from None


def _late(timeout_s: float) -> BadRequest:
    return BadRequest(f"the local model did not answer within {timeout_s:.0f}s", status=503)


def _logprobs(engine: Engine, gen: Generation) -> dict[str, Any]:
    def entry(token_id: int, logprob: float) -> dict[str, Any]:
        token = engine.tokenizer.decode([token_id])
        return {"token": token, "logprob": finite(logprob), "bytes": list(token.encode("utf-8", "replace"))}

    content = []
    for i, (tid, lp) in enumerate(zip(gen.token_ids, gen.logprobs, strict=True)):
        tops = gen.top_logprobs[i] if gen.top_logprobs else []
        content.append({**entry(tid, lp), "top_logprobs": [entry(t, v) for t, v in tops]})
    return {"content": content}


def completion_body(engine_name: str, version: str, req: ChatRequest, gen: Generation,
                    engine: Engine) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": None if gen.tool_calls else gen.text}
    if gen.tool_calls:
        message["tool_calls"] = gen.tool_calls
    choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": gen.finish_reason,
                              "logprobs": _logprobs(engine, gen) if req.logprobs else None}
    n_prompt, n_gen = len(gen.prompt_token_ids), len(gen.token_ids)
    body: dict[str, Any] = {
        "id": f"chatcmpl-{secrets.token_hex(12)}", "object": "chat.completion", "created": int(time.time()),
        "model": engine_name, "policy_version": version, "choices": [choice],
        "usage": {"prompt_tokens": n_prompt, "completion_tokens": n_gen, "total_tokens": n_prompt + n_gen}}
    if req.return_token_ids:  # vLLM's field names and places
        choice["token_ids"] = gen.token_ids
        body["prompt_token_ids"] = gen.prompt_token_ids
    return body


class LocalModelServer(ThreadedHTTPService):
    """`control_token` guards load_weights (a fresh random one when None: read it from `.control_token`);
    `weights_root` is where weights may be loaded from (None: load_weights is refused)."""

    def __init__(self, engine: Engine, host: str = "127.0.0.1", port: int = 0, queue_size: int = 256,
                 request_timeout_s: float = 600.0, max_batch: int = 8, control_token: str | None = None,
                 weights_root: str | Path | None = None) -> None:
        self.engine = engine
        self.request_timeout_s = request_timeout_s
        if control_token is not None and len(control_token) < 32:
            raise ValueError("the control token must be at least 32 characters")
        self.control_token = control_token or secrets.token_urlsafe(32)
        self.weights_root = WeightsRoot(weights_root) if weights_root is not None else None
        self._worker = _Worker(queue_size, max_batch, self._run_chats)
        self._max_batch = max_batch
        self._load_lock = threading.Lock()
        self._standby: Any = None  # the module swapped out last by load_state: the next one is copied into it
        self._serve(json_app(self._get, self._post, MAX_BODY_BYTES), listen_host(host), port, "localmodel-http")

    def start(self) -> LocalModelServer:
        self._worker.start()
        return super().start()

    def stop(self) -> None:
        super().stop()
        self._worker.stop()

    def serve_forever(self) -> None:
        self._worker.start()
        try:
            super().serve_forever()
        finally:
            self._worker.stop()

    # --- endpoints -------------------------------------------------------------------------------------------

    def models(self) -> dict[str, Any]:
        e = self.engine
        return {"object": "list", "data": [{"id": e.name, "object": "model", "owned_by": "gymflow",
                                            "policy_version": e.version, "max_model_len": e.context}]}

    async def chat(self, body: Any) -> dict[str, Any]:
        req = parse_request(body)
        if req.model is not None and req.model != self.engine.name:
            raise BadRequest(f"The model `{req.model[:100]}` does not exist; this server serves "
                             f"`{self.engine.name}`", status=404, code="model_not_found")

        return await self._worker.chat(req, self.request_timeout_s)

    def _run_chats(self, first: list[tuple[ChatRequest, Any]], admit: Callable[[int], list[tuple[ChatRequest, Any]]],
                   done: Callable[[Any, Any], None], stopping: Callable[[], bool], waiting: Callable[[], bool]) -> None:
        """On the worker thread: the version read when a row finishes is the one that produced it (a swap only
        lands between batches)."""
        e = self.engine

        def finished(handle: tuple[ChatRequest, Any], gen: Generation | BadRequest) -> None:
            req, fut = handle
            done(fut, gen if isinstance(gen, BadRequest) else completion_body(e.name, e.version, req, gen, e))

        def as_jobs(jobs: list[tuple[ChatRequest, Any]]) -> list[tuple[ChatRequest, tuple[ChatRequest, Any]]]:
            return [(req, (req, fut)) for req, fut in jobs]

        e.generate_continuous(as_jobs(first), lambda free: as_jobs(admit(free)), finished,
                              max_rows=self._max_batch, stopping=stopping, waiting=waiting)

    def load_weights(self, body: Any) -> dict[str, Any]:
        if not isinstance(body, dict):
            raise BadRequest("the request body must be a JSON object")
        if self.weights_root is None:
            raise BadRequest("loading weights is disabled: start the server with --weights-root DIR", status=403)
        path, version = body.get("path"), body.get("version")
        if not isinstance(path, str) or not path:
            raise BadRequest("`path` must be a directory path (a model.save_pretrained directory)")
        if not isinstance(version, str) or not version.strip() or len(version) > MAX_VERSION_CHARS:
            raise BadRequest(f"`version` must be a non-empty string of at most {MAX_VERSION_CHARS} characters")
        directory = check_weights_dir(self.weights_root.directory(path), shown=path)
        with self._load_lock:  # one load at a time; generation goes on while the new weights load
            started = time.monotonic()
            try:
                model = load_model(directory)
            except (OSError, ValueError, RuntimeError) as e:
                raise BadRequest(f"could not load weights from {path!r}: {str(e)[:300]}") from None
            if model.config.vocab_size != self.engine.model.config.vocab_size:
                raise BadRequest(f"weights in {path!r} have vocab size {model.config.vocab_size}, the served "
                                 f"tokenizer needs {self.engine.model.config.vocab_size}")
            self._worker.call(lambda: self.engine.swap(model, version), self.request_timeout_s)
        log.info("loaded weights version %s in %.1fs", version, time.monotonic() - started)
        return {"policy_version": version, "load_s": round(time.monotonic() - started, 3)}

    def load_state(self, state: Mapping[str, Any], version: str) -> dict[str, Any]:
        """In-process weight sync for a trainer that runs this server on its own threads: `state` (a state dict,
        e.g. `model.state_dict()`) is copied into a standby module and swapped in between batches; no file, no
        HTTP. The previous version keeps serving until the swap, and on any error."""
        if not isinstance(version, str) or not version.strip() or len(version) > MAX_VERSION_CHARS:
            raise ValueError(f"`version` must be a non-empty string of at most {MAX_VERSION_CHARS} characters")
        with self._load_lock:
            started = time.monotonic()
            standby = self._standby
            if standby is None:
                standby = state_module(self.engine.model, state)
            else:
                fill_module(standby, state)
            self._standby = None  # half-filled after an error: rebuilt next time
            previous = self.engine.model
            self._worker.call(lambda: self.engine.swap(standby, version), self.request_timeout_s)
            self._standby = previous  # out of use: swaps land between batches, on the worker thread
        log.info("loaded weights version %s in process in %.2fs", version, time.monotonic() - started)
        return {"policy_version": version, "load_s": round(time.monotonic() - started, 3)}

    # --- HTTP ------------------------------------------------------------------------------------------------

    async def _get(self, request: web.Request) -> web.Response:
        log.debug("GET %s", request.raw_path)  # request lines only at debug: never bodies
        path = request.raw_path
        if path in ("/v1/models", "/models"):
            return _send(200, self.models())
        if path == "/health":
            return _send(200, {"status": "ok", "policy_version": self.engine.version})
        return _error(404, f"no such endpoint: GET {path[:100]}")

    async def _post(self, request: web.Request) -> web.Response:
        log.debug("POST %s", request.raw_path)
        path = request.raw_path
        if path not in ("/v1/chat/completions", "/v1/load_weights"):
            return _error(404, f"no such endpoint: POST {path[:100]}")
        if path in CONTROL_PATHS and not authorized(request.headers.get("Authorization"), self.control_token):
            return _error(401, "load_weights needs `Authorization: Bearer <control token>` (the server's token "
                               "file)", "unauthorized", close=True)  # the body is never read
        try:
            raw = await read_body(request, MAX_BODY_BYTES)
            if raw is None:
                return _error(413, f"the request body is over {MAX_BODY_BYTES} bytes", close=True)
            try:
                body = json.loads(raw or b"null")
            except (ValueError, UnicodeDecodeError) as e:
                raise BadRequest(f"the request body is not valid JSON: {str(e)[:120]}") from None
            if path == "/v1/chat/completions":
                return _send(200, await self.chat(body))
            return _send(200, await asyncio.to_thread(self.load_weights, body))  # loads for seconds: not here
        except BadRequest as e:
            return _error(e.status, str(e), e.code)
        except Exception as e:  # noqa: BLE001 - a bug or a broken model: a 500 the client may retry
            log.exception("local model request failed")
            return _error(500, f"local model error: {type(e).__name__}: {str(e)[:200]}")


def _send(status: int, payload: dict[str, Any]) -> web.Response:
    return web.Response(status=status, body=json.dumps(payload).encode(), content_type="application/json")


def _error(status: int, message: str, code: str | None = None, close: bool = False) -> web.Response:
    kind = "invalid_request_error" if status < 500 else "server_error"
    resp = _send(status, {"error": {"message": message, "type": kind, "code": code}})
    if close:
        resp.force_close()
    return resp
