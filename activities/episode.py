"""Activities of the by-reference workflow (`EpisodeWorkflow`): each reads the episode from Postgres and appends
what it produced there; Temporal gets ids and counters (docs/design-episode-data.md).

- `begin`: environment setup; the initial messages (with the initial state) start the chain; the row turns
  `running`.
- `generate`: continue the chain at the head: one model call, the assistant message appended with its token
  data. A retry of the same activity whose first attempt already stored its message returns that message
  instead of calling the model again.
- `run_tools`: every tool call of the head message, in order, each tool message appended with the state after
  it; a call that ends the episode (environments/base.py) stops the rest, which are answered "Not run".
- `finish`: verify the chain (unless the rollout failed) and persist the rollout row, with the transcript and
  the per-turn token data materialised from exactly the accepted chain.
"""

from __future__ import annotations

import copy
import time
from datetime import UTC, datetime
from typing import Any

from gymflow.activities import metrics
from gymflow.activities.boundary import STORE_RETRY_S, boundary, heartbeating, retry_store
from gymflow.activities.chain_cache import new_message_size, state_size, stored_size
from gymflow.activities.completion import request_body, to_message, token_data
from gymflow.activities.env_activities import EnvActivities, run_tool_call, setup_episode, verify_episode
from gymflow.activities.env_calls import tool_error
from gymflow.activities.env_processes import EnvProcesses
from gymflow.activities.episode_store import MAX_CONNECTIONS, EpisodeStore
from gymflow.activities.model_client import ModelClients, bad_response
from gymflow.activities.recorded import recorded
from gymflow.activities.redact import Redactor
from gymflow.environments.base import Environment, VerifyContext
from gymflow.environments.registry import get_environment
from pydantic import ValidationError
from temporalio import activity
from temporalio.exceptions import ApplicationError

from gymflow.kernel import names
from gymflow.kernel.episode_wire import (
    BeginRequest,
    Finished,
    FinishRequest,
    Generated,
    ToolsRan,
    Turned,
    TurnRequest,
    advanced,
    ends_after,
    episode_summary,
)
from gymflow.kernel.errors import GymflowError, TaskError
from gymflow.kernel.failures import (
    ENVIRONMENT_ERROR,
    REPLY_TOO_LARGE,
    TOO_MANY_TOOL_CALLS,
    TRANSCRIPT_TOO_LARGE,
    short_message,
)
from gymflow.kernel.store.episodes import (
    NewMessage,
    StoredMessage,
    latest_state,
    save_task_tools,
)
from gymflow.kernel.store.policy_versions import PolicyCache, reported_version
from gymflow.kernel.store.repo import Conn, mark_rollout_started, write_rollout
from gymflow.kernel.wire import (
    ChatMessage,
    GenerateRequest,
    RolloutRecord,
    Score,
    Task,
    ToolCall,
    ToolSpec,
    Usage,
    content_chars,
    not_run_message,
    sample_index_of,
)

_POLICIES = PolicyCache()  # the current policy version per model, at most ~0.5 s old
TOOLS_PART = "/tools"  # the producer suffix of the tool messages a `turn` activity appends after its reply
BEGIN_PART = "/begin"  # ... and of the initial messages of a `turn` activity that begins the episode
# What a reply may bring besides its text (all counted in limits.max_reply_chars too): a finish reason and a tool
# call id are short words in every real API.
MAX_FINISH_REASON_CHARS = 256
MAX_TOOL_CALL_ID_CHARS = 1024
MAX_STATE_BYTES = 16 << 20  # an environment's state (JSON bytes); environments.<env>.max_state_bytes overrides


def _chat(messages: list[StoredMessage]) -> tuple[ChatMessage, ...]:
    return tuple(ChatMessage.model_validate(m.body) for m in messages)


class EpisodeActivities(EpisodeStore):
    def __init__(self, database_url: str, models: ModelClients,
                 env_options: dict[str, dict[str, Any]] | None = None, store_retry_s: float = STORE_RETRY_S,
                 redactor: Redactor | None = None, processes: EnvProcesses | None = None,
                 max_connections: int = MAX_CONNECTIONS) -> None:
        super().__init__(database_url, store_retry_s, max_connections)
        self._models = models
        self._redactor = redactor or Redactor({})
        self._env_options = env_options or {}
        self._judges = EnvActivities(models, env_options)  # the judge plumbing, shared
        # Environment code runs in these supervised processes (None: in this loop, as tests may choose).
        self._processes = processes

    async def close(self) -> None:
        await super().close()
        if self._processes is not None:
            await self._processes.close()  # idempotent: the pool's builder closes it too

    # ---- activities ----------------------------------------------------------------------------------

    @activity.defn(name=names.EPISODE_BEGIN)
    async def begin(self, req: BeginRequest) -> int:
        with boundary():
            return await self._begin(req)

    async def _begin(self, req: BeginRequest, part: str = "") -> int:
        task = await self._task(req.run_id, req.task_id)
        metrics.rollout_started(req.run_id, task.env, req.model, activity.info().attempt)
        with boundary("environment", f"{task.env} setup"):
            env = get_environment(task.env)
            initial, state, tools = await setup_episode(env, task, self._processes, self._env_options.get(task.env))
            if _discovers(env):  # tools listed by a running service (I/O in the loop: only in-loop environments)
                found, state = await heartbeating(env.discover_tools(env.parse_task(task), dict(state)))
                tools = _with_discovered(tools, found)
            responds = _responds(env, task)
            if responds:  # its first observation (I/O in the loop: only in-loop environments respond)
                opening, state = await heartbeating(env.open_episode(env.parse_task(task), dict(state)))
                initial = [*initial, *opening]
        if not initial:
            raise TaskError("the task has no prompt messages")
        new = [NewMessage(role=m.role, body=m.model_dump(exclude_none=True)) for m in initial]
        # Whether the environment answers text turns, decided here on the env side and kept with the prompt: the
        # generate pool reads it from the episode without importing environment code.
        new[-1] = NewMessage(role=new[-1].role, body=new[-1].body, state=dict(state),
                             tokens={RESPONDS: True} if responds else None)

        async def running(conn: Conn) -> None:
            # The generate pool offers these to the model without importing environment code.
            await save_task_tools(conn, req.run_id, req.task_id, tools)
            await mark_rollout_started(conn, rollout_id=req.rollout_id, run_id=req.run_id, task_id=req.task_id,
                                       sample_index=req.sample_index, env=task.env, model=req.model,
                                       execution_id=activity.info().workflow_run_id,
                                       execution_started_at=req.execution_started_at)

        ids, earlier = await self._append(req.rollout_id, [], new, also=running, part=part)
        self._task_tools[(req.run_id, req.task_id)] = tools
        return earlier[-1].id if earlier else ids[-1]

    @activity.defn(name=names.EPISODE_GENERATE)
    async def generate(self, req: TurnRequest) -> Generated:
        with boundary(where=f"generate turn {req.turn}"):
            return await self._generate(req)

    @activity.defn(name=names.EPISODE_TURN)
    async def turn(self, req: TurnRequest) -> Turned:
        """generate, then run_tools on the reply: one local activity hop per turn instead of two, for episodes
        whose generation and environment are both local; with `req.begin`, the episode's setup first, and with
        `req.finish`, its verify and persist after when it ends in this turn. A retry finds what was stored
        (setup, reply, tool messages) instead of running it again. A failure after something was stored says
        what in its details, so the workflow keeps it (the recorded transcript ends where the episode did)."""
        stored: dict[str, Any] = {}
        try:
            if req.begin is not None:
                with boundary():
                    req = req.model_copy(update={"head_id": await self._begin(req.begin, BEGIN_PART)})
                stored["begun"] = req.head_id
            with boundary(where=f"generate turn {req.turn}"):
                gen = await self._generate(req)
            stored["generated"] = gen.model_dump(mode="json")
            ran = None
            if gen.tool_calls or gen.responds:
                with boundary():
                    ran = await self._run_tools(req.model_copy(update={"head_id": gen.head_id}), TOOLS_PART)
                stored["ran"] = ran.model_dump(mode="json")
            plan = req.finish
            if plan is None or not ends_after(ep := advanced(plan.episode, gen, ran), gen, ran, plan.max_turns):
                return Turned(generated=gen, ran=ran)
            summary = episode_summary(rollout_id=req.rollout_id, run_id=req.run_id, task_id=req.task_id,
                                      sample_index=plan.sample_index, ep=ep, failure=None, latency_s=0.0)
            with boundary():
                finished = await self._finish(FinishRequest(summary=summary, env=plan.env, model=req.model,
                                                            head_id=ep.head_id, verify=True,
                                                            started_at=ep.started_at,
                                                            execution_started_at=plan.execution_started_at))
            return Turned(generated=gen, ran=ran, finished=finished)
        except ApplicationError as err:
            if not stored:
                raise
            raise ApplicationError(err.message, stored, type=err.type, non_retryable=err.non_retryable,
                                   next_retry_delay=err.next_retry_delay) from None

    async def _generate(self, req: TurnRequest) -> Generated:
        info = activity.info()
        attempt = info.attempt
        known = self._chains.get(req.rollout_id)
        # A local generate re-run after its workflow task was lost (the worker died) must not call the model
        # again. Where this worker holds the episode exactly up to the head, it ran no generate after it.
        ran_here = info.is_local and attempt == 1 and bool(known) and known[-1].id == req.head_id
        if info.is_local and not ran_here:
            earlier = await self._counted_start(req.rollout_id)
        else:
            earlier = [] if ran_here else await self._already_produced(req.rollout_id)
        if earlier:  # the model call was paid for and stored; only the completion was lost
            return _generated(earlier[-1], attempt)
        cfg = self._models.config(req.model)
        task = await self._task(req.run_id, req.task_id)
        chain = await self._chain(req.rollout_id, req.head_id)
        started = time.monotonic()
        policy = await _POLICIES.current(req.model, self._read_policy)  # current as the request goes out
        if cfg.recorded:
            replayed = recorded(cfg.recorded).turn(req.task_id, req.turn, sample_index_of(req.rollout_id))
            message, finish, usage, tokens = replayed, "recorded", Usage(), {}
        else:
            tools = await self._tools(task, req.run_id)
            body = request_body(cfg, GenerateRequest(rollout_id=req.rollout_id, task_id=req.task_id,
                                                      turn=req.turn, model=req.model, messages=_chat(chain),
                                                      tools=tools, sampling=req.sampling))
            try:  # heartbeat while waiting for a slot of the model's concurrency limit too, not only the call
                resp = await heartbeating(self._models.limited_create(req.model, body), req.turn)
            except ApplicationError as e:
                metrics.generation_failed(req.model, e.type)
                raise
            choice = resp.choices[0]
            try:
                message = to_message(choice.message)
            except ValidationError as e:
                raise bad_response(req.model, short_message(e, 200)) from None
            finish = choice.finish_reason
            usage = Usage(prompt_tokens=(resp.usage and resp.usage.prompt_tokens) or 0,
                          completion_tokens=(resp.usage and resp.usage.completion_tokens) or 0)
            tokens = token_data(resp, choice, ids=cfg.return_token_ids, logprobs=cfg.logprobs)
            metrics.generation_done(req.model, time.monotonic() - started, usage)
        message = self._checked_reply(req, message, finish, tokens)
        if not message.tool_calls and any((m.tokens or {}).get(RESPONDS) for m in chain if m.role != "assistant"):
            tokens = {**tokens, RESPONDS: True}  # stored with the reply: a retry finds it (`_generated`)
        finish = self._redactor.text(finish) if finish else finish
        meta = {"finish_reason": finish, "usage": usage.model_dump(), "attempt": attempt, "model": req.model,
                "turn": req.turn, "latency_s": round(time.monotonic() - started, 4), **tokens,
                **self._redactor.body(await _POLICIES.turn_meta(req.model, self._read_policy, policy,
                                                                None if cfg.recorded else reported_version(resp)))}
        reply = [NewMessage(role="assistant", body=message.model_dump(exclude_none=True), tokens=meta)]
        _check_episode_size(req, chain, reply)
        ids, earlier = await self._append(req.rollout_id, chain, reply)
        if earlier:  # another attempt stored its reply first: that one is the episode's
            return _generated(earlier[-1], attempt)
        responds = bool(tokens.get(RESPONDS))
        if not message.tool_calls and not responds and not info.is_local:  # the last generation
            self._chains.drop(req.rollout_id)
        return Generated(head_id=ids[-1], tool_calls=len(message.tool_calls or ()), finish_reason=finish,
                         usage=usage, attempt=attempt, responds=responds)

    def _checked_reply(self, req: TurnRequest, message: ChatMessage, finish: str | None = None,
                       tokens: dict[str, Any] | None = None) -> ChatMessage:
        """The reply within the run's limits (else the turn fails typed and nothing of it is stored), with the
        worker's secrets redacted (activities/redact.py). Every field of it counts: ids and the finish reason too
        (a 3,000,000-character finish reason once failed six workflow tasks on Temporal's payload limit), and the
        token data, one character a number."""
        calls = message.tool_calls or ()
        if finish is not None and len(finish) > MAX_FINISH_REASON_CHARS:
            raise GymflowError(f"the reply of turn {req.turn} has a finish_reason of {len(finish)} characters, over "
                               f"{MAX_FINISH_REASON_CHARS}", failure_type=REPLY_TOO_LARGE)
        longest_id = max((len(c.id) for c in calls), default=0)
        if longest_id > MAX_TOOL_CALL_ID_CHARS:
            raise GymflowError(f"the reply of turn {req.turn} has a tool call id of {longest_id} characters, over "
                               f"{MAX_TOOL_CALL_ID_CHARS}", failure_type=REPLY_TOO_LARGE)
        size = (content_chars(message.content) + len(message.reasoning_content or "")
                + sum(len(c.id) + len(c.function.name) + len(c.function.arguments) for c in calls))
        numbers = max((len(v) for v in (tokens or {}).values() if isinstance(v, list)), default=0)
        if req.max_reply_chars is not None and max(size, numbers) > req.max_reply_chars:
            what = f"{size} characters" if size >= numbers else f"{numbers} token ids or logprobs in one list"
            raise GymflowError(f"the reply of turn {req.turn} has {what}, over limits.max_reply_chars="
                               f"{req.max_reply_chars}", failure_type=REPLY_TOO_LARGE)
        if req.max_tool_calls_per_turn is not None and len(calls) > req.max_tool_calls_per_turn:
            raise GymflowError(f"the reply of turn {req.turn} makes {len(calls)} tool calls, over "
                               f"limits.max_tool_calls_per_turn={req.max_tool_calls_per_turn}; none ran",
                               failure_type=TOO_MANY_TOOL_CALLS)
        if not self._redactor.hits(message.text, message.reasoning_content, *(c.id for c in calls),
                                   *(c.function.arguments for c in calls), *(c.function.name for c in calls)):
            return message
        # Redacted the same way everywhere, so a tool message's (redacted) tool_call_id still pairs with its call.
        return ChatMessage.model_validate(self._redactor.body(message.model_dump(exclude_none=True)))

    @activity.defn(name=names.EPISODE_RUN_TOOLS)
    async def run_tools(self, req: TurnRequest) -> ToolsRan:
        with boundary():
            return await self._run_tools(req)

    async def _run_tools(self, req: TurnRequest, part: str = "") -> ToolsRan:
        earlier = await self._already_produced(req.rollout_id, part)
        if earlier:
            return _tools_ran(earlier[-1].id, [m.tokens or {} for m in earlier])
        task = await self._task(req.run_id, req.task_id)
        chain = await self._chain(req.rollout_id, req.head_id)
        calls = ChatMessage.model_validate(chain[-1].body).tool_calls or ()
        env = get_environment(task.env)
        state = copy.deepcopy(latest_state(chain))  # tools may change it in place: never the cached one
        if not calls and _responds(env, task):
            return await self._respond(req, env, task, chain, state, part)
        new: list[NewMessage] = []
        ended_by: str | None = None
        max_state = _max_state_bytes(self._env_options.get(task.env))
        offered = {t.name for t in await self._tools(task, req.run_id)} if _discovers(env) else None
        for call in calls:
            if ended_by is not None:
                # After the episode ended nothing may change its state: answered, not run.
                new.append(NewMessage(role="tool", body=not_run_message(call, ended_by).model_dump(
                    exclude_none=True), tokens={"not_run": True}))
                continue
            message, after, failed, done = await self._one_tool(env, task, state, call, offered)
            if not failed and (size := state_size(after)) > max_state:
                # The state a model's calls grow is bounded per environment: the call is refused, as a tool error
                # the model sees, and the state stays as it was.
                message = tool_error(call, state, f"not run: the environment's state would hold {size} bytes, "
                                                  f"over its limit of {max_state} (environments.{task.env}"
                                                  ".max_state_bytes)").message
                failed, done = True, False
            else:
                state = after
            new.append(NewMessage(role="tool", body=self._redactor.body(message.model_dump(exclude_none=True)),
                                  tokens={"is_error": True} if failed else {"done": True} if done else None))
            ended_by = call.function.name if done else None
        if not new:
            raise GymflowError("run_tools: the head message has no tool calls", failure_type="internal_error")
        # The state once per turn, on its last tool message (latest_state reads the newest that has one): stored
        # on every tool message it grew quadratically (60 calls a turn each storing the whole mailbox: 240 MB).
        new[-1] = NewMessage(role="tool", body=new[-1].body, state=dict(state), tokens=new[-1].tokens)
        _check_episode_size(req, chain, new)
        ids, earlier = await self._append(req.rollout_id, chain, new, part=part)
        if earlier:  # an earlier attempt's tool messages are the episode's
            return _tools_ran(earlier[-1].id, [m.tokens or {} for m in earlier])
        return _tools_ran(ids[-1], [m.tokens or {} for m in new])

    async def _respond(self, req: TurnRequest, env: Environment, task: Task, chain: list[StoredMessage],
                       state: dict[str, Any], part: str) -> ToolsRan:
        """The environment's answer to a turn without tool calls (Environment.respond): one user message, which
        carries the state; `done` on it ends the episode."""
        with boundary("environment", f"{task.env} respond"):
            out = await heartbeating(env.respond(env.parse_task(task), state, _chat(chain)))
        if (size := state_size(out.state)) > (max_state := _max_state_bytes(self._env_options.get(task.env))):
            raise GymflowError(f"{task.env} respond: the episode state would hold {size} bytes, over its limit of "
                               f"{max_state}", failure_type=ENVIRONMENT_ERROR)
        new = [NewMessage(role="user", body=self._redactor.body({"role": "user", "content": out.content}),
                          state=dict(out.state), tokens={"responded": True, **({"done": True} if out.done else {})})]
        _check_episode_size(req, chain, new)
        ids, earlier = await self._append(req.rollout_id, chain, new, part=part)
        if earlier:  # an earlier attempt's answer is the episode's
            return _tools_ran(earlier[-1].id, [m.tokens or {} for m in earlier])
        return ToolsRan(head_id=ids[-1], calls=0, done=out.done)

    async def _one_tool(self, env: Environment, task: Task, state: dict[str, Any], call: ToolCall,
                        offered: set[str] | None = None) -> tuple[ChatMessage, dict[str, Any], bool, bool]:
        """(tool message, state after, failed, ended the episode)."""
        with boundary("environment", f"{task.env} tool {call.function.name[:80]!r}"):
            res = await run_tool_call(env, task, None, state, call, self._processes, self._env_options.get(task.env),
                                      offered)
        return res.message, dict(res.state), res.is_error, res.done

    @activity.defn(name=names.EPISODE_FINISH)
    async def finish(self, req: FinishRequest) -> Finished:
        with boundary():
            return await self._finish(req)

    async def _finish(self, req: FinishRequest) -> Finished:
        summary = req.summary
        chain = await self._chain(summary.rollout_id, req.head_id) if req.head_id is not None else []
        score = await self._verify(req, chain) if req.verify else None
        if req.started_at is not None:  # after verification: a slow verifier is part of the episode's latency
            summary = summary.model_copy(update={"latency_s": round(
                (datetime.now(UTC) - req.started_at).total_seconds(), 4)})
        if score is not None:
            summary = summary.model_copy(update={"reward": score.reward, "masked": score.masked,
                                                 "failure_type": score.failure_type})
        record = RolloutRecord(summary=summary, env=req.env, model=req.model, head_id=req.head_id,
                               score_details=self._redactor.body(score.details) if score else {},
                               execution_id=activity.info().workflow_run_id,
                               execution_started_at=req.execution_started_at)

        async def write() -> None:
            async with self._direct.connection() as conn:
                await write_rollout(conn, record)

        await retry_store(write, "persisting the rollout", budget_s=self.store_retry_s)
        self._chains.drop(summary.rollout_id)
        metrics.rollout_finished(record)
        return Finished(reward=summary.reward, masked=summary.masked, failure_type=summary.failure_type,
                        latency_s=summary.latency_s if req.started_at is not None else None)

    async def _verify(self, req: FinishRequest, chain: list[StoredMessage]) -> Score:
        task = await self._task(req.summary.run_id, req.summary.task_id)
        with boundary("environment", f"{task.env} verify"):
            env = get_environment(task.env)
            judge = self._judges._judge_chat(task.id, req.summary.sample_index)  # noqa: SLF001
            ctx = VerifyContext(policy_model=req.model, chat=judge,
                                options=dict(self._env_options.get(task.env, {})))
            return await verify_episode(env, None, _chat(chain), copy.deepcopy(latest_state(chain)), ctx, task,
                                        self._processes)


def _check_episode_size(req: TurnRequest, chain: list[StoredMessage], new: list[NewMessage]) -> None:
    """The episode with `new` appended must stay within limits.max_episode_bytes, counting all it stores (messages,
    states, token data): else the rollout fails here, typed, and `new` is not stored (the recorded transcript ends
    before the message that broke the limit)."""
    if req.max_episode_bytes is None:
        return
    size = sum(stored_size(m) for m in chain) + sum(new_message_size(m) for m in new)
    if size > req.max_episode_bytes:
        raise GymflowError(f"the episode would hold {size} bytes after turn {req.turn}, over "
                           f"limits.max_episode_bytes={req.max_episode_bytes}", failure_type=TRANSCRIPT_TOO_LARGE)


def _max_state_bytes(options: dict[str, Any] | None) -> int:
    value = (options or {}).get("max_state_bytes")
    return int(value) if value is not None else MAX_STATE_BYTES


def _tools_ran(head_id: int, metas: list[dict[str, Any]]) -> ToolsRan:
    """From the tool messages' metadata, so a retry whose first attempt stored them answers the same."""
    return ToolsRan(head_id=head_id, calls=sum(not m.get("not_run") and not m.get("responded") for m in metas),
                    errors=sum(bool(m.get("is_error")) for m in metas), done=any(m.get("done") for m in metas))


def _generated(message: StoredMessage, attempt: int) -> Generated:
    meta = message.tokens or {}
    calls = ChatMessage.model_validate(message.body).tool_calls or ()
    return Generated(head_id=message.id, tool_calls=len(calls), finish_reason=meta.get("finish_reason"),
                     usage=Usage.model_validate(meta.get("usage") or {}), attempt=attempt,
                     responds=bool(meta.get(RESPONDS)))


RESPONDS = "responds"  # on the prompt's last message: the environment answers text turns; on a reply: answered


def _discovers(env: Environment) -> bool:
    """Whether the environment lists some of its tools at run time (Environment.discover_tools): only one that runs
    in the loop, where that I/O happens."""
    return type(env).discover_tools is not Environment.discover_tools and env.in_loop_reason is not None


def _with_discovered(tools: tuple[ToolSpec, ...], found: list[ToolSpec]) -> tuple[ToolSpec, ...]:
    """The task's own tools, then the discovered ones it does not already name."""
    named = {t.name for t in tools}
    return (*tools, *(t for t in found if t.name not in named))


def _responds(env: Environment, task: Task) -> bool:
    """Whether the environment answers this task's turns without tool calls (only one that runs in the loop: its
    respond is I/O there)."""
    if type(env).responds is Environment.responds or env.in_loop_reason is None:
        return False
    return env.responds(task, env.parse_task(task))
