"""IFEval-style instruction following (NeMo Gym's `instruction_following` resources server).

A row lists verifiable instructions (`instruction_id_list`, with `kwargs` per instruction) under
`verifier_metadata`, or at the top level as older NeMo Gym rows do; 54 instruction ids are known
(`instruction_following_checks.CHECKS`). The final answer is checked against each one.

Reward, as NeMo Gym: `grading_mode` "binary" (default) is 1 when every instruction is followed, "fraction" is
the share followed. Details also carry IFEval's strict and loose verdicts (loose: the best of the answer
with its first and/or last line removed and/or `*` removed; strict and loose both fail an empty answer)
and the four IFEval accuracies for this prompt.
Differences from NeMo Gym: an unknown instruction id, a missing, unknown or ill-typed kwarg (NeMo Gym would
draw a random value or score the instruction 0), or kwargs of another length than the id list are
`bad_task` at load time; an answer over `max_response_chars` (option, default 100,000) scores 0.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, Literal

from gymflow.environments.base import Environment, EnvironmentOptions, TaskData, VerifyContext, final_assistant_text
from gymflow.environments.instruction_following_checks import CHECKS, kwarg_problem, normalise
from pydantic import BaseModel, ConfigDict, Field, model_validator

from gymflow.kernel.errors import CONFIG_ERROR, VerifierError
from gymflow.kernel.wire import ChatMessage, Score, Task

JSON = dict[str, Any]
_LEGACY_FIELDS = ("instruction_id_list", "prompt", "kwargs", "grading_mode")


class VerifierMetadata(BaseModel):
    model_config = ConfigDict(frozen=True, extra="allow")
    instruction_id_list: list[str] = Field(min_length=1)
    prompt: str
    kwargs: list[dict[str, Any] | None]
    grading_mode: Literal["binary", "fraction"] = "binary"

    @model_validator(mode="after")
    def _known_instructions(self) -> VerifierMetadata:
        ids, kwargs = self.instruction_id_list, self.kwargs
        if len(kwargs) != len(ids):
            raise ValueError(f"kwargs: {len(kwargs)} entries for {len(ids)} instructions in instruction_id_list")
        for i, (iid, given) in enumerate(zip(ids, kwargs, strict=True)):
            check = CHECKS.get(iid)
            if check is None:
                raise ValueError(f"instruction_id_list[{i}]: unknown instruction {iid!r}"[:300])
            given = {k: v for k, v in (given or {}).items() if v is not None}  # NeMo Gym drops nulls
            if extra := sorted(set(given) - set(check.kwargs)):
                raise ValueError(f"kwargs[{i}]: {iid} takes {sorted(check.kwargs) or 'no kwargs'}, not {extra}"[:300])
            for name, kind in check.kwargs.items():
                if name not in given:
                    raise ValueError(f"kwargs[{i}].{name}: required by {iid}")
                if problem := kwarg_problem(kind, given[name]):
                    raise ValueError(f"kwargs[{i}].{name}: {problem}")
        return self

    def instructions(self) -> list[tuple[str, dict[str, Any]]]:
        out = []
        for iid, given in zip(self.instruction_id_list, self.kwargs, strict=True):
            kinds = CHECKS[iid].kwargs
            out.append((iid, {k: normalise(kinds[k], v) for k, v in (given or {}).items() if v is not None}))
        return out


class InstructionFollowingTask(TaskData):
    verifier_metadata: VerifierMetadata

    @model_validator(mode="before")
    @classmethod
    def _legacy_top_level(cls, data: Any) -> Any:
        """Older NeMo Gym rows keep the verifier fields at the top level; `verifier_metadata` wins."""
        if not isinstance(data, dict):
            return data
        metadata = data.get("verifier_metadata")
        if metadata is not None and not isinstance(metadata, dict):
            return data  # let validation name the field
        merged = dict(metadata or {})
        for name in _LEGACY_FIELDS:
            if name not in merged and name in data:
                merged[name] = data[name]
        return {**data, "verifier_metadata": merged}


def loose_variants(text: str) -> list[str]:
    """IFEval's loose versions of an answer: first/last line dropped, `*` removed, and combinations."""
    lines = text.split("\n")
    cut = ["\n".join(lines[1:]).strip(), "\n".join(lines[:-1]).strip(), "\n".join(lines[1:-1]).strip()]
    return [text, text.replace("*", ""), *cut, *(c.replace("*", "") for c in cut)]


def _follows(iid: str, kwargs: dict[str, Any], text: str, errors: list[str]) -> bool:
    try:
        return bool(CHECKS[iid].fn(text, **kwargs))
    except Exception as e:  # e.g. an index past a too-short answer; NeMo Gym scores these "not followed"
        errors.append(f"{iid}: {e!r}"[:200])
        return False


def grade(metadata: VerifierMetadata, text: str) -> JSON:
    """Every verdict for one answer (CPU only; run it off the event loop)."""
    errors: list[str] = []
    nemo, strict, loose = [], [], []
    variants = loose_variants(text)
    for iid, kwargs in metadata.instructions():
        followed = _follows(iid, kwargs, text, errors)
        nemo.append(followed)
        strict.append(bool(text.strip()) and followed)
        loose.append(any(v.strip() and _follows(iid, kwargs, v, []) for v in variants))
    n = len(nemo)
    reward = float(all(nemo)) if metadata.grading_mode == "binary" else sum(nemo) / n
    return {"reward": reward, "follow_all_instructions": all(nemo), "follow_instruction_list": nemo,
            "strict_follow_instruction_list": strict, "loose_follow_instruction_list": loose,
            "prompt_level_strict_acc": float(all(strict)), "prompt_level_loose_acc": float(all(loose)),
            "inst_level_strict_acc": sum(strict) / n, "inst_level_loose_acc": sum(loose) / n,
            "checker_errors": errors}


class InstructionFollowingOptions(EnvironmentOptions):
    max_response_chars: int | None = Field(None, ge=1, le=10_000_000, description="Longer answers score 0")


class InstructionFollowingEnvironment(Environment[InstructionFollowingTask]):
    """Option (`VerifyContext.options`): `max_response_chars` (default 100,000; longer answers score 0)."""

    name = "instruction_following"
    task_type = InstructionFollowingTask
    Options = InstructionFollowingOptions
    # Older rows keep the verifier fields at the top level; rollout rows carry the verdicts.
    row_fields = (*_LEGACY_FIELDS, "follow_all_instructions", "follow_instruction_list")

    async def verify(self, data: InstructionFollowingTask, messages: Sequence[ChatMessage], state: JSON,
                     ctx: VerifyContext) -> Score:
        limit = ctx.options.get("max_response_chars", 100_000)
        if not isinstance(limit, int) or isinstance(limit, bool) or limit <= 0:
            raise VerifierError(f"instruction_following option max_response_chars: expected a positive integer, "
                                f"got {limit!r}"[:200], failure_type=CONFIG_ERROR)
        text = final_assistant_text(messages) or ""
        vm = data.verifier_metadata
        if len(text) > limit:
            return Score(reward=0.0, details={
                "failure_reason": f"response_too_long: {len(text)} characters exceeds {limit}",
                "follow_all_instructions": False, "follow_instruction_list": [False] * len(vm.instruction_id_list)})
        details = await asyncio.to_thread(grade, vm, text)
        return Score(reward=details.pop("reward"), details={"instruction_id_list": vm.instruction_id_list, **details})

    async def validate(self, task: Task) -> None:
        """No gold answer to score; the row is still checked (ids, kwargs)."""
        self.parse_task(task)
        return None
