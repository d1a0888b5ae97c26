"""TRL's GRPOTrainer on gymflow: a `rollout_func` that collects each block of repeated prompts as one gymflow
group, and the weight sync (save, `/v1/load_weights`, declare the policy version) as one call.

    loop = LoopThread(); client = loop.run(GymflowClient.connect(settings))
    rollout = GymflowRollout(client, loop.loop, "trl-run", tasks, model="policy", num_generations=4,
                             weights=WeightSync(server.base_url, server.control_token, weights_root))
    trainer = GRPOTrainer(model=model, processing_class=tokenizer, reward_funcs=gymflow_reward,
                          train_dataset=Dataset.from_list(rollout.dataset_rows()), rollout_func=rollout,
                          args=GRPOConfig(num_generations=4, ...))

TRL's sampler repeats each dataset row `num_generations` times in a row; every such block is one group of one
task (rollout ids `<run>/<task>/<epoch * n + i>`, as the trainer iterator's, so `gymflow export` groups them the
same way). A task seen again is its next epoch. The outputs are the stored token ids (trl_batch.py), so the
trainer scores exactly the tokens the server sampled. Faults are typed errors: `DatasetExhausted`,
`StackUnavailable` (call again: the same rollout ids are attached to, nothing runs twice), `WeightLoadError`
(the server keeps its previous weights; nothing is declared), `VersionOrderError`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import re
import shutil
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from temporalio.service import RPCError

from gymflow.client import GymflowClient
from gymflow.integrations.loop import LoopGone, run_on
from gymflow.integrations.trl_batch import Completion, group_completions, gymflow_reward, trl_output
from gymflow.kernel import failures
from gymflow.kernel.connect import TemporalUnreachable
from gymflow.kernel.errors import GymflowError
from gymflow.kernel.store.policy_versions import Current
from gymflow.kernel.wire import SamplingParams, Task, content_json
from gymflow.training.groups import Group, Incomplete
from gymflow.training.iterator import Position, RolloutIterator, Stale
from gymflow.training.policy import current_policy_version, declare_policy_version
from gymflow.training.records import group_records

log = logging.getLogger(__name__)
COLLECT_TIMEOUT_S = 3600.0  # one TRL generation step; beyond it the trainer hears of it and may call again


class DatasetExhausted(ValueError):
    """The trainer asked for more groups of a task than `epochs` allows."""


class StackUnavailable(RuntimeError):
    """Temporal, Postgres or the client's loop is gone. Calling again once it is back attaches to the same
    rollouts: finished ones are read, running ones waited for."""


class WeightLoadError(RuntimeError):
    """The model server did not take the new weights; it keeps serving the previous version."""


class VersionOrderError(ValueError):
    """A weight sync for a step before the one already declared."""


def _prompt_messages(task: Task) -> list[dict[str, Any]]:
    # Image prompts as Chat Completions parts, as a multimodal processor's chat template reads them.
    return [{"role": m.role, "content": content_json(m.content) or ""} for m in task.messages]


def prompt_key(prompt: Any) -> str:
    """What identifies a prompt across TRL's copies: role and content of each message (TRL and `datasets`
    may add or drop other keys), or the text of a plain prompt."""
    if isinstance(prompt, str):
        return json.dumps(prompt)
    if isinstance(prompt, list):
        return json.dumps([[m.get("role"), m.get("content") or ""] if isinstance(m, dict) else m for m in prompt],
                          ensure_ascii=False, default=str)
    raise ValueError(f"rollout_func: a prompt must be a list of messages or a string, got {type(prompt).__name__}")


@dataclass
class WeightSync:
    """Where the trainer's weights go: the local model server (gymflow.localmodel) at `base_url` (its /v1 URL),
    its control token, and its `--weights-root`, under which each version is saved as `<prefix><step>`. Step 0
    is the server's starting weights: start it with `--version <prefix>0` (its default `v0` fits the default
    prefix), since the version a server reports on its replies is the one its turns are stamped with."""

    base_url: str
    token: str
    weights_root: Path
    prefix: str = "v"
    timeout_s: float = 300.0
    keep: int = 1  # checkpoint folders kept on disk (540 MB each for SmolLM2 in float32)

    def version(self, step: int) -> str:
        return f"{self.prefix}{step}"

    def step_of(self, version: str | None) -> int | None:
        m = re.fullmatch(re.escape(self.prefix) + r"(\d+)", version or "")
        return int(m.group(1)) if m else None


class GymflowRollout:
    """TRL's `rollout_func` (call signature `(prompts, trainer) -> dict`). `loop` is the event loop `client`
    was connected on, running on another thread than the trainer's (gymflow.integrations.loop.LoopThread)."""

    def __init__(self, client: GymflowClient, loop: asyncio.AbstractEventLoop, run_id: str, tasks: Sequence[Task],
                 *, model: str, num_generations: int, epochs: int | None = None, incomplete: Incomplete = "wait",
                 max_staleness: int | None = None, stale: Stale = "finish_and_tag",
                 sampling: SamplingParams | None = None, max_turns: int | None = None,
                 weights: WeightSync | None = None, timeout_s: float = COLLECT_TIMEOUT_S) -> None:
        if not isinstance(num_generations, int) or num_generations < 1:
            raise ValueError(f"num_generations must be an integer >= 1, got {num_generations!r}")
        if epochs is not None and (not isinstance(epochs, int) or epochs < 1):
            raise ValueError(f"epochs must be an integer >= 1 or None, got {epochs!r}")
        self.client, self.loop, self.run_id, self.model = client, loop, run_id, model
        self.tasks = list(tasks)
        RolloutIterator(client, run_id, self.tasks, num_generations, model)  # the iterator's own argument checks
        self.n, self.epochs, self.timeout_s, self.weights = num_generations, epochs, timeout_s, weights
        self.options: dict[str, Any] = {"incomplete": incomplete, "max_staleness": max_staleness, "stale": stale,
                                        "sampling": sampling, "max_turns": max_turns, "include_withheld": True}
        self._by_prompt: dict[str, Task] = {}
        for t in self.tasks:
            key = prompt_key(_prompt_messages(t))
            if key in self._by_prompt:
                raise ValueError(f"tasks {self._by_prompt[key].id!r} and {t.id!r} have the same prompt: TRL's "
                                 "rollout_func sees only prompts, so it could not tell their groups apart")
            self._by_prompt[key] = t
        self.groups_used: Counter[str] = Counter()  # per task id: epochs handed to the trainer (resume: set it)
        self.synced_step: int | None = None  # the trainer step whose weights the server serves
        self.last_groups: list[Group] = []
        self.__name__ = "gymflow_rollout"  # TRL and accelerate log callables by name

    # ---- the dataset TRL samples prompts from ---------------------------------------------------------

    def dataset_rows(self) -> list[dict[str, Any]]:
        """One row per task for `datasets.Dataset.from_list`: `prompt` (its messages) and `task_id`."""
        return [{"prompt": _prompt_messages(t), "task_id": t.id} for t in self.tasks]

    @property
    def groups_available(self) -> int | None:
        return None if self.epochs is None else len(self.tasks) * self.epochs

    # ---- the rollout_func --------------------------------------------------------------------------------

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, Any]:
        _check_generations(trainer, self.n)
        if self.weights is not None:
            step = int(getattr(getattr(trainer, "state", None), "global_step", 0) or 0)
            if self.synced_step is None or step > self.synced_step:
                self.sync_weights(_unwrapped(trainer), step)
        blocks = self._blocks(prompts)
        groups = self._call(self._collect(blocks), "collecting")
        records = self._call(group_records(self.client, groups), "reading the groups' token ids")
        fallback_end = _end_id(trainer)
        out: list[Completion] = []
        for (prompt, _, _), group, recs in zip(blocks, groups, records, strict=True):
            if not group.trainable:
                log.warning("group %s withheld (%s: %s): its completions are masked out", group.group_id,
                            group.verdict, group.reason)
            out += group_completions(group, recs, lambda p=prompt: _tokenize(trainer, p), fallback_end)
        self.groups_used.update(task.id for _, task, _ in blocks)  # only once every group was read
        self.last_groups = groups
        return trl_output(out)

    def _blocks(self, prompts: list[Any]) -> list[tuple[Any, Task, int]]:
        """(prompt, task, epoch) per block of `n` identical prompts."""
        if not isinstance(prompts, list) or not prompts or len(prompts) % self.n:
            count = len(prompts) if isinstance(prompts, list) else type(prompts).__name__
            raise ValueError(f"rollout_func: got {count} prompts; expected a positive multiple of num_generations="
                             f"{self.n} (TRL repeats each prompt num_generations times in a row)")
        blocks: list[tuple[Any, Task, int]] = []
        asked: Counter[str] = Counter()
        for start in range(0, len(prompts), self.n):
            keys = {prompt_key(p) for p in prompts[start:start + self.n]}
            if len(keys) != 1:
                raise ValueError(f"rollout_func: prompts {start}..{start + self.n - 1} are not {self.n} copies of "
                                 "one prompt; set GRPOConfig(num_generations=...) to the num_generations given here")
            task = self._by_prompt.get(keys.pop())
            if task is None:
                raise ValueError(f"rollout_func: prompt {start} is not one of the {len(self.tasks)} gymflow tasks "
                                 "(build the train dataset from GymflowRollout.dataset_rows())")
            epoch = self.groups_used[task.id] + asked[task.id]
            asked[task.id] += 1
            if self.epochs is not None and epoch >= self.epochs:
                raise DatasetExhausted(
                    f"rollout_func: the trainer asked for group {epoch + 1} of task {task.id!r}, but the dataset "
                    f"holds {len(self.tasks)} tasks x {self.epochs} epochs = {self.groups_available} groups "
                    f"({sum(self.groups_used.values())} handed over); lower max_steps / num_train_epochs or pass "
                    "a larger epochs=")
            blocks.append((prompts[start], task, epoch))
        return blocks

    async def _collect(self, blocks: list[tuple[Any, Task, int]]) -> list[Group]:
        return list(await asyncio.gather(*(self._group(task, epoch) for _, task, epoch in blocks)))

    async def _group(self, task: Task, epoch: int) -> Group:
        # A one-task dataset started at `epoch`: the iterator's ids, retries, verdicts and staleness rules.
        it = RolloutIterator(self.client, self.run_id, [task], self.n, self.model, max_groups_in_flight=1,
                             epochs=epoch + 1, shuffle=False, start_position=Position(epoch, 0), **self.options)
        async with it:
            async for group in it:
                return group
        raise RuntimeError(f"rollout_func: no group for task {task.id!r} epoch {epoch}")  # the iterator yields one

    def _call(self, coro: Any, what: str) -> Any:
        """Run on the client's loop; every way the stack can be down becomes StackUnavailable."""
        try:
            return run_on(self.loop, coro, self.timeout_s)
        except concurrent.futures.TimeoutError:
            raise StackUnavailable(f"gymflow: {what} took over {self.timeout_s:.0f} s; call again to attach to the "
                                   "same rollouts") from None
        except LoopGone as e:
            raise StackUnavailable(f"gymflow: {what}: {e}; start it again and call again") from None
        except (GymflowError, RPCError, OSError) as e:
            if isinstance(e, GymflowError) and not _stack_fault(e):
                raise
            raise StackUnavailable(f"gymflow stack unreachable while {what} (run {self.run_id!r}): {e}. Call again "
                                   "once it is back: finished rollouts are kept, running ones re-attached") from e

    # ---- weights -------------------------------------------------------------------------------------------

    def sync_weights(self, model: Any, step: int) -> Current:
        """Make `model` (trainer step `step`) the served and declared policy. Step 0 is the server's starting
        weights: only declared. Out of order steps raise VersionOrderError; a failed load WeightLoadError."""
        sync = self.weights
        if sync is None:
            raise ValueError("sync_weights: GymflowRollout(weights=WeightSync(...)) is not set")
        if not isinstance(step, int) or step < 0:
            raise ValueError(f"sync_weights: step must be an integer >= 0, got {step!r}")
        version = sync.version(step)
        now = self._call(current_policy_version(self.client, self.model), "reading the policy version")
        declared = sync.step_of(now.version if now else None)
        known = [s for s in (self.synced_step, declared) if s is not None]
        last = max(known) if known else None
        if last is not None and step < last:
            raise VersionOrderError(
                f"sync_weights: step {step} ({version}) is before {sync.version(last)}, already declared for "
                f"{self.model!r}; versions go forward only (a new training of the same model: another "
                "WeightSync(prefix=...))")
        if step == last:  # a repeated call (a retry): the server already serves it
            self.synced_step = step
            return self._call(declare_policy_version(self.client, self.model, version), "declaring the version")
        if step > 0:
            self._load(model, sync, version, now.version if now else "its starting weights")
        current = self._call(declare_policy_version(self.client, self.model, version), "declaring the version")
        self.synced_step = step
        _prune(sync, step)
        return current

    def _load(self, model: Any, sync: WeightSync, version: str, previous: str) -> None:
        from gymflow.localmodel.control import load_weights
        from gymflow.localmodel.weights import save_weights

        path = sync.weights_root / version
        if hasattr(model, "config") and hasattr(model, "state_dict"):  # a transformers model: the faster writer
            save_weights(model, path)  # read like save_pretrained's, in ~half the time (bench/weight_sync.py)
        else:
            model.save_pretrained(path)
        try:
            reply = load_weights(sync.base_url, sync.token, path, version, timeout_s=sync.timeout_s)
        except (RuntimeError, httpx.HTTPError) as e:
            shutil.rmtree(path, ignore_errors=True)  # a retry saves it again; 540 MB should not pile up
            raise WeightLoadError(f"{version} not loaded ({e}); the server keeps serving {previous} and {version} "
                                  "was not declared") from e
        if reply.get("policy_version") != version:
            shutil.rmtree(path, ignore_errors=True)
            raise WeightLoadError(f"{version}: the server answered {str(reply)[:300]}; it keeps serving {previous} "
                                  f"and {version} was not declared")


def _check_generations(trainer: Any, n: int) -> None:
    """TRL's group size must be ours: otherwise a block of 4 copies would silently become two groups of 2."""
    training = getattr(getattr(trainer, "model", None), "training", True)
    theirs = getattr(trainer, "num_generations" if training else "num_generations_eval", None)
    if isinstance(theirs, int) and theirs != n:
        raise ValueError(f"rollout_func: the trainer repeats each prompt {theirs} times "
                         f"({'num_generations' if training else 'num_generations_eval'}), GymflowRollout was "
                         f"given num_generations={n}: they must be equal")


def _stack_fault(e: GymflowError) -> bool:
    return isinstance(e, TemporalUnreachable) or e.failure_type == failures.STORE_UNAVAILABLE


def _unwrapped(trainer: Any) -> Any:
    acc = getattr(trainer, "accelerator", None)
    return acc.unwrap_model(trainer.model) if acc is not None else trainer.model


def _end_id(trainer: Any) -> int:
    tok = getattr(trainer, "processing_class", None)
    tok = getattr(tok, "tokenizer", tok)  # a processor wraps its tokenizer
    for name in ("eos_token_id", "pad_token_id"):
        value = getattr(tok, name, None)
        if isinstance(value, int):
            return value
    return 0


def _tokenize(trainer: Any, prompt: Any) -> list[int]:
    """The prompt through the trainer's tokenizer: only for a group none of whose members has token ids."""
    tok = getattr(trainer, "processing_class", None)
    if tok is None:
        return []
    if isinstance(prompt, str):
        return list(tok(prompt)["input_ids"])
    out = tok.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True)
    return [int(i) for i in (out["input_ids"] if hasattr(out, "keys") else out)]


def _prune(sync: WeightSync, step: int) -> None:
    """Remove checkpoint folders older than the `keep` newest (the server holds the loaded weights in memory)."""
    older = sorted((s, p) for p in sync.weights_root.glob(f"{sync.prefix}*") if p.is_dir()
                   and (s := sync.step_of(p.name)) is not None and s < step)
    for _, p in older[:max(0, len(older) - (sync.keep - 1))]:
        shutil.rmtree(p, ignore_errors=True)


__all__ = ["DatasetExhausted", "GymflowRollout", "StackUnavailable", "VersionOrderError", "WeightLoadError",
           "WeightSync", "gymflow_reward", "prompt_key"]
