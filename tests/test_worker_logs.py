"""Worker logs: an expected, typed activity failure is one line; a bug keeps its traceback."""

from __future__ import annotations

import asyncio
import logging
import sys

import pytest
from temporalio.exceptions import ApplicationError

from gymflow.kernel.logfilter import ACTIVITY_LOGGER, ExpectedFailureFilter, quiet_expected_failures
from gymflow.testing.scripted_openai import context_length_error
from tests.faulty_env import TRACEBACK_TEXT, faulty_env, faulty_task  # noqa: F401 - fixture
from tests.helpers import user_task

SDK_MESSAGE = "Completing activity as failed"
DETAILS = {"activity_type": "generate", "workflow_id": "wf-1", "attempt": 2}


def _sdk_record(err: BaseException, level: int = logging.WARNING) -> logging.LogRecord:
    """The record the SDK emits for a failed attempt (temporalio/worker/_activity.py)."""
    try:
        raise err
    except BaseException:
        exc_info = sys.exc_info()
    record = logging.getLogger(ACTIVITY_LOGGER).makeRecord(
        ACTIVITY_LOGGER, level, __file__, 1, f"{SDK_MESSAGE} ({DETAILS})", (), exc_info,
        extra={"__temporal_error_identifier": "ActivityFailure", "temporal_activity": DETAILS})
    ExpectedFailureFilter().filter(record)
    return record


def test_typed_failure_becomes_one_line():
    record = _sdk_record(ApplicationError("prompt too long", type="context_length_exceeded", non_retryable=True))
    line = logging.Formatter().format(record)
    assert line == "activity generate failed (workflow wf-1, attempt 2): context_length_exceeded: prompt too long"


@pytest.mark.parametrize("err", [ApplicationError("bug", type="internal_error"), KeyError("city"),
                                 ApplicationError("not ours", type="SomethingElse")])
def test_untyped_failure_keeps_its_traceback(err):
    record = _sdk_record(err)
    assert record.exc_info and "Traceback" in logging.Formatter().format(record)
    assert SDK_MESSAGE in record.getMessage()


def test_debug_keeps_the_traceback():
    logger = logging.getLogger(ACTIVITY_LOGGER)
    old = logger.level
    logger.setLevel(logging.DEBUG)
    try:
        record = _sdk_record(ApplicationError("prompt too long", type="context_length_exceeded"))
    finally:
        logger.setLevel(old)
    assert record.exc_info and record.getMessage().startswith("activity generate failed")


async def test_context_length_400_logs_one_line_in_the_worker(gf, generate_pool, scripted, run_id):
    before = len(generate_pool.logs())
    scripted.script(context_length_error())
    inp = gf.make_input(run_id, user_task("a very long prompt"), 0, "pooled")
    summary = await gf.run_rollout(inp)
    assert summary.failure_type == "context_length_exceeded"
    for _ in range(50):  # the worker's log line may land a moment after the workflow ends
        new = generate_pool.logs()[before:]
        if inp.rollout_id in new:
            break
        await asyncio.sleep(0.1)
    # activities/generate.py logs its own "generation failed: <type>" line too; this is the SDK's record.
    lines = [ln for ln in new.splitlines() if f"(workflow {inp.rollout_id}," in ln]
    assert len(lines) == 1, new
    assert "WARNING" in lines[0] and "activity gymflow.episode.generate failed" in lines[0], lines
    assert "context_length_exceeded" in lines[0] and "maximum context length" in lines[0], lines
    assert "Traceback" not in new and SDK_MESSAGE not in new, new


async def test_environment_bug_still_logs_its_traceback(gf, scripted, faulty_env, run_id, caplog):  # noqa: F811
    quiet_expected_failures()  # as `gymflow worker` does; the env pool runs in this process
    caplog.set_level(logging.WARNING, logger=ACTIVITY_LOGGER)
    inp = gf.make_input(run_id, faulty_task("boom-setup", fail_in="setup"), 0, "policy")
    summary = await gf.run_rollout(inp)
    assert summary.failure_type == "environment_error"
    mine = [r for r in caplog.records if inp.rollout_id in str(getattr(r, "temporal_activity", {}))]
    # The boundary's own record carries the environment's traceback ...
    tracebacks = [r for r in mine if r.exc_info and isinstance(r.exc_info[1], RuntimeError)]
    assert tracebacks and str(tracebacks[0].exc_info[1]) == TRACEBACK_TEXT
    # ... and the SDK's record of each failed attempt is one line beside it.
    sdk = [r for r in mine if r.getMessage().startswith("activity ")]
    assert sdk and all(r.exc_info is None and "environment_error" in r.getMessage() for r in sdk)
