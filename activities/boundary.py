"""Every activity boundary classifies what it raises into the closed set of gymflow/kernel/failures.py.

A failure that reaches Temporal is always an ApplicationError whose `type` is a known failure type and
whose message is one short line: never a Python class name as the type, never a chained traceback
(a raw SQLAlchemy error with its causes once outgrew Temporal's failure size and was recorded as
"Failure exceeds size limit.").
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from contextlib import AbstractAsyncContextManager, contextmanager
from datetime import UTC, datetime
from typing import Any, Literal, TypeVar

import psycopg
import sqlalchemy.exc as sa_exc
from gymflow.activities import redact
from temporalio import activity
from temporalio.exceptions import ApplicationError

from gymflow.kernel import failures
from gymflow.kernel.errors import GymflowError

Source = Literal["gymflow", "environment"]
T = TypeVar("T")
C = TypeVar("C")

# Errors of the store. Data, integrity and programming errors are deterministic (retrying the same write
# cannot help); everything else (connection refused, reset, pool timeout) is worth retrying.
STORE_ERRORS: tuple[type[BaseException], ...] = (sa_exc.SQLAlchemyError, psycopg.Error)
_STORE_DETERMINISTIC: tuple[type[BaseException], ...] = (
    sa_exc.DataError, sa_exc.IntegrityError, sa_exc.ProgrammingError, sa_exc.ArgumentError,
    psycopg.DataError, psycopg.IntegrityError, psycopg.ProgrammingError,
)


def _first_line(err: BaseException) -> str:
    # SQLAlchemy appends "(Background on this error at: ...)" and the statement on later lines; the first
    # line of the DBAPI error is what a person needs.
    orig = getattr(err, "orig", None)
    return failures.short_message(orig if orig is not None else err, limit=300)


def store_failure(err: BaseException, what: str = "store") -> ApplicationError:
    """A short, typed failure for a store error; retryable unless the write itself is at fault."""
    deterministic = isinstance(err, _STORE_DETERMINISTIC)
    return ApplicationError(failures.short_message(f"{what}: Postgres refused the write: {_first_line(err)}"),
                            type=failures.STORE_UNAVAILABLE, non_retryable=deterministic)


def classify(err: BaseException, source: Source = "gymflow", where: str = "") -> ApplicationError:
    """The one decision at an activity boundary: which failure type, retryable or not, what message. The message
    has the worker's secrets redacted before it is cut short (a cut key would no longer match): a model endpoint's
    error text, a tool's exception or a verifier's message may quote a key, and it goes into history, the log and
    the rollout row."""
    red = redact.current()
    prefix = f"{where}: " if where else ""
    if isinstance(err, ApplicationError):
        # Already classified (the model client, a nested boundary): keep its retry decision, make sure the
        # type is known and the message short.
        if err.type in failures.FAILURE_TYPES and len(err.message) <= failures.MAX_MESSAGE_CHARS \
                and "\n" not in err.message and not red.hits(err.message):
            return err
        return ApplicationError(failures.short_message(red.text(err.message)), *err.details,
                                type=failures.known(err.type), non_retryable=err.non_retryable,
                                next_retry_delay=err.next_retry_delay)
    if isinstance(err, GymflowError):
        return ApplicationError(failures.short_message(red.text(f"{prefix}{err}")),
                                type=failures.known(err.failure_type), non_retryable=True)
    if isinstance(err, STORE_ERRORS):
        failure = store_failure(err, where or "store")
        return ApplicationError(red.text(failure.message), type=failure.type, non_retryable=failure.non_retryable)
    # An unexpected error: the class name goes into the message (a bare KeyError says only "'city'"),
    # never into the type. Retryable: a flaky environment may pass next time; the activity policy bounds it.
    kind = failures.ENVIRONMENT_ERROR if source == "environment" else failures.INTERNAL_ERROR
    text = red.text(str(err).strip())
    detail = f"{type(err).__name__}: {text}" if text else type(err).__name__
    return ApplicationError(failures.short_message(f"{prefix}{detail}"), type=kind)


@contextmanager
def boundary(source: Source = "gymflow", where: str = "") -> Iterator[None]:
    """Raise whatever escapes as a classified ApplicationError (`from None`: the cause chain never travels)."""
    try:
        yield
    except Exception as e:
        typed = classify(e, source, where)
        if typed is e:
            raise
        if typed.type in (failures.INTERNAL_ERROR, failures.ENVIRONMENT_ERROR) and activity.in_activity():
            activity.logger.warning("%s", typed.message, exc_info=True)  # the full traceback stays in the log
        raise typed from None


def heartbeat_every() -> float:
    """How often to heartbeat: a third of the heartbeat timeout (the SDK throttles to 0.8 of it), at most 5 s."""
    hb = activity.info().heartbeat_timeout if activity.in_activity() else None
    return min(hb.total_seconds() / 3, 5.0) if hb else 5.0


async def heartbeating(work: Awaitable[T], *details: Any) -> T:
    """Await `work`, heartbeating meanwhile, so a dead worker is noticed at the heartbeat timeout rather than
    at start-to-close. Cancelling the activity cancels `work`."""
    if activity.in_activity() and activity.info().is_local:  # no heartbeats: its workflow task is kept alive
        return await work
    task = asyncio.ensure_future(work)
    every = heartbeat_every()
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=every)
            if done:
                return task.result()
            if activity.in_activity():
                activity.heartbeat(*details)
    finally:
        task.cancel()


# A write after paid-for work (a model answer) is retried here, not by re-running the activity: a database
# blip must never cost a second model call. Bounded by STORE_RETRY_S and by the attempt's start-to-close.
STORE_RETRY_S = 60.0
STORE_ATTEMPT_TIMEOUT_S = 20.0  # one hung write (a dropped connection) must not use up the whole budget
_MARGIN_S = 2.0


def _log(fmt: str, *args: object) -> None:
    if activity.in_activity():
        activity.logger.warning(fmt, *args)


def _attempt_time_left() -> float | None:
    if not activity.in_activity():
        return None
    info = activity.info()
    if not info.start_to_close_timeout:
        return None
    elapsed = (datetime.now(UTC) - info.started_time).total_seconds()
    return info.start_to_close_timeout.total_seconds() - elapsed - _MARGIN_S


async def retry_read(connect: Callable[[], AbstractAsyncContextManager[C]], read: Callable[[C], Awaitable[T]],
                     what: str, *, budget_s: float = STORE_RETRY_S) -> T:
    """`read` on a connection from `connect` (a pool's `connection` or a sessionmaker), retried as `retry_store`."""
    out: list[T] = []

    async def attempt() -> None:
        async with connect() as conn:
            out.append(await read(conn))

    await retry_store(attempt, what, budget_s=budget_s)
    return out[-1]


async def retry_store(write: Callable[[], Awaitable[None]], what: str, *details: Any,
                      budget_s: float = STORE_RETRY_S) -> None:
    """Run `write` (one transaction) until it succeeds, with bounded exponential backoff, heartbeating.

    Gives up as `store_unavailable` when the budget (or the attempt's own time) is spent, or at once on a
    deterministic store error."""
    loop = asyncio.get_running_loop()
    left = _attempt_time_left()
    deadline = loop.time() + (min(budget_s, max(left, 1.0)) if left is not None else budget_s)
    delay, tries = 0.2, 0
    while True:
        tries += 1
        try:
            timeout = max(0.5, min(STORE_ATTEMPT_TIMEOUT_S, deadline - loop.time()))
            await heartbeating(asyncio.wait_for(write(), timeout), *details)
            return
        except (*STORE_ERRORS, TimeoutError) as e:
            err = store_failure(e, what) if not isinstance(e, TimeoutError) else ApplicationError(
                f"{what}: the write did not finish in {timeout:.0f} s", type=failures.STORE_UNAVAILABLE)
            if err.non_retryable or loop.time() + delay >= deadline:
                _log("%s (gave up after %d tries)", err.message, tries)
                raise err from None
            _log("%s; retrying in %.1f s", err.message, delay)
            await heartbeating(asyncio.sleep(delay), *details)
            delay = min(delay * 2, 5.0)
