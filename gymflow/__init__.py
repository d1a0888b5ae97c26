"""gymflow: durable LLM RL rollout collection on Temporal and Postgres.

`import gymflow` is the front door: every name in `__all__` is loaded on first use (PEP 562), so importing the
package stays cheap. Workflow code (`gymflow.workflows.*`) is imported inside Temporal's sandbox and lower
layers import `gymflow.kernel`: neither may pull the client, the store or the CLI in through this file.

    import gymflow

    tasks, errors = gymflow.load_jsonl("data.jsonl", env="single_tool")
    with gymflow.connect() as client:                      # $GYMFLOW_CONFIG or ./gymflow.yaml
        for r in client.collect("my-run", tasks, n=4):
            print(r.summary.rollout_id, r.summary.reward)
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gymflow.client import CollectResult, GymflowClient
    from gymflow.data.datasets import DatasetError, load_jsonl
    from gymflow.environments.base import Environment, TaskData, ToolOutput, VerifyContext
    from gymflow.kernel.config import Settings, load_settings
    from gymflow.kernel.errors import ConfigError, GymflowError, TaskError, ToolError, VerifierError
    from gymflow.kernel.failures import FAILURE_TYPES, FailureType
    from gymflow.kernel.wire import ChatMessage, RolloutSummary, SamplingParams, Score, Task, ToolCall, ToolSpec
    from gymflow.sync import SyncClient, connect
    from gymflow.training.export import ExportSummary, export, export_run
    from gymflow.training.groups import Group, Verdict, usable
    from gymflow.training.iterator import Position, RolloutIterator, iterate_groups
    from gymflow.training.policy import current_policy_version, declare_policy_version
    from gymflow.training.records import TokenSequence, TrainingRecord, TurnTokens, build_sequence, group_records

_WHERE: dict[str, str] = {
    # connecting and collecting
    "connect": "gymflow.sync", "SyncClient": "gymflow.sync",
    "GymflowClient": "gymflow.client", "CollectResult": "gymflow.client",
    "load_settings": "gymflow.kernel.config", "Settings": "gymflow.kernel.config",
    "load_jsonl": "gymflow.data.datasets", "DatasetError": "gymflow.data.datasets",
    # the wire types
    "Task": "gymflow.kernel.wire", "ChatMessage": "gymflow.kernel.wire", "ToolCall": "gymflow.kernel.wire",
    "ToolSpec": "gymflow.kernel.wire", "Score": "gymflow.kernel.wire", "SamplingParams": "gymflow.kernel.wire",
    "RolloutSummary": "gymflow.kernel.wire",
    # writing an environment
    "Environment": "gymflow.environments.base", "TaskData": "gymflow.environments.base",
    "ToolOutput": "gymflow.environments.base", "VerifyContext": "gymflow.environments.base",
    "ToolError": "gymflow.kernel.errors", "TaskError": "gymflow.kernel.errors",
    "VerifierError": "gymflow.kernel.errors", "ConfigError": "gymflow.kernel.errors",
    "GymflowError": "gymflow.kernel.errors",
    # failures: the closed set a rollout is recorded with
    "FAILURE_TYPES": "gymflow.kernel.failures", "FailureType": "gymflow.kernel.failures",
    # training
    "iterate_groups": "gymflow.training.iterator", "RolloutIterator": "gymflow.training.iterator",
    "Position": "gymflow.training.iterator",
    "Group": "gymflow.training.groups", "Verdict": "gymflow.training.groups", "usable": "gymflow.training.groups",
    "TrainingRecord": "gymflow.training.records", "group_records": "gymflow.training.records",
    "TokenSequence": "gymflow.training.records", "TurnTokens": "gymflow.training.records",
    "build_sequence": "gymflow.training.records",
    "declare_policy_version": "gymflow.training.policy", "current_policy_version": "gymflow.training.policy",
    "export": "gymflow.training.export", "export_run": "gymflow.training.export",
    "ExportSummary": "gymflow.training.export",
}

# Written out, not computed from _WHERE: ruff, type checkers and IDEs read a literal `__all__` only.
__all__ = [
    "ChatMessage", "CollectResult", "ConfigError", "DatasetError", "Environment", "ExportSummary", "FAILURE_TYPES",
    "FailureType", "Group", "GymflowClient", "GymflowError", "Position", "RolloutIterator", "RolloutSummary",
    "SamplingParams", "Score", "Settings", "SyncClient", "Task", "TaskData", "TaskError", "TokenSequence",
    "ToolCall", "ToolError", "ToolOutput", "ToolSpec", "TrainingRecord", "TurnTokens", "Verdict", "VerifierError",
    "VerifyContext", "build_sequence", "connect", "current_policy_version", "declare_policy_version", "export",
    "export_run", "group_records", "iterate_groups", "load_jsonl", "load_settings", "usable",
]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'gymflow' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value  # the next lookup does not come here
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
