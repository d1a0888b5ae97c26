"""NeMo RL on gymflow: the environment actor NeMo RL drives in place of NeMo Gym, each row run as a gymflow rollout.

Read at NVIDIA-NeMo/RL@7ea279abfbeb698b092856d0dab61e7cf39bc909: `nemo_rl/environments/nemo_gym.py` (the Ray
actor `NemoGym(cfg: NemoGymConfig)`: `_spinup()`, `set_tokenizer(tokenizer)`, `health_check()`,
`run_rollouts(nemo_gym_examples, timer_prefix, deduplicate_multimodal_data=False)` streaming `(row["_rowidx"],
result, timing_metrics | None)`, `shutdown()`; `spinup_nemo_gym_actor(...)` builds it) and
`nemo_rl/experience/rollouts.py` (`run_async_nemo_gym_rollout`, which stamps sampling and `_rowidx` on the rows,
calls `run_rollouts.options(num_returns="streaming").remote(...)`, tensorizes `token_ids` and
`generation_logprobs`, and restores input order per `num_generations` group).

`GymflowNemoGym` has that surface. A result is NeMo RL's: `message_log` (alternating `user` messages holding the
tokens the policy did not generate and `assistant` messages holding `token_ids`, `generation_logprobs`,
`is_invalid_tool_call`, `has_malformed_thinking`), `input_message_log` (its first message) and `full_result` (the
verifier's details, `responses_create_params` as sent, the episode as a Responses `response`, `reward`, and
`gymflow`: the rollout id, group id and policy versions). Token ids and logprobs are the ones stored for the
rollout (gymflow.training.records), as plain lists: NeMo RL's `_tensorize_nemo_gym_result` makes the tensors.

Rows -> rollouts: a row's environment is the one its `agent_ref.name` names (gymflow.data.routing, or
`agent_envs` in the config), its task the dataset loader's (gymflow.data.datasets.row_to_task). The copies of one
row in a batch are one gymflow group (gymflow.training.iterator); its task id is a hash of the row (NeMo RL's own
`_rowidx` / `_ng_task_index` left out) and the group size. Its epoch is NeMo RL's `_ng_task_index` when the rows
carry one (the async collector stamps and checkpoints it), so the same rows always name the same rollouts: a
retried or restarted call attaches to them and nothing runs twice. Without it, the epoch is how many groups of
that task this actor handed over, advanced only once a group was delivered, so a retry attaches too.

Faults are typed, and survive Ray's pickling: `StackUnavailable` (a ConnectionError, so NeMo RL's
`classify_rollout_failure` calls it infra and redispatches) when Temporal, Postgres or the client's loop are gone;
`RolloutInfraFailed` (ConnectionError) / `RolloutDataFailed` (ValueError) after the other groups were streamed,
listing each failed row with its gymflow failure type (a failed or masked rollout is never scored 0);
`RowsRefused` before anything starts for rows whose environment is not installed or that do not fit it.

Swapping it in (Ray is not needed to import this module): NeMo RL builds its actor in
`spinup_nemo_gym_actor`; `spinup_gymflow_actor` takes the same arguments and returns
`ray.remote(GymflowNemoGym)` spun up the same way; patch it in where `nemo_rl.algorithms.grpo` imports it, and
add `env.nemo_gym.gymflow` (docs/training.md).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import copy
import dataclasses
import hashlib
import json
import logging
import time
from collections import Counter
from collections.abc import AsyncGenerator, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError
from temporalio.service import RPCError

from gymflow.client import GymflowClient, check_collectable
from gymflow.data.routing import agent_environment, route_problem
from gymflow.integrations.loop import LoopGone, LoopThread
from gymflow.integrations.nemo_rl_errors import (
    FailedRow,
    RolloutDataFailed,
    RolloutFailed,
    RolloutInfraFailed,
    RowsRefused,
    StackUnavailable,
    rollout_failure,
)
from gymflow.integrations.nemo_rl_models import CONFIG_KEY, model_entries, resolve_models
from gymflow.kernel import failures
from gymflow.kernel.config import Settings, load_settings
from gymflow.kernel.connect import TemporalUnreachable
from gymflow.kernel.errors import ConfigError, GymflowError, TaskError
from gymflow.kernel.recorded_ids import NG_TASK_INDEX
from gymflow.kernel.wire import ChatMessage, Task
from gymflow.training.groups import Group, usable
from gymflow.training.iterator import Position, RolloutIterator
from gymflow.training.records import TrainingRecord, group_records
from gymflow.training.rows import split_transcript

log = logging.getLogger(__name__)
ROW_INDEX = "_rowidx"  # NeMo RL's position of a row in its batch (rollouts.py `_prepare_nemo_gym_rows`)
COLLECT_TIMEOUT_S = 3600.0
# NeMo RL's defaults for flagging an assistant turn (nemo_gym.py DEFAULT_INVALID_TOOL_CALL_PATTERNS / THINKING_TAGS).
INVALID_TOOL_CALL_PATTERNS = ("<tool_call>", "</tool_call>", "<function_call>", "</function_call>")
THINKING_TAGS = ("<think>", "</think>")


# ---- the plan: rows -> groups -> rollouts ------------------------------------------------------------------


@dataclass
class _Plan:
    key: tuple[str, int | None]  # (row hash, _ng_task_index)
    task: Task
    rows: list[int]  # positions in the batch, in order
    row_indices: list[int]  # their _rowidx
    epoch: int
    counted: bool  # epoch from this actor's counter (no _ng_task_index): advance it once delivered
    model: str
    payload: list[dict]  # the rows as NeMo RL sent them (their responses_create_params go back in full_result)


def _row_hash(row: Mapping[str, Any]) -> str:
    text = json.dumps(row, sort_keys=True, ensure_ascii=False, default=str, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def _ng_index(row: Mapping[str, Any]) -> int | None:
    value = row.get(NG_TASK_INDEX)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _agent(row: Any) -> str:
    ref = row.get("agent_ref") if isinstance(row, dict) else None
    name = ref.get("name") if isinstance(ref, dict) else None
    return name if isinstance(name, str) else "?"


def _malformed_thinking(text: str, tags: Sequence[str], reasoning: bool) -> bool:
    # NeMo RL: any tag in a final answer is malformed; in a reasoning summary only a repeated one is.
    return any(text.count(t) > (1 if reasoning else 0) for t in tags)


class GymflowNemoGym:
    """NeMo RL's `NemoGym` environment actor, on gymflow. `cfg` is NeMo RL's `NemoGymConfig`: `model_name`,
    `base_urls`, `initial_global_config_dict` (env.nemo_gym, whose `gymflow` section configures this class), and
    optionally `invalid_tool_call_patterns`, `thinking_tags`, `require_routed_experts`. `client`/`loop` (keyword
    only, not NeMo RL's) hand it a connected client and the loop it lives on instead of connecting in _spinup."""

    def __init__(self, cfg: Mapping[str, Any], *, client: GymflowClient | None = None,
                 loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.cfg = dict(cfg)
        if self.cfg.get("require_routed_experts"):
            raise ConfigError("policy.router_replay.enabled needs routed_experts per token, which gymflow does not "
                              "record; turn router replay off to train on gymflow rollouts")
        section = (self.cfg.get("initial_global_config_dict") or {}).get(CONFIG_KEY) or {}
        if not isinstance(section, Mapping):
            raise ConfigError(f"env.nemo_gym.{CONFIG_KEY} must be a mapping, got {type(section).__name__}")
        self.section = dict(section)
        self.run_id = str(self.section.get("run_id") or "nemo-rl")
        self.agent_envs: dict[str, str] = dict(self.section.get("agent_envs") or {})
        self.max_retries = int(self.section.get("max_retries", 2))
        self.timeout_s = float(self.section.get("timeout_s", COLLECT_TIMEOUT_S))
        self.client, self.loop = client, loop
        self._own_loop: LoopThread | None = None
        self.models: list[str] = []  # gymflow model per NeMo RL base URL, in their order
        self.groups_used: Counter[str] = Counter()  # per task id: counted epochs handed over
        self._tokenizer: Any = None
        self._spun_up = False

    # ---- NeMo RL's lifecycle ---------------------------------------------------------------------------

    def _spinup(self) -> None:
        """Connect (unless given a client) and find the gymflow model serving NeMo RL's base URLs."""
        settings = self.client.settings if self.client is not None else self._settings()
        self.models = resolve_models(settings, list(self.cfg.get("base_urls") or []), str(self.cfg.get(
            "model_name") or ""), self.section.get("model"))
        if self.client is None:
            self._own_loop = LoopThread()
            self.loop = self._own_loop.loop
            try:
                self.client = self._own_loop.run(GymflowClient.connect(
                    settings, wait_s=float(self.section.get("connect_wait_s", 60))))
            except (GymflowError, RPCError, OSError) as e:
                self._own_loop.close()
                self._own_loop = self.loop = None
                raise StackUnavailable(f"gymflow: cannot reach Temporal / Postgres ({e}); start the stack "
                                       "(`gymflow up`) and spin up again") from None
        self._spun_up = True

    def _settings(self) -> Settings:
        return load_settings(self.section.get("config"))

    def set_tokenizer(self, tokenizer: Any) -> None:
        """The policy's tokenizer, only to decode each turn into `generation_str` / `prompt_str` as NeMo RL does
        (token ids come from the store, never from re-tokenising)."""
        self._tokenizer = tokenizer

    def health_check(self) -> None:
        """Raise StackUnavailable when Postgres or Temporal does not answer."""
        self._require_spinup()
        import sqlalchemy as sa

        async def probe() -> None:
            await self.client.in_store(lambda s: s.execute(sa.text("SELECT 1")), "health check")  # type: ignore[union-attr]
            await self.client.temporal.service_client.check_health()  # type: ignore[union-attr]

        assert self.loop is not None
        try:
            asyncio.run_coroutine_threadsafe(probe(), self.loop).result(30)
        except (concurrent.futures.TimeoutError, GymflowError, RPCError, OSError) as e:
            raise StackUnavailable(f"gymflow health check failed: {e or type(e).__name__}") from None

    def shutdown(self) -> None:
        if self._own_loop is not None and self.client is not None:
            try:
                self._own_loop.run(self.client.close(), timeout_s=10)
            except (LoopGone, concurrent.futures.TimeoutError, OSError):
                pass
            self._own_loop.close()
            self._own_loop = self.client = self.loop = None
        self._spun_up = False

    def step(self, message_log_batch: Any, metadata: Any) -> Any:
        raise NotImplementedError("gymflow runs whole rollouts (run_rollouts), as NeMo Gym does")

    def global_post_process_and_metrics(self, batch: Any) -> Any:
        raise NotImplementedError("gymflow runs whole rollouts (run_rollouts), as NeMo Gym does")

    def _require_spinup(self) -> None:
        if not self._spun_up or self.client is None or self.loop is None:
            raise RuntimeError("GymflowNemoGym: _spinup() was not called on this instance (a restarted Ray actor "
                               "is rebuilt through __init__ only)")

    # ---- run_rollouts --------------------------------------------------------------------------------------

    async def run_rollouts(self, nemo_gym_examples: list[dict], timer_prefix: str,
                           deduplicate_multimodal_data: bool = False
                           ) -> AsyncGenerator[tuple[int, dict, dict | None], None]:
        """Stream `(row["_rowidx"], result, timing_metrics)` as groups complete; timing only on the last row."""
        self._require_spinup()
        if not nemo_gym_examples:
            raise ValueError("NeMo-Gym rollout batch must not be empty")
        plans = self._plan(nemo_gym_examples)  # refuses bad rows before anything starts
        started = time.perf_counter()
        waited = post = 0.0
        futures = {self._submit(self._run_group(p)): p for p in plans}
        failed: list[FailedRow] = []
        sent = 0
        try:
            pending = set(futures)
            while pending:
                t0 = time.perf_counter()
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                waited += time.perf_counter() - t0
                for fut in done:
                    plan = futures[fut]
                    t1 = time.perf_counter()
                    results, bad = self._outcome(fut)
                    if bad:
                        failed += bad
                        continue
                    post += time.perf_counter() - t1
                    if plan.counted:
                        self.groups_used[plan.task.id] += 1  # delivered: the same rows again are the next epoch
                    for row_index, result in results:
                        sent += 1
                        timing = None
                        if sent == len(nemo_gym_examples):
                            total = time.perf_counter() - started
                            timing = {f"{timer_prefix}/await_results": waited,
                                      f"{timer_prefix}/postprocess_results": post,
                                      f"{timer_prefix}/postprocess_results_pct": 100 * post / total if total else 0}
                        yield row_index, result, timing
        finally:
            for fut in futures:
                fut.cancel()  # the waits only: the workflows go on, and a later call attaches to them
        if failed:
            raise rollout_failure(failed, len(nemo_gym_examples))

    def _plan(self, rows: list[dict]) -> list[_Plan]:
        problems: list[str] = []
        by_key: dict[tuple[str, int | None], _Plan] = {}
        tasks: dict[tuple[str, int | None], Task] = {}
        envs: set[str] = set()
        for pos, row in enumerate(rows):
            if not isinstance(row, dict):
                problems.append(f"row {pos}: expected a dict, got {type(row).__name__}")
                continue
            row_index = row.get(ROW_INDEX, pos)
            clean = {k: v for k, v in row.items() if k not in (ROW_INDEX, NG_TASK_INDEX)}
            name = _agent(row)
            env = self.agent_envs.get(name) or agent_environment(clean)
            if env is None:
                problems.append(f"row {row_index}: agent_ref {name!r} names no installed gymflow environment (map "
                                f"it in env.nemo_gym.{CONFIG_KEY}.agent_envs; see `gymflow env list`)")
                continue
            key = (_row_hash(clean), _ng_index(row))
            if key not in by_key:
                try:
                    task = _task(clean, env, key[0])
                except TaskError as e:
                    problems.append(f"row {row_index} (agent {name!r}, env {env!r}): {e}")
                    continue
                if why := route_problem(env, task, row=clean):
                    problems.append(f"row {row_index} (agent {name!r}, env {env!r}): {why}")
                    continue
                tasks[key] = task
                envs.add(env)
                by_key[key] = _Plan(key, task, [], [], 0, key[1] is None, "", [])
            if key in by_key:
                by_key[key].rows.append(pos)
                by_key[key].row_indices.append(row_index)
                by_key[key].payload.append(row)
        if problems:
            raise RowsRefused(f"{len(problems)} of {len(rows)} rows refused, nothing started: " + "; ".join(
                problems[:10]) + (f"; ... {len(problems) - 10} more" if len(problems) > 10 else ""))
        assert self.client is not None
        for model in self.models:
            check_collectable(self.client.settings, envs, model, self.run_id)
        for i, plan in enumerate(by_key.values()):
            k = len(plan.rows)
            # The group size is part of the task id: epoch e of a k-sample task is samples e*k..e*k+k-1.
            suffix = f"x{k}" if plan.key[1] is not None else f"x{k}s"
            plan.task = plan.task.model_copy(update={"id": f"ng-{plan.key[0]}-{suffix}"})
            plan.epoch = plan.key[1] if plan.key[1] is not None else self.groups_used[plan.task.id]
            plan.model = self.models[(plan.epoch + i) % len(self.models)]
        return list(by_key.values())

    def _submit(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Future[Any]:
        """`coro` on the client's loop, as a future of the caller's loop (Ray's actor loop or the same one)."""
        assert self.loop is not None
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self.loop:
            return asyncio.ensure_future(asyncio.wait_for(coro, self.timeout_s))
        if self.loop.is_closed() or not self.loop.is_running():
            coro.close()
            fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
            fut.set_exception(LoopGone("the event loop of gymflow's client is not running (the stack was shut "
                                       "down)"))
            return fut
        return asyncio.wrap_future(asyncio.run_coroutine_threadsafe(asyncio.wait_for(coro, self.timeout_s),
                                                                    self.loop))

    def _outcome(self, fut: asyncio.Future[Any]) -> tuple[list[tuple[int, dict]], list[FailedRow]]:
        """The group's rows, or its failed rows; every way the stack can be down becomes StackUnavailable."""
        try:
            return fut.result()
        except (TimeoutError, concurrent.futures.TimeoutError):
            raise StackUnavailable(f"gymflow: a group took over {self.timeout_s:.0f} s; call again to attach to "
                                   "the same rollouts") from None
        except LoopGone as e:
            raise StackUnavailable(f"gymflow: {e}; start it again and call again") from None
        except (GymflowError, RPCError, OSError) as e:
            if isinstance(e, GymflowError) and not (isinstance(e, TemporalUnreachable)
                                                    or e.failure_type == failures.STORE_UNAVAILABLE):
                raise
            if isinstance(e, StackUnavailable):
                raise
            raise StackUnavailable(f"gymflow stack unreachable (run {self.run_id!r}): {e}. Call again once it is "
                                   "back: finished rollouts are kept, running ones re-attached") from None

    # ---- one group, on the client's loop --------------------------------------------------------------------

    async def _run_group(self, plan: _Plan) -> tuple[list[tuple[int, dict]], list[FailedRow]]:
        assert self.client is not None
        k = len(plan.rows)
        # A one-task dataset started at `epoch`: the iterator's ids, retries of failed members and verdict.
        it = RolloutIterator(self.client, self.run_id, [plan.task], k, plan.model, max_groups_in_flight=1,
                             epochs=plan.epoch + 1, shuffle=False, start_position=Position(plan.epoch, 0),
                             max_retries=self.max_retries, sampling=plan.task.sampling, include_withheld=True)
        async with it:
            group: Group | None = await anext(it, None)
        if group is None:
            raise RuntimeError(f"no group for task {plan.task.id!r} epoch {plan.epoch}")  # the iterator yields one
        failed = [FailedRow(plan.row_indices[i], m.rollout_id, failures.known(m.failure_type),
                            m.failure_message or ("masked" if m.masked else m.status),
                            failures.FAILURE_TYPES[failures.known(m.failure_type)].retried)
                  for i, m in enumerate(group.members) if not usable(m)]
        if failed:
            return [], failed
        (records,) = await group_records(self.client, [group])
        episodes = await self.client.in_store(lambda s: _episodes(s, [r.rollout_id for r in records]),
                                              "reading the group's episodes")
        out: list[tuple[int, dict]] = []
        for i, rec in enumerate(records):
            row_index, row = plan.row_indices[i], plan.payload[i]
            log_ = self._message_log(rec, episodes.get(rec.rollout_id, {}))
            if isinstance(log_, FailedRow):
                failed.append(dataclasses.replace(log_, row_index=row_index))
                continue
            messages, flags = log_
            out.append((row_index, {"message_log": messages, "input_message_log": messages[:1],
                                    "full_result": self._full_result(row, rec, group, episodes.get(
                                        rec.rollout_id, {}), flags)}))
        return ([], failed) if failed else (out, [])

    def _message_log(self, rec: TrainingRecord, episode: Mapping[str, Any]
                     ) -> tuple[list[dict], dict[str, Any]] | FailedRow:
        """NeMo RL's message log from the record's joined sequence: per turn, the tokens since the last turn as
        a user message and the generated ones as an assistant message (empty generations are skipped, as NeMo
        RL skips them, so their prompt tokens join the next user message)."""
        seq = rec.sequence
        if not seq.tokens_available or seq.logprobs is None or seq.turns_in_sequence == 0:
            why = seq.problem or "the server returned no logprobs (set models.<name>.logprobs: true)"
            return FailedRow(-1, rec.rollout_id, failures.MODEL_BAD_RESPONSE, f"no token-exact record: {why}", False)
        _, completion = split_transcript(episode.get("transcript"))
        answers = [m for m in completion if m["role"] == "assistant"]
        patterns = self.cfg.get("invalid_tool_call_patterns") or INVALID_TOOL_CALL_PATTERNS
        tags = self.cfg.get("thinking_tags") or THINKING_TAGS
        messages: list[dict] = []
        seen = 0
        for t in rec.turns[:seq.turns_in_sequence]:
            start, end = len(t.prompt_token_ids), len(t.prompt_token_ids) + len(t.generation_token_ids)
            if end == start:
                continue
            text = (answers[t.turn].get("content") or "") if t.turn < len(answers) else ""
            messages.append({"role": "user", "content": "", "token_ids": seq.input_ids[seen:start]})
            messages.append({"role": "assistant", "content": "", "token_ids": seq.input_ids[start:end],
                             "generation_logprobs": seq.logprobs[start:end],
                             "is_invalid_tool_call": any(p in text for p in patterns),
                             "has_malformed_thinking": _malformed_thinking(text, tags, reasoning=False)})
            seen = end
        if not messages:
            return FailedRow(-1, rec.rollout_id, failures.MODEL_BAD_RESPONSE, "every turn generated no tokens",
                             False)
        return messages, {"token_drift_turns": list(seq.drift_turns)}

    def _full_result(self, row: Mapping[str, Any], rec: TrainingRecord, group: Group, episode: Mapping[str, Any],
                     flags: Mapping[str, Any]) -> dict:
        """What NeMo Gym's /run returns for the row: the verifier's fields, the request, the response, reward."""
        from gymflow.environments import nemo_gym_responses as responses

        params = copy.deepcopy(row.get("responses_create_params") or {})
        prompt, completion = split_transcript(episode.get("transcript"))
        chat = []
        for m in completion:
            try:
                chat.append(ChatMessage.model_validate({k: v for k, v in m.items() if v is not None}))
            except ValidationError:
                continue  # a stored message that is not a chat message stays out of the Responses view only
        response = responses.response(chat, 0, params, str(self.cfg.get("model_name") or ""))
        if self._tokenizer is not None:
            self._decode(response["output"], chat, rec)
        details = episode.get("score_details")
        out: dict[str, Any] = dict(details) if isinstance(details, Mapping) else {}
        out.update({"responses_create_params": params, "response": response, "reward": rec.reward,
                    "gymflow": {"rollout_id": rec.rollout_id, "group_id": group.group_id, "run_id": self.run_id,
                                "policy_versions": list(rec.sequence.policy_versions), **flags}})
        if flags.get("token_drift_turns"):
            # The sequence stops at the last turn whose prompt continued the previous one (records.py): NeMo RL
            # counts the reward for the group's baseline but trains nothing on the sample.
            out["instance_config"] = {**(out.get("instance_config") or {}), "mask_sample": True}
        return out

    def _decode(self, output: list[dict], chat: list[ChatMessage], rec: TrainingRecord) -> None:
        """generation_str / prompt_str on each assistant turn's last output item, as NeMo RL adds them."""
        turns = list(rec.turns[:rec.sequence.turns_in_sequence])
        items_per_message = [responses_items(m, i) for i, m in enumerate(chat)]
        index, turn = 0, 0
        for m, count in zip(chat, items_per_message, strict=True):
            index += count
            if m.role == "assistant" and turn < len(turns) and count:
                t = turns[turn]
                output[index - 1]["prompt_str"] = self._tokenizer.decode(t.prompt_token_ids)
                output[index - 1]["generation_str"] = self._tokenizer.decode(t.generation_token_ids)
            turn += m.role == "assistant"


def responses_items(message: ChatMessage, index: int) -> int:
    from gymflow.environments import nemo_gym_responses as responses

    return len(responses.items([message], index))


def _task(row: dict[str, Any], env: str, digest: str) -> Task:
    from gymflow.data.datasets import row_to_task

    return row_to_task(row, env=env, default_id=f"ng-{digest}")


async def _episodes(session: Any, rollout_ids: list[str]) -> dict[str, dict[str, Any]]:
    import sqlalchemy as sa

    from gymflow.kernel.store.models import Rollout

    result = await session.execute(sa.select(Rollout.id, Rollout.transcript, Rollout.score_details)
                                   .where(Rollout.id.in_(rollout_ids)))
    return {r.id: {"transcript": r.transcript, "score_details": r.score_details} for r in result}


def spinup_gymflow_actor(env_configs: dict[str, Any], base_urls: list[str], model_name: str, *, tokenizer: Any,
                         enable_router_replay: bool, routed_experts_dtype: str, use_fastokens: bool) -> Any:
    """`nemo_rl.environments.nemo_gym.spinup_nemo_gym_actor`'s signature and steps, for GymflowNemoGym: a Ray
    actor (`ray.remote(GymflowNemoGym)`), `_spinup()`, then `set_tokenizer(tokenizer)`."""
    import ray

    nemo_gym = dict(env_configs["nemo_gym"])
    cfg = {"model_name": model_name, "base_urls": base_urls, "require_routed_experts": enable_router_replay,
           "routed_experts_dtype": routed_experts_dtype, "use_fastokens": use_fastokens,
           "invalid_tool_call_patterns": nemo_gym.pop("invalid_tool_call_patterns", None),
           "thinking_tags": nemo_gym.pop("thinking_tags", None), "initial_global_config_dict": nemo_gym}
    actor = ray.remote(max_restarts=-1, max_task_retries=-1)(GymflowNemoGym).remote(cfg)
    ray.get(actor._spinup.remote())
    ray.get(actor.set_tokenizer.remote(tokenizer))
    return actor


__all__ = ["FailedRow", "GymflowNemoGym", "RolloutDataFailed", "RolloutFailed", "RolloutInfraFailed", "RowsRefused",
           "StackUnavailable", "model_entries", "resolve_models", "spinup_gymflow_actor"]
