"""One log line, not a traceback, for each expected, typed activity failure; the SDK core's logs made readable.

The Temporal SDK logs every failed activity attempt as "Completing activity as failed" at WARNING with
the traceback (logger `temporalio.activity`). For a failure gymflow raised on purpose, classified into
the closed set (a model 400, a bad task, an environment error whose traceback `activities/boundary.py`
already logged), those ~30 lines say nothing the type and message do not, and they bury real problems.
Such a record is rewritten to one line: activity, workflow, attempt, failure type, message. The
traceback stays when the logger runs at DEBUG, and for `internal_error` and anything not an
ApplicationError (a bug in gymflow, which is what tracebacks are for).
"""

from __future__ import annotations

import logging
import math
import re
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from temporalio.exceptions import ApplicationError

from gymflow.kernel.failures import FAILURE_TYPES, INTERNAL_ERROR

ACTIVITY_LOGGER = "temporalio.activity"
_SDK_FAILURE_MARK = "__temporal_error_identifier"  # the `extra` the SDK puts on its failure record


def expected_failure(err: BaseException | None) -> ApplicationError | None:
    """`err` when it is a typed failure gymflow raised on purpose, else None."""
    if isinstance(err, ApplicationError) and err.type in FAILURE_TYPES and err.type != INTERNAL_ERROR:
        return err
    return None


class ExpectedFailureFilter(logging.Filter):
    """Rewrites the SDK's failed-attempt record for an expected failure into one line (see module doc)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, _SDK_FAILURE_MARK, None) != "ActivityFailure" or not record.exc_info:
            return True
        err = expected_failure(record.exc_info[1])
        if err is None:
            return True
        info: dict[str, Any] = getattr(record, "temporal_activity", None) or {}
        record.msg = "activity %s failed (workflow %s, attempt %s): %s: %s"
        record.args = (info.get("activity_type", "?"), info.get("workflow_id", "?"), info.get("attempt", "?"),
                       err.type, err.message)
        if not logging.getLogger(record.name).isEnabledFor(logging.DEBUG):
            record.exc_info, record.exc_text = None, None
        return True


def quiet_expected_failures() -> None:
    """Install the filter on the SDK's activity logger (idempotent)."""
    logger = logging.getLogger(ACTIVITY_LOGGER)
    if not any(isinstance(f, ExpectedFailureFilter) for f in logger.filters):
        logger.addFilter(ExpectedFailureFilter())


_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
_CORE_CODE = re.compile(r"TMPRL\d{4}")


class CoreLogFilter(logging.Filter):
    """For the SDK core's forwarded records: colour codes stripped (they are raw bytes in a log file), the
    `expected` codes dropped, and each other TMPRL code shown at most once per `every_s` (under load the core
    repeats one warning per workflow task), the next one saying how many were held back."""

    def __init__(self, expected: Iterable[str] = (), every_s: float = 60.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.expected, self.every_s, self.clock = frozenset(expected), every_s, clock
        self._shown: dict[str, float] = {}
        self._held: dict[str, int] = {}
        self._lock = threading.Lock()  # the core's logs arrive on the SDK's thread, ours on the loop's

    def filter(self, record: logging.LogRecord) -> bool:
        text = _ANSI.sub("", record.getMessage())
        found = _CORE_CODE.search(text)
        code = found.group() if found else None
        if code in self.expected:
            return False
        if code is not None:
            with self._lock:
                now = self.clock()
                if now - self._shown.get(code, -math.inf) < self.every_s:
                    self._held[code] = self._held.get(code, 0) + 1
                    return False
                self._shown[code] = now
                if held := self._held.pop(code, 0):
                    text += f" ({held} more {code} since the last one, not shown)"
        record.msg, record.args = text, ()
        return True
