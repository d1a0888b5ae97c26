"""The three kinds of error (design.md): the model sees it, retry it, or fail the rollout with a type."""

from __future__ import annotations


class ToolError(Exception):
    """Raised by an environment tool; goes back to the model as a tool message. The episode goes on."""


class GymflowError(Exception):
    """A deterministic failure with a stable `failure_type`; never retried."""

    failure_type = "gymflow_error"

    def __init__(self, message: str, *, failure_type: str | None = None) -> None:
        super().__init__(message)
        if failure_type:
            self.failure_type = failure_type


class ConfigError(GymflowError):
    failure_type = "config_error"


class TaskError(GymflowError):
    """A dataset row that does not fit the environment's task type."""

    failure_type = "bad_task"


class VerifierError(GymflowError):
    """The verifier (or its judge) could not score: the rollout is masked, never scored 0."""

    failure_type = "verifier_failed"


# Failure types the workflow records; kept as constants so SQL users can rely on them.
CONTEXT_LENGTH = "context_length_exceeded"
MODEL_BAD_REQUEST = "model_bad_request"
MODEL_AUTH = "model_auth_failed"
MODEL_UNAVAILABLE = "model_unavailable"
RATE_LIMITED = "rate_limited"
ACTIVITY_TIMEOUT = "activity_timeout"
UNKNOWN_ENV = "unknown_environment"
UNKNOWN_MODEL = "unknown_model"
TRANSCRIPT_TOO_LARGE = "transcript_too_large"
