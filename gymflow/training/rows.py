"""Export row shapes and their Arrow schemas, in the layouts TRL, NeMo RL and `datasets` read as they are.

SFT: `messages` (conversational language modelling) plus `prompt`/`completion` (conversational
prompt-completion). DPO: `prompt`, `chosen`, `rejected` (TRL's conversational preference format). RL: one
token-exact sequence per rollout (records.py). Stored transcripts are model output: every field is coerced
to the schema's type here, whatever the row holds.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import pyarrow as pa

from gymflow.training.groups import epoch_of, group_id
from gymflow.training.records import TokenSequence

_FUNCTION = pa.struct([("name", pa.string()), ("arguments", pa.string())])
_TOOL_CALL = pa.struct([("id", pa.string()), ("type", pa.string()), ("function", _FUNCTION)])
MESSAGE = pa.struct([("role", pa.string()), ("content", pa.string()), ("tool_calls", pa.list_(_TOOL_CALL)),
                     ("tool_call_id", pa.string()), ("name", pa.string())])
MESSAGES = pa.list_(MESSAGE)

_IDS = [("rollout_id", pa.string()), ("run_id", pa.string()), ("task_id", pa.string()), ("group_id", pa.string()),
        ("sample_index", pa.int32())]

RL_SCHEMA = pa.schema([
    *_IDS, ("reward", pa.float64()), ("masked", pa.bool_()),
    ("input_ids", pa.list_(pa.int32())), ("loss_mask", pa.list_(pa.int8())),
    ("logprobs", pa.list_(pa.float32())),  # null when the server gave none; 0.0 where loss_mask is 0
    ("policy_versions", pa.list_(pa.string())), ("turns", pa.int32()), ("turns_in_sequence", pa.int32()),
    ("token_drift", pa.bool_()), ("drift_turns", pa.list_(pa.int32())),
])
# `tools`: the task's tool schemas as a JSON string (null when it offered none), which TRL's SFTTrainer parses
# and hands to the chat template; a string because JSON Schemas differ per tool and per task.
SFT_SCHEMA = pa.schema([*_IDS, ("reward", pa.float64()), ("messages", MESSAGES), ("prompt", MESSAGES),
                        ("completion", MESSAGES), ("tools", pa.string())])
DPO_SCHEMA = pa.schema([
    ("run_id", pa.string()), ("task_id", pa.string()), ("group_id", pa.string()),
    ("prompt", MESSAGES), ("chosen", MESSAGES), ("rejected", MESSAGES),
    ("chosen_reward", pa.float64()), ("rejected_reward", pa.float64()),
    ("chosen_rollout_id", pa.string()), ("rejected_rollout_id", pa.string()),
])
SCHEMAS = {"rl": RL_SCHEMA, "sft": SFT_SCHEMA, "dpo": DPO_SCHEMA}


def _text(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, default=str)  # a non-string content still reaches the trainer


def _tool_call(call: Any) -> dict[str, Any]:
    call = call if isinstance(call, Mapping) else {}
    fn = call.get("function") if isinstance(call.get("function"), Mapping) else {}
    return {"id": _text(call.get("id")), "type": _text(call.get("type")) or "function",
            "function": {"name": _text(fn.get("name")), "arguments": _text(fn.get("arguments"))}}


def message(m: Any) -> dict[str, Any]:
    """One stored transcript message in the export's message shape."""
    m = m if isinstance(m, Mapping) else {"role": "user", "content": _text(m)}
    calls = m.get("tool_calls")
    tool_calls = [_tool_call(c) for c in calls] if isinstance(calls, list) and calls else None
    content = _text(m.get("content"))
    if tool_calls and content is None:
        content = ""  # chat templates concatenate `content`; a null (or one dropped by TRL) fails to render
    return {"role": _text(m.get("role")) or "user", "content": content, "tool_calls": tool_calls,
            "tool_call_id": _text(m.get("tool_call_id")), "name": _text(m.get("name"))}


def tools_json(stored: Any) -> str | None:
    """The task's stored tool schemas (`tasks.tools`: ToolSpec dumps) as the Chat Completions `tools` list, in
    JSON; None when it offered none. Entries without a string name are dropped (stored JSON is not trusted)."""
    if not isinstance(stored, list):
        return None
    out = []
    for t in stored:
        if not isinstance(t, Mapping) or not isinstance(t.get("name"), str):
            continue
        fn: dict[str, Any] = {"name": t["name"], "description": _text(t.get("description")) or "",
                              "parameters": t.get("parameters") if isinstance(t.get("parameters"), Mapping)
                              else {"type": "object", "properties": {}}}
        if isinstance(t.get("strict"), bool):
            fn["strict"] = t["strict"]
        out.append({"type": "function", "function": fn})
    return json.dumps(out, ensure_ascii=False) if out else None


def split_transcript(transcript: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(prompt, completion): the messages before the first assistant message, and the rest."""
    messages = [message(m) for m in transcript] if isinstance(transcript, list) else []
    first = next((i for i, m in enumerate(messages) if m["role"] == "assistant"), len(messages))
    return messages[:first], messages[first:]


def row_group(r: Mapping[str, Any], per_task: int | None) -> str:
    """The rollout's group (groups.group_id): its task's samples in its epoch."""
    return group_id(r["run_id"], r["task_id"], epoch_of(r["sample_index"], per_task))


def ids(r: Mapping[str, Any], per_task: int | None) -> dict[str, Any]:
    return {"rollout_id": r["id"], "run_id": r["run_id"], "task_id": r["task_id"],
            "group_id": row_group(r, per_task), "sample_index": r["sample_index"]}


def rl_row(r: Mapping[str, Any], seq: TokenSequence, per_task: int | None) -> dict[str, Any]:
    return {**ids(r, per_task), "reward": r["reward"], "masked": r["masked"], "input_ids": seq.input_ids,
            "loss_mask": seq.loss_mask, "logprobs": seq.logprobs, "policy_versions": seq.policy_versions,
            "turns": seq.turns, "turns_in_sequence": seq.turns_in_sequence, "token_drift": seq.token_drift,
            "drift_turns": seq.drift_turns}


def sft_row(r: Mapping[str, Any], per_task: int | None) -> dict[str, Any]:
    prompt, completion = split_transcript(r["transcript"])
    return {**ids(r, per_task), "reward": r["reward"], "messages": prompt + completion, "prompt": prompt,
            "completion": completion, "tools": tools_json(r.get("tools"))}


def dpo_row(chosen: Mapping[str, Any], rejected: Mapping[str, Any], per_task: int | None) -> dict[str, Any] | None:
    """The preference pair, or None when the two samples were not asked the same prompt."""
    prompt, chosen_msgs = split_transcript(chosen["transcript"])
    rejected_prompt, rejected_msgs = split_transcript(rejected["transcript"])
    if prompt != rejected_prompt:
        return None
    return {"run_id": chosen["run_id"], "task_id": chosen["task_id"],
            "group_id": row_group(chosen, per_task), "prompt": prompt, "chosen": chosen_msgs,
            "rejected": rejected_msgs, "chosen_reward": chosen["reward"], "rejected_reward": rejected["reward"],
            "chosen_rollout_id": chosen["id"], "rejected_rollout_id": rejected["id"]}


def weight(row: Mapping[str, Any]) -> int:
    """Rough in-memory size of a row, so a batch is flushed by size as well as by count."""
    if "input_ids" in row:
        return 100 + 120 * len(row["input_ids"])  # three Python lists per token
    total = 100
    for key in ("messages", "chosen", "rejected", "prompt"):
        for m in row.get(key) or ():
            total += 200 + len(m["content"] or "") + sum(len(c["function"]["arguments"] or "")
                                                         for c in m["tool_calls"] or ())
    return total
