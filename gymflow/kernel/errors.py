"""The three kinds of error (design.md): the model sees it, retry it, or fail the rollout with a type."""

from __future__ import annotations

from gymflow.kernel.failures import (  # noqa: F401 - the failure type names, re-exported
    ACTIVITY_TIMEOUT,
    BAD_TASK,
    CONFIG_ERROR,
    CONTEXT_LENGTH,
    ENVIRONMENT_ERROR,
    INTERNAL_ERROR,
    MODEL_AUTH,
    MODEL_BAD_REQUEST,
    MODEL_BAD_RESPONSE,
    MODEL_UNAVAILABLE,
    RATE_LIMITED,
    STORE_UNAVAILABLE,
    TRANSCRIPT_TOO_LARGE,
    UNKNOWN_ENV,
    UNKNOWN_MODEL,
    VERIFIER_FAILED,
)


class ToolError(Exception):
    """Raised by an environment tool; goes back to the model as a tool message. The episode goes on."""


class GymflowError(Exception):
    """A deterministic failure with a stable `failure_type`; never retried."""

    failure_type = INTERNAL_ERROR  # subclasses and callers name a type from gymflow/kernel/failures.py

    def __init__(self, message: str, *, failure_type: str | None = None) -> None:
        super().__init__(message)
        if failure_type:
            self.failure_type = failure_type


class ConfigError(GymflowError):
    failure_type = CONFIG_ERROR


class TaskError(GymflowError):
    """A dataset row that does not fit the environment's task type."""

    failure_type = BAD_TASK


class VerifierError(GymflowError):
    """The verifier (or its judge) could not score: the rollout is masked, never scored 0."""

    failure_type = VERIFIER_FAILED
