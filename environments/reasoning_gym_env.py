"""The reasoning_gym environment: an adapter over the `reasoning-gym` package's procedural datasets.

A row names its item either by reference, `dataset` + `seed` (+ `size`, `config`) + `index`, which the
environment regenerates (deterministically, offline) with `reasoning_gym.create_dataset`, or carries the
full entry (`question`, `answer`, `metadata`, as NeMo Gym's reasoning_gym rows do, the dataset name then
defaulting to `metadata.source_dataset`). The answer is scored by that dataset's own `score_answer`.

The answer is found as NeMo Gym 0.7.0 finds it, across the episode: the text of every assistant message
after the prompt, joined with no separator (`<think>` reasoning dropped from each; NeMo Gym gets it as
separate reasoning items), then the last `<answer>...</answer>`, else the first `\\boxed{...}` (no nested
braces, as NeMo Gym's regex), else the whole text.
`make_tasks` / `write_jsonl` produce reference rows that `load_jsonl` reads back.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable, Mapping, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

import reasoning_gym
from gymflow.environments.base import (
    JSON,
    PLATFORM_ERRORS,
    Environment,
    TaskData,
    VerifyContext,
    episode_assistant_texts,
)
from pydantic import Field, model_validator
from reasoning_gym.dataset import ProceduralDataset
from reasoning_gym.factory import DATASETS
from reasoning_gym.utils import extract_answer

from gymflow.kernel.errors import TaskError, VerifierError
from gymflow.kernel.wire import ChatMessage, Score, Task

ENV_NAME = "reasoning_gym"


class ReasoningGymTask(TaskData):
    dataset: str | None = None
    seed: int | None = None
    size: int | None = Field(None, gt=0)
    index: int | None = Field(None, ge=0)
    config: dict[str, Any] = Field(default_factory=dict)
    question: str | None = None
    answer: Any = None
    metadata: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _names_an_item(self) -> ReasoningGymTask:
        if self.index is not None and self.seed is None:
            raise ValueError("seed is required with index (an unseeded dataset differs on every build)")
        if self.index is None and self.question is None:
            raise ValueError("either dataset + seed + index, or the full entry (question, answer, metadata)")
        if self.dataset_name is None:
            raise ValueError("dataset: required (or metadata.source_dataset in a full entry)")
        if self.dataset_name not in DATASETS:
            raise ValueError(f"dataset: unknown reasoning-gym dataset {self.dataset_name!r}")
        return self

    @property
    def dataset_name(self) -> str | None:
        return self.dataset or self.metadata.get("source_dataset")


@lru_cache(maxsize=64)
def _cached_dataset(name: str, seed: int | None, size: int | None, config_json: str) -> ProceduralDataset:
    kwargs = json.loads(config_json)
    kwargs.update({k: v for k, v in (("seed", seed), ("size", size)) if v is not None})
    try:
        return reasoning_gym.create_dataset(name, **kwargs)
    except (ValueError, TypeError, AssertionError) as e:  # reasoning-gym validates configs with asserts
        raise TaskError(f"config: reasoning-gym rejected {name} {kwargs}: {e}") from None


def get_dataset(name: str, seed: int | None = None, size: int | None = None,
                config: Mapping[str, Any] | None = None) -> ProceduralDataset:
    """The dataset, built once per (name, seed, size, config): building some datasets is not cheap."""
    return _cached_dataset(name, seed, size, json.dumps(dict(config or {}), sort_keys=True))


def _dataset_for(data: ReasoningGymTask) -> ProceduralDataset:
    return get_dataset(data.dataset_name or "", data.seed, data.size, data.config)


def entry_for(data: ReasoningGymTask) -> JSON:
    """The item the row names: regenerated from the dataset, or the row's own full entry."""
    if data.index is None:
        return {"question": data.question, "answer": data.answer, "metadata": data.metadata}
    dataset = _dataset_for(data)
    if data.index >= len(dataset):
        raise TaskError(f"index: {data.index} is past the dataset's size {len(dataset)}")
    return dataset[data.index]


def first_boxed(text: str) -> str | None:
    """What NeMo Gym's `re.search(r"\\\\boxed\\{([^}]+)\\}")` finds (the first box, up to its first `}`), in linear
    time: that regex is quadratic on a reply of many unclosed boxes."""
    pos = 0
    while (start := text.find("\\boxed{", pos)) >= 0:
        pos = start + len("\\boxed{")
        end = text.find("}", pos)
        if end < 0:
            return None  # no `}` anywhere after: no later box can close either
        if end > pos:
            return text[pos:end]
    return None


def visible_text(text: str | None) -> str:
    """The message without its `<think>` reasoning."""
    if not text:
        return ""
    text = text.rsplit("</think>", 1)[-1]  # templates may open <think> in the prompt: keep what follows it
    return text.split("<think>", 1)[0]  # an unclosed <think> (cut off mid-thought) is not an answer


def extract_final_answer(text: str | Sequence[str] | None) -> str:
    """The answer in a message, or in the episode's assistant messages (joined as NeMo Gym joins them): the last
    `<answer>...</answer>`, else the first `\\boxed{...}`, else the whole text, stripped."""
    texts = [text] if text is None or isinstance(text, str) else list(text)
    full = "".join(visible_text(t) for t in texts)
    # reasoning-gym's tag regex is quadratic on many unclosed tags; without a closing tag it cannot match anyway
    tagged = extract_answer(full, tag_name="answer") if "</answer>" in full else None
    if tagged is not None:
        return tagged
    boxed = first_boxed(full)
    return boxed.strip() if boxed is not None else full.strip()


def _score(data: ReasoningGymTask, answer: str) -> Score:
    name = data.dataset_name
    try:
        entry = entry_for(data)
        reward = float(_dataset_for(data).score_answer(answer, entry))
    except (TaskError, MemoryError):
        raise  # MemoryError: the supervised process's cap; it masks the rollout and is replaced
    except PLATFORM_ERRORS as e:  # the platform's failure, not the answer's: masked, never 0
        raise VerifierError(f"reasoning-gym scorer for {name} could not run: {e!r}"[:300]) from None
    except Exception as e:  # as NeMo Gym: a scorer tripping over the model's answer scores 0
        return Score(reward=0.0, details={"dataset": name, "reason": "scorer_error", "error": repr(e)[:300]})
    return Score(reward=reward, details={"dataset": name, "extracted_answer": answer[:500]})


def make_tasks(dataset: str, size: int, seed: int, *, config: Mapping[str, Any] | None = None,
               system_prompt: str | None = None) -> list[Task]:
    """`size` wire Tasks from one dataset: prompt = the entry's question, data = a reference to the item."""
    ds = get_dataset(dataset, seed, size, config)
    ref: JSON = {"dataset": dataset, "seed": seed, "size": size, **({"config": dict(config)} if config else {})}
    head = (ChatMessage(role="system", content=system_prompt),) if system_prompt else ()
    return [Task(id=f"{dataset}-{seed}-{i}", env=ENV_NAME,
                 messages=(*head, ChatMessage(role="user", content=ds[i]["question"])),
                 data={**ref, "index": i}) for i in range(size)]


def write_jsonl(tasks: Iterable[Task], path: str | Path) -> Path:
    """Write chat rows (`id`, `messages`, verifier fields) that `load_jsonl(path, env="reasoning_gym")` reads."""
    p = Path(path)
    with p.open("w", encoding="utf-8") as f:
        for t in tasks:
            messages = [m.model_dump(exclude_none=True) for m in t.messages]
            f.write(json.dumps({"id": t.id, "messages": messages, **t.data}) + "\n")
    return p


class ReasoningGymEnvironment(Environment[ReasoningGymTask]):
    name = ENV_NAME
    task_type = ReasoningGymTask
    placement = "local"  # in-process and cheap: runs inside the workflow pool
    # What NeMo Gym's rollout rows add; routing must not take a joined replay row for another environment's.
    row_fields = ("task_name", "score", "extracted_answer")

    def initial_messages(self, task: Task, data: ReasoningGymTask) -> Sequence[ChatMessage]:
        # A bare reference row may come without a prompt: ask the item's question.
        return task.messages or (ChatMessage(role="user", content=entry_for(data)["question"]),)

    async def verify(self, data: ReasoningGymTask, messages: Sequence[ChatMessage], state: JSON,
                     ctx: VerifyContext) -> Score:
        answer = extract_final_answer(episode_assistant_texts(messages))
        if not answer:
            return Score(reward=0.0, details={"dataset": data.dataset_name, "reason": "no_answer"})
        # Generating an item or scoring it can take a while for some datasets: off the event loop (workers run
        # verify in a supervised process, under its time limit: a timeout masks, never scores 0).
        return await asyncio.to_thread(_score, data, answer)

    async def validate(self, task: Task) -> Score | None:
        """Score the entry's gold answer; None for entries without one."""
        data = self.parse_task(task)
        gold = (await asyncio.to_thread(entry_for, data)).get("answer")
        if gold is None:
            return None
        answer = ChatMessage(role="assistant", content=f"<answer>{gold}</answer>")
        return await self.verify(data, (*task.messages, answer), {}, VerifyContext(""))
