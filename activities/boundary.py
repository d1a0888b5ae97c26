"""Map gymflow's typed errors onto Temporal: deterministic ones become non-retryable ApplicationErrors."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from temporalio.exceptions import ApplicationError

from gymflow.kernel.errors import GymflowError


@contextmanager
def boundary() -> Iterator[None]:
    try:
        yield
    except GymflowError as e:
        raise ApplicationError(str(e), type=e.failure_type, non_retryable=True) from e
