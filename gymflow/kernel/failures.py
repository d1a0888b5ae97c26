"""The closed set of failure types a rollout can be recorded with (docs/failures.md documents each).

A recorded `failure_type` is always one of `FAILURE_TYPES`, never a Python class name: exceptions from
environment code, verifiers, the store and the model client are classified at the activity boundary
(`activities/boundary.py`), and anything unforeseen becomes `internal_error` with the cause's first line.
`tests/test_failure_taxonomy.py` checks this table against the docs and drives each type through the stack.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Outcome = Literal["failed", "masked"]


@dataclass(frozen=True)
class FailureType:
    name: str
    outcome: Outcome  # failed: no reward recorded; masked: completed but unscorable (never a 0)
    retried: bool  # whether the step that raised it is retried (bounded) before the type is recorded
    meaning: str
    action: str  # what the user does about it


_TYPES = (
    # -- the model endpoint --
    FailureType("context_length_exceeded", "failed", False, "The prompt plus the transcript no longer fit the "
                "model's context window.", "Lower max_turns or tool output sizes, or use a longer-context model."),
    FailureType("model_bad_request", "failed", False, "The endpoint rejected the request as malformed (400, 404, "
                "422): wrong model name, unsupported parameter.", "Fix the model's config (model, extra_body)."),
    FailureType("model_auth_failed", "failed", False, "The endpoint refused the credentials (401, 403).",
                "Set the environment variable named by models.<name>.api_key_env on the generate workers."),
    FailureType("model_unavailable", "failed", True, "5xx, connection failures or timeouts on every attempt.",
                "Check the model server; `gymflow resume RUN` continues from the failed turn."),
    FailureType("rate_limited", "failed", True, "429 on every attempt (Retry-After honoured).",
                "Lower pools.generate.concurrency or rate_limit_per_s; resume the run."),
    FailureType("model_bad_response", "failed", True, "The endpoint answered 200 with something that is not a "
                "chat completion (non-JSON, HTML, no choices, a null message).",
                "Check the endpoint is OpenAI-compatible (a proxy error page is the usual cause); resume the run."),
    FailureType("unknown_model", "failed", False, "A worker that ran the rollout has no config for a model it "
                "needs: a judge model missing on an env worker, or a generation scheduled on the shared queue of "
                "before per-model queues (generation now waits on its model's own queue).",
                "Add the model under `models` on that pool's config."),
    FailureType("reply_too_large", "failed", False, "One model reply was longer than limits.max_reply_chars "
                "(content plus tool call arguments); it was not stored.",
                "Set max_tokens in the sampling settings, or raise limits.max_reply_chars."),
    FailureType("too_many_tool_calls", "failed", False, "One model reply made more tool calls than "
                "limits.max_tool_calls_per_turn; none of them ran.",
                "Raise limits.max_tool_calls_per_turn if the environment needs that many; else the model misbehaves."),
    FailureType("recording_exhausted", "failed", False, "A recorded model has no further turn for this task.",
                "The recording and the dataset do not match; rebuild it with `gymflow data join`."),
    # -- the task and the episode --
    FailureType("bad_task", "failed", False, "The dataset row does not fit its environment's task type.",
                "Run `gymflow data prepare FILE --env ENV`: it names the line and field."),
    FailureType("unknown_environment", "failed", False, "The row names an environment no worker has installed.",
                "See `gymflow env list`; install the plug-in on the env workers."),
    FailureType("transcript_too_large", "failed", False, "The episode outgrew limits.max_episode_bytes.",
                "Lower max_turns or tool output sizes, or raise the limit."),
    FailureType("environment_error", "failed", True, "Environment code (setup, a tool, verify) raised an unexpected "
                "error on every attempt: a bug in the environment, not the model's fault.",
                "Read the message (the error's first line) and the env worker's log; fix the environment."),
    # -- verification (masked: excluded from training and metrics, never scored 0) --
    FailureType("verifier_failed", "masked", False, "The verifier could not score the episode.",
                "Read score_details.error; the rollout is excluded from rewards."),
    FailureType("verifier_timeout", "masked", False, "The verifier (or a check it ran, e.g. math-verify) ran past its "
                "wall-clock limit in its supervised process; the limit counts from when a process took the call.",
                "Raise environments.<env>.verify_timeout_s if such answers are legitimately slow to check."),
    FailureType("verifier_crashed", "masked", False, "The verifier's supervised process died (killed, exited, or "
                "past its memory cap) before it gave a verdict.",
                "Read score_details.error; raise environments.<env>.memory_mb if the check needs more memory."),
    FailureType("judge_failed", "masked", True, "The judge model gave no usable verdict after its retries.",
                "Check the judge model; rerun verification with `gymflow resume`."),
    FailureType("judge_unavailable", "masked", False, "A judge is needed but none is configured or reachable.",
                "Configure environments.<env>.judge_model."),
    FailureType("sandbox_unavailable", "masked", False, "No sandbox can run model code on this worker (bwrap "
                "missing or user namespaces disabled).", "Install bubblewrap on the env workers (docs/security.md)."),
    # -- infrastructure --
    FailureType("activity_timeout", "failed", True, "A step exceeded its timeouts on every attempt (a hung call, "
                "or a worker that died and never came back).", "Check the pool's workers; resume the run."),
    FailureType("worker_lost", "failed", True, "A step of the rollout was lost with its worker again and again "
                "(the workflow pool's process died or hung each time it ran it: the step is poison).",
                "Read the workflow pool's logs around the rollout id (out of memory, a crash); resume once fixed."),
    FailureType("store_unavailable", "failed", True, "Postgres could not be reached or refused a write on every "
                "attempt.", "Check DATABASE_URL and the database; resume the run."),
    FailureType("workflow_terminated", "failed", False, "Someone terminated the rollout's workflow.",
                "Intentional stops need nothing; otherwise rerun with --retry-failed."),
    FailureType("workflow_cancelled", "failed", False, "The rollout's workflow was cancelled.",
                "Rerun with --retry-failed if it should complete."),
    FailureType("workflow_timed_out", "failed", False, "The workflow ran past its execution timeout (24 h).",
                "Look for a pool with no workers; rerun with --retry-failed."),
    FailureType("start_rejected", "failed", False, "Temporal refused to start the rollout (e.g. the task is over "
                "the payload limit).", "Shrink the row; `gymflow data prepare` flags oversized rows."),
    FailureType("config_error", "failed", False, "A worker's configuration cannot serve this rollout.",
                "Fix the config file the message names."),
    FailureType("internal_error", "failed", True, "An unexpected error in gymflow itself; the message carries its "
                "first line.", "Report it with the rollout id; resume the run once fixed."),
)

FAILURE_TYPES: dict[str, FailureType] = {t.name: t for t in _TYPES}

# Names used in code; each must be a key of FAILURE_TYPES (checked by the taxonomy test).
CONTEXT_LENGTH = "context_length_exceeded"
MODEL_BAD_REQUEST = "model_bad_request"
MODEL_AUTH = "model_auth_failed"
MODEL_UNAVAILABLE = "model_unavailable"
RATE_LIMITED = "rate_limited"
MODEL_BAD_RESPONSE = "model_bad_response"
UNKNOWN_MODEL = "unknown_model"
RECORDING_EXHAUSTED = "recording_exhausted"
REPLY_TOO_LARGE = "reply_too_large"
TOO_MANY_TOOL_CALLS = "too_many_tool_calls"
BAD_TASK = "bad_task"
UNKNOWN_ENV = "unknown_environment"
TRANSCRIPT_TOO_LARGE = "transcript_too_large"
ENVIRONMENT_ERROR = "environment_error"
VERIFIER_FAILED = "verifier_failed"
VERIFIER_TIMEOUT = "verifier_timeout"
VERIFIER_CRASHED = "verifier_crashed"
JUDGE_FAILED = "judge_failed"
JUDGE_UNAVAILABLE = "judge_unavailable"
SANDBOX_UNAVAILABLE = "sandbox_unavailable"
ACTIVITY_TIMEOUT = "activity_timeout"
WORKER_LOST = "worker_lost"
STORE_UNAVAILABLE = "store_unavailable"
WORKFLOW_TERMINATED = "workflow_terminated"
WORKFLOW_CANCELLED = "workflow_cancelled"
WORKFLOW_TIMED_OUT = "workflow_timed_out"
START_REJECTED = "start_rejected"
CONFIG_ERROR = "config_error"
INTERNAL_ERROR = "internal_error"

MAX_MESSAGE_CHARS = 500  # a recorded failure message: short, so a failure never outgrows Temporal's limits


def known(name: str | None) -> str:
    """`name` when it is in the closed set, else `internal_error`."""
    return name if name in FAILURE_TYPES else INTERNAL_ERROR


def short_message(text: object, limit: int = MAX_MESSAGE_CHARS) -> str:
    """The first line of an error's text, NUL-free and capped: chained tracebacks never travel."""
    first = str(text).replace("\x00", "").strip().splitlines()
    line = first[0] if first else ""
    return line if len(line) <= limit else line[: limit - 1] + "…"
