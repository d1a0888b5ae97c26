"""The faults gymflow's NeMo RL actor (gymflow/integrations/nemo_rl.py) raises, typed as NeMo RL classifies them
(`ConnectionError`: infra, redispatched; `ValueError`: data). Each pickles from its message and fields: Ray
carries them from the actor."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


class StackUnavailable(ConnectionError):
    """Temporal, Postgres or the client's loop is gone. Calling again once it is back attaches to the same
    rollouts: finished ones are read, running ones waited for."""


class RowsRefused(ValueError):
    """Rows that cannot be rollouts (their environment is not installed, or they do not fit it); nothing ran."""


@dataclass(frozen=True)
class FailedRow:
    row_index: int  # the row's `_rowidx`
    rollout_id: str
    failure_type: str  # one of gymflow.kernel.failures.FAILURE_TYPES
    message: str
    retryable: bool  # the type is transient (failures.FailureType.retried): another attempt may succeed


class RolloutFailed(RuntimeError):
    """Rows whose rollouts failed or were masked (after gymflow's retries): not trainable, never scored 0."""

    def __init__(self, message: str, failed: Sequence[FailedRow] = ()) -> None:
        super().__init__(message)
        self.failed = tuple(failed)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.failed))


class RolloutInfraFailed(RolloutFailed, ConnectionError):
    """Every failure is of a transient type (the model server or a pool was down): NeMo RL's infra budget."""


class RolloutDataFailed(RolloutFailed, ValueError):
    """At least one failure is deterministic (bad request, context length, bad task): NeMo RL's data budget."""


def rollout_failure(failed: list[FailedRow], total: int) -> RolloutFailed:
    kinds = Counter(f.failure_type for f in failed)
    first = failed[0]
    message = (f"gymflow: {len(failed)} of {total} rows failed ({', '.join(f'{n} {t}' for t, n in kinds.items())});"
               f" first: row {first.row_index} {first.rollout_id}: {first.failure_type}: {first.message}")
    cls = RolloutInfraFailed if all(f.retryable for f in failed) else RolloutDataFailed
    return cls(message, failed)
