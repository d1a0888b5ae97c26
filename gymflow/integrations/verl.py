"""verl on gymflow: an agent loop (verl's `verl.experimental.agent_loop` interface) that runs each sample as one
gymflow rollout and hands verl the stored, token-exact result.

Written against verl 0.9.1 (`verl/experimental/agent_loop/agent_loop.py`: `AgentLoopBase`, `AgentLoopOutput`,
`register`; `single_turn_agent_loop.py` / `tool_agent_loop.py` for the output's shape). verl's
`AgentLoopWorker` builds one loop per sample (`hydra.utils.instantiate` of the registry entry) and awaits
`run(sampling_params, **row)` on its own event loop, where `row` is the dataset row's non-tensor fields
(`raw_prompt`, `extra_info`, `index`, `tools_kwargs`, `uid`, ...). Select it per row with `agent_name: gymflow`,
or pass options through an `agent_loop_config_path` YAML (its keys become `__init__` arguments):

    - name: gymflow
      _target_: gymflow.integrations.verl.GymflowAgentLoop
      gymflow_config: /path/gymflow.yaml      # default $GYMFLOW_CONFIG, else ./gymflow.yaml
      model: verl                             # the models.<name> entry gymflow generates with
      run_id: verl-grpo

The model endpoint. gymflow's pools call the model themselves, at `models.<model>.base_url`, so the policy verl
trains must be reachable as an OpenAI-compatible URL: verl's vLLM and SGLang rollout replicas each serve one
(`LLMServerManager.get_addresses()`, `host:port` on a free port chosen at start; the load balancer the loop's
`server_manager` talks to lists the same ids, `server_urls()` here). Configure the model with
`placement: pool`, `return_token_ids: true`, `logprobs: true` and `model:` = verl's served name (the model path),
and serve its generate queue with `gymflow worker --pool generate --models verl` started once the replicas are
up, with `base_url: http://<address>/v1` (or a fixed-port router in front of them). verl's own weight sync
(sleep, update, wake) then reaches gymflow's generations unchanged. verl's `server_manager.generate` (token ids
over Ray) is not used: gymflow's episode needs a chat endpoint it can retry and resume.

The output is the rollout's stored generations joined as in `gymflow.training.records` and split as TRL's
(trl_batch.py): `prompt_ids` = turn 0's prompt as the server tokenised it, `response_ids` = everything after
it, `response_mask` 1 on sampled tokens and 0 on the environment's (tool results, template glue),
`response_logprobs` the server's (0.0 on the environment's tokens), `reward_score` gymflow's stored reward.
Faults: `StackUnavailable` when Temporal or Postgres is gone (verl's step fails; run it again). A rollout
that failed, was masked or has no usable token ids is returned masked: a one-token response whose mask is 0,
reward 0.0, and `extra_fields["gymflow_masked"] = True` with the failure type and message, so it is never
a silent 0.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from temporalio.service import RPCError

from gymflow.client import is_transient
from gymflow.integrations.trl import StackUnavailable, _stack_fault
from gymflow.integrations.trl_batch import completion_of
from gymflow.kernel.errors import GymflowError
from gymflow.kernel.wire import RolloutSummary, SamplingParams, Task, content_json
from gymflow.training.groups import Group, usable
from gymflow.training.records import TrainingRecord, group_records

if TYPE_CHECKING:
    from gymflow.client import GymflowClient

AGENT_NAME = "gymflow"
MAX_DRAWS = 8
ROW_KEY = "gymflow_task"  # extra_info[ROW_KEY]: the task as JSON text (parquet keeps a string column simple)
_clients: dict[tuple[int, str], GymflowClient] = {}  # per event loop and config: verl builds a loop per sample
_connecting: dict[tuple[int, str], asyncio.Lock] = {}


def verl_rows(tasks: Iterable[Task], *, agent_name: str = AGENT_NAME, data_source: str = "gymflow"
              ) -> list[dict[str, Any]]:
    """verl RLHFDataset rows for gymflow tasks (`pandas.DataFrame(rows).to_parquet(path)`): `prompt` (verl
    tokenises it for its batch; the loop gets it back as `raw_prompt`), `agent_name`, `data_source`,
    `reward_model` (verl's reward manager wants the column; the score is gymflow's) and `extra_info` with the
    row `index` and the whole task as JSON under `gymflow_task`."""
    rows = []
    for i, t in enumerate(tasks):
        rows.append({
            "data_source": data_source, "agent_name": agent_name,
            "prompt": [{"role": m.role, "content": content_json(m.content) or ""} for m in t.messages],
            "reward_model": {"style": "gymflow", "ground_truth": ""},
            "extra_info": {"index": i, "task_id": t.id, ROW_KEY: t.model_dump_json()},
        })
    return rows


def jsonl_to_parquet(jsonl: str | Path, env: str, out: str | Path) -> int:
    """A gymflow JSONL dataset as a verl parquet file; returns the rows written. Any bad line raises ValueError
    naming it (`gymflow data prepare` writes the good rows of a file)."""
    import pandas as pd

    from gymflow.data.datasets import load_jsonl

    tasks, errors = load_jsonl(str(jsonl), env=env)
    if errors:
        raise ValueError(f"{jsonl}: {len(errors)} bad rows, first: {errors[0]}")
    pd.DataFrame(verl_rows(tasks)).to_parquet(out)
    return len(tasks)


def task_of(row: dict[str, Any]) -> Task:
    """The gymflow task a verl row carries (verl_rows' `extra_info.gymflow_task`)."""
    info = row.get("extra_info")
    raw = info.get(ROW_KEY) if isinstance(info, dict) else None
    if not isinstance(raw, str):
        keys = sorted(info) if isinstance(info, dict) else type(info).__name__
        raise ValueError(f"gymflow agent loop: the row's extra_info has no {ROW_KEY!r} (has {keys}); build the "
                         "dataset with gymflow.integrations.verl.verl_rows / jsonl_to_parquet")
    return Task.model_validate_json(raw)


def sampling_from_verl(params: dict[str, Any], max_tokens: int | None) -> SamplingParams:
    """verl's per-sample params (temperature, top_p, top_k, repetition_penalty, logprobs) as gymflow's.
    top_k and repetition_penalty have no OpenAI field: set them in `models.<name>.extra_body` if needed."""
    top_p = params.get("top_p")
    temperature = params.get("temperature")
    return SamplingParams(temperature=float(temperature) if temperature is not None else None,
                          top_p=float(top_p) if top_p is not None and 0 < top_p <= 1 else None,
                          max_tokens=max_tokens)


async def server_urls(server_manager: Any) -> list[str]:
    """The OpenAI base URLs (`http://host:port/v1`) of the replicas behind verl's server manager, from its load
    balancer's `get_all_servers` (server ids are the replicas' addresses); [] where it has none."""
    balancer = getattr(server_manager, "_load_balancer", None)
    if balancer is None:
        return []
    ids = await balancer.get_all_servers.remote()
    return [f"http://{a}/v1" if "://" not in a else a.rstrip("/") for a in ids]


async def gymflow_client(config: str | None = None) -> GymflowClient:
    """One connected client per event loop and config file (`config` default: $GYMFLOW_CONFIG)."""
    from gymflow.client import GymflowClient
    from gymflow.kernel.config import load_settings

    loop = asyncio.get_running_loop()
    path = config or os.environ.get("GYMFLOW_CONFIG") or ""
    key = (id(loop), path)
    lock = _connecting.setdefault(key, asyncio.Lock())
    async with lock:
        if key not in _clients:
            settings = load_settings(path or None)
            _clients[key] = await GymflowClient.connect(settings)
        return _clients[key]


def _base() -> type:
    from verl.experimental.agent_loop.agent_loop import AgentLoopBase

    return AgentLoopBase


def _stack_call_error(e: BaseException, what: str) -> StackUnavailable | None:
    from gymflow.kernel.store.db import DatabaseUnreachable

    if isinstance(e, RPCError | OSError | DatabaseUnreachable) or (isinstance(e, GymflowError) and _stack_fault(e)):
        return StackUnavailable(f"gymflow stack unreachable while {what}: {e}. Run the step again once it is back")
    return None


class _Loop:
    """The agent loop's body, apart from verl's base class (which is bound lazily: see GymflowAgentLoop)."""

    def _setup(self, *, gymflow_config: str | None, model: str, run_id: str, max_turns: int | None) -> None:
        self.gymflow_config, self.model, self.run_id, self.max_turns = gymflow_config, model, run_id, max_turns

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> Any:
        from verl.experimental.agent_loop.agent_loop import AgentLoopOutput

        task = task_of(kwargs)
        rollout_cfg = self.rollout_config  # type: ignore[attr-defined]
        response_length = int(rollout_cfg.response_length)
        started = time.monotonic()
        try:
            client = await gymflow_client(self.gymflow_config)
            summary = await self._rollout(client, task, sampling_from_verl(sampling_params, response_length))
            group = Group(self.run_id, task, 0, 0, (summary,), "complete" if usable(summary) else "dropped")
            records = (await group_records(client, [group]))[0]
        except (GymflowError, RPCError, OSError) as e:
            if (err := _stack_call_error(e, f"running task {task.id!r}")) is not None:
                raise err from e
            raise
        elapsed = time.monotonic() - started
        out = _output(summary, records[0] if records else None, group.group_id, response_length,
                      int(rollout_cfg.prompt_length), lambda: self._prompt_ids(kwargs))
        return AgentLoopOutput(metrics={"generate_sequences": elapsed}, **out)

    async def _rollout(self, client: GymflowClient, task: Task, sampling: SamplingParams) -> RolloutSummary:
        # verl gives the loop no stable id per copy of a row (its rollout_n restarts in every worker's chunk), so
        # each call is a fresh rollout under a random sample index (the store's is 32-bit); verl's `uid` groups
        # the copies for the advantage. An index already taken is never reused: another is drawn.
        for _ in range(MAX_DRAWS):
            inp = client.make_input(self.run_id, task, secrets.randbelow(2**31), self.model, sampling,
                                    self.max_turns)
            try:
                handle, outcome = await client.start_rollout(inp)
            except RPCError as err:
                if is_transient(err):
                    raise
                return await client._rejected(inp, err)  # Temporal refused this one (too large): recorded failed
            if outcome == "started":
                return await client.result(handle, inp)
        raise RuntimeError(f"gymflow agent loop: {MAX_DRAWS} random sample indices of task {task.id!r} in run "
                           f"{self.run_id!r} were all taken")

    def _prompt_ids(self, row: dict[str, Any]) -> list[int]:
        """The prompt through verl's tokenizer: only for a masked output, whose rollout left no prompt ids."""
        messages = list(row.get("raw_prompt") if row.get("raw_prompt") is not None else [])
        tok = getattr(self, "tokenizer", None)
        if tok is None or not messages:
            return []
        ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        ids = ids["input_ids"] if hasattr(ids, "keys") else ids
        return [int(i) for i in ids][-int(self.rollout_config.prompt_length):]  # type: ignore[attr-defined]


def _output(summary: RolloutSummary, record: TrainingRecord | None, group_id: str, response_length: int,
            prompt_length: int, fallback_prompt: Any) -> dict[str, Any]:
    """AgentLoopOutput's fields for one rollout; a masked stand-in (flagged) where it is not usable."""
    extra: dict[str, Any] = {"turn_scores": [], "tool_rewards": [], "gymflow_rollout_id": summary.rollout_id,
                             "gymflow_status": summary.status, "gymflow_masked": False,
                             "gymflow_failure_type": summary.failure_type, "gymflow_failure": summary.failure_message,
                             "gymflow_truncated": False}
    done = completion_of(record, group_id) if record is not None and usable(summary) else None
    why = None
    if done is None:
        why = summary.failure_type or ("masked" if summary.masked else None) or (
            record.sequence.problem if record is not None else summary.status)
    elif len(done.prompt_ids) > prompt_length:
        why = f"prompt of {len(done.prompt_ids)} tokens exceeds rollout.prompt_length={prompt_length}"
    if why is not None:
        prompt = (done.prompt_ids if done is not None else None) or fallback_prompt()
        extra.update(gymflow_masked=True, gymflow_failure_type=extra["gymflow_failure_type"] or "unusable",
                     gymflow_failure=extra["gymflow_failure"] or why)
        # One masked token keeps verl's shapes (the reward sits on the last response token); it trains nothing.
        return {"prompt_ids": list(prompt)[-prompt_length:], "response_ids": [0], "response_mask": [0],
                "response_logprobs": [0.0], "reward_score": 0.0, "num_turns": 0, "extra_fields": extra}
    ids, mask, lps = done.completion_ids, done.env_mask, done.logprobs
    if len(ids) > response_length:  # as verl's own loops: cut at response_length, mask and logprobs alike
        extra["gymflow_truncated"] = True
        ids, mask = ids[:response_length], mask[:response_length]
        lps = lps[:response_length] if lps is not None else None
    extra["gymflow_policy_versions"] = list(done.policy_versions)
    return {"prompt_ids": done.prompt_ids, "response_ids": ids, "response_mask": mask, "response_logprobs": lps,
            "reward_score": float(summary.reward or 0.0), "num_turns": summary.turns or 0, "extra_fields": extra}


def _make_class() -> type:
    from verl.experimental.agent_loop.agent_loop import register

    base = _base()

    class GymflowAgentLoop(_Loop, base):  # type: ignore[misc, valid-type]
        """verl agent loop running each sample as one gymflow rollout (module docstring)."""

        def __init__(self, *args: Any, gymflow_config: str | None = None, model: str = "policy",
                     run_id: str = "verl", max_turns: int | None = None, name: str | None = None,
                     **kwargs: Any) -> None:
            base.__init__(self, *args, **kwargs)
            self._setup(gymflow_config=gymflow_config, model=model, run_id=run_id, max_turns=max_turns)

    GymflowAgentLoop.__module__ = __name__
    GymflowAgentLoop.__qualname__ = "GymflowAgentLoop"
    return register(AGENT_NAME)(GymflowAgentLoop)


def __getattr__(name: str) -> Any:
    # verl is imported only when the class is asked for: `import gymflow.integrations.verl` works without it,
    # and the first lookup (hydra's `_target_`) registers "gymflow" in verl's registry.
    if name == "GymflowAgentLoop":
        cls = _make_class()
        globals()[name] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["AGENT_NAME", "GymflowAgentLoop",  # noqa: F822 - made on first lookup (__getattr__)
           "StackUnavailable", "gymflow_client", "jsonl_to_parquet",
           "sampling_from_verl", "server_urls", "task_of", "verl_rows"]
