"""The wait of the start-up retries (Postgres, Temporal): exponential from 0.5 s, never past the overall bound."""

from __future__ import annotations

from collections.abc import Callable

from tenacity import RetryCallState, wait_exponential


def until(bound_s: float, max_s: float = 5.0) -> Callable[[RetryCallState], float]:
    """0.5, 1, 2, 4, `max_s`, ... s, the last wait cut to end at `bound_s`, so one more attempt is made there."""
    backoff = wait_exponential(multiplier=0.5, max=max_s)
    return lambda rs: min(backoff(rs), max(bound_s - rs.seconds_since_start, 0.05))
