"""Every failure is one of a documented, closed set, with a short message: checked statically (docs, source)
and by driving each type that can arise through the real stack."""

from __future__ import annotations

import ast
import re
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
import sqlalchemy.exc as sa_exc
from gymflow.activities.boundary import boundary, classify
from gymflow.workflows.options import failure_of
from temporalio.exceptions import ActivityError, ApplicationError, RetryState

from gymflow.client import GymflowClient
from gymflow.kernel import errors, failures
from gymflow.kernel.config import Settings
from gymflow.kernel.errors import GymflowError, TaskError
from gymflow.kernel.failures import FAILURE_TYPES, MAX_MESSAGE_CHARS
from gymflow.kernel.wire import ChatMessage, RolloutInput, Task
from gymflow.testing.scripted_openai import (
    completion_json,
    context_length_error,
    disconnect,
    http_error,
    raw_body,
    text,
    tool_call,
)
from tests.conftest import ROOT
from tests.faulty_env import NAME, TRACEBACK_TEXT, faulty_env, faulty_task  # noqa: F401 - faulty_env: a fixture
from tests.helpers import user_task

SOURCE_DIRS = ("activities", "environments", "workflows", "gymflow")
RUN_ID = "tax-" + uuid.uuid4().hex[:8]  # one run for every case; the case is the task id


# -- (a) the set, the docs and the source agree ------------------------------------------------------------

def test_docs_list_exactly_the_failure_types():
    doc = (ROOT / "docs" / "failures.md").read_text()
    rows = re.findall(r"^\| `([a-z_]+)` \|", doc, flags=re.M)
    assert sorted(rows) == sorted(FAILURE_TYPES), "docs/failures.md and gymflow/kernel/failures.py disagree"
    assert len(rows) == len(set(rows))


def test_every_constant_in_failures_is_in_the_set():
    constants = {k: v for k, v in vars(failures).items() if k.isupper() and isinstance(v, str)}
    assert constants and set(constants.values()) <= set(FAILURE_TYPES), constants


_KERNEL = {"gymflow.kernel.failures": failures, "gymflow.kernel.errors": errors}


def _string_constants(tree: ast.Module) -> dict[str, str]:
    """Names a `type=NAME` may use: module-level NAME = "literal", and names imported from the kernel."""
    out = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            out.update({t.id: node.value.value for t in node.targets if isinstance(t, ast.Name)})
        if isinstance(node, ast.ImportFrom) and node.module in _KERNEL:
            for alias in node.names:
                v = getattr(_KERNEL[node.module], alias.name, None)
                if isinstance(v, str):
                    out[alias.asname or alias.name] = v
    return out


def _failure_literals(path: Path) -> list[tuple[int, str]]:
    """(line, value) of every literal (or module constant) given as `type=`/`failure_type=`, or assigned to a
    `failure_type` class attribute; f-strings show as "<f-string>", never allowed."""
    tree = ast.parse(path.read_text(), str(path))
    consts = _string_constants(tree)

    def value(node: ast.expr) -> str | None:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        if isinstance(node, ast.Name) and node.id in consts:
            return consts[node.id]
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                and node.value.id in ("errors", "failures"):  # errors.RATE_LIMITED
            v = getattr(_KERNEL[f"gymflow.kernel.{node.value.id}"], node.attr, None)
            return v if isinstance(v, str) else f"<missing {node.attr}>"
        if isinstance(node, ast.JoinedStr):
            return "<f-string>"
        return None

    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            for kw in node.keywords:
                if kw.arg in ("type", "failure_type") and (v := value(kw.value)) is not None:
                    found.append((node.lineno, v))
        elif isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == "failure_type" for t in targets):
                if (v := value(node.value)) is not None:
                    found.append((node.lineno, v))
    return found


def test_no_failure_type_literal_outside_the_set():
    bad, seen = [], 0
    for folder in SOURCE_DIRS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            if "migrations" in path.parts:
                continue
            for line, v in _failure_literals(path):
                seen += 1
                if v not in FAILURE_TYPES:
                    bad.append(f"{path.relative_to(ROOT)}:{line}: {v!r}")
    assert seen >= 3, "the scan found nothing: it no longer sees the code"
    assert not bad, "failure types outside gymflow/kernel/failures.py:\n" + "\n".join(bad)


# -- the boundary, unit level -------------------------------------------------------------------------------

def _raised(exc: BaseException, source: str = "gymflow") -> ApplicationError:
    with pytest.raises(ApplicationError) as info, boundary(source, "here"):  # type: ignore[arg-type]
        raise exc
    return info.value


def _short(err: ApplicationError) -> None:
    assert err.type in FAILURE_TYPES
    assert len(err.message) <= MAX_MESSAGE_CHARS and "\n" not in err.message and "Traceback" not in err.message
    assert err.__cause__ is None and err.__suppress_context__, "the cause chain must not travel to Temporal"


def test_boundary_types_gymflow_errors_non_retryable():
    err = _raised(TaskError("x: field required\nmore"))
    _short(err)
    assert (err.type, err.non_retryable) == ("bad_task", True)
    err = _raised(GymflowError("odd", failure_type="NotAType"))
    assert err.type == "internal_error"


def test_boundary_environment_code_is_environment_error_retryable():
    err = _raised(KeyError("city"), "environment")
    _short(err)
    assert err.type == "environment_error" and not err.non_retryable
    assert "KeyError" in err.message and "city" in err.message  # the class name is in the message, not the type


def test_boundary_anything_else_is_internal_error():
    err = _raised(ZeroDivisionError("division by zero\n" + "x" * 10_000))
    _short(err)
    assert err.type == "internal_error"


def test_store_errors_are_store_unavailable_short():
    # A raw SQLAlchemy error carries the statement, parameters and a link; chained, it outgrew Temporal's
    # failure size ("Failure exceeds size limit.").
    orig = OSError("connection to server at \"127.0.0.1\", port 5432 failed: Connection refused\n" + "y" * 5000)
    err = _raised(sa_exc.OperationalError("INSERT INTO rollouts ..." + "z" * 50_000, {"p": "v" * 50_000}, orig))
    _short(err)
    assert err.type == "store_unavailable" and not err.non_retryable
    assert "Connection refused" in err.message
    data = _raised(sa_exc.DataError("INSERT ...", {}, ValueError("PostgreSQL text fields cannot contain NUL")))
    assert data.type == "store_unavailable" and data.non_retryable, "the same write cannot succeed on retry"


def test_already_typed_application_errors_keep_their_retry_decision():
    err = classify(ApplicationError("policy: HTTP 503", type="model_unavailable"))
    assert err.type == "model_unavailable" and not err.non_retryable
    err = classify(ApplicationError("line one\nline two", type="IndexError", non_retryable=True))
    assert err.type == "internal_error" and err.non_retryable and err.message == "line one"


def _activity_error(cause: BaseException) -> ActivityError:
    err = ActivityError("activity failed", scheduled_event_id=1, started_event_id=2, identity="w",
                        activity_type="generate", activity_id="1", retry_state=RetryState.MAXIMUM_ATTEMPTS_REACHED)
    err.__cause__ = cause
    return err


def test_workflow_maps_unknown_causes_to_known_types():
    kind, msg = failure_of(_activity_error(ApplicationError("list index out of range", type="IndexError")))
    assert kind == "internal_error" and "IndexError" in msg
    kind, msg = failure_of(_activity_error(ApplicationError("x" * 5000, type="model_bad_response")))
    assert kind == "model_bad_response" and len(msg) <= MAX_MESSAGE_CHARS
    kind, _ = failure_of(_activity_error(RuntimeError("odd")))
    assert kind == "internal_error"


async def test_judge_calls_validate_the_reply(scripted, settings):
    # Judges go through ModelClients.chat: garbage is model_bad_response there too (the verifier then masks).
    from gymflow.activities.model_client import ModelClients

    models = ModelClients(settings.models)
    scripted.script(completion_json({"choices": [{"message": None}]}), raw_body(b"\x00\xff", "text/plain"))
    try:
        for _ in range(2):
            with pytest.raises(ApplicationError) as info:
                await models.chat("judge", [ChatMessage(role="user", content="equal?")])
            _short(info.value)
            assert info.value.type == "model_bad_response" and not info.value.non_retryable
    finally:
        await models.close()


# -- (b) each type that can arise, through the real stack -------------------------------------------------

def _limits(inp: RolloutInput, **changes: dict) -> RolloutInput:
    limits = inp.limits.model_copy(update={
        k: (getattr(inp.limits, k).model_copy(update=v) if isinstance(v, dict) else v) for k, v in changes.items()})
    return inp.model_copy(update={"limits": limits})


def _model(gf, scripted, run_id, name, replies, **kw):
    scripted.script(*replies)
    return gf.make_input(run_id, user_task("hi", task_id=name), 0, "policy", **kw)


def _every_attempt(gf, scripted, run_id, name, reply):
    """`reply` on each of 2 attempts: the transient types, retried and still failing (kept to 2 for speed)."""
    return _limits(_model(gf, scripted, run_id, name, [reply] * 2), generate={"max_attempts": 2})


def _faulty(gf, run_id, name, replies, scripted, **data):
    scripted.script(*replies)
    return gf.make_input(run_id, faulty_task(name, **data), 0, "policy")


CASES = {
    # case (= task id): (expected type, build(gf, scripted, run_id) -> RolloutInput)
    "context": ("context_length_exceeded", lambda gf, s, r: _model(gf, s, r, "context", [context_length_error()])),
    "bad_request": ("model_bad_request", lambda gf, s, r: _model(gf, s, r, "bad_request",
                                                                 [http_error(400, "temperature must be <= 2")])),
    "auth": ("model_auth_failed", lambda gf, s, r: _model(gf, s, r, "auth", [http_error(401, "bad key")])),
    "5xx": ("model_unavailable", lambda gf, s, r: _every_attempt(gf, s, r, "5xx", http_error(503, "down"))),
    "429": ("rate_limited", lambda gf, s, r: _every_attempt(gf, s, r, "429", http_error(429, "slow down"))),
    "reset": ("model_unavailable", lambda gf, s, r: _every_attempt(gf, s, r, "reset", disconnect())),
    "html_200": ("model_bad_response", lambda gf, s, r: _every_attempt(
        gf, s, r, "html_200", raw_body("<html><body>502 Bad Gateway</body></html>", "text/html"))),
    "no_choices": ("model_bad_response", lambda gf, s, r: _every_attempt(
        gf, s, r, "no_choices", completion_json({"choices": []}))),
    "null_message": ("model_bad_response", lambda gf, s, r: _every_attempt(
        gf, s, r, "null_message", completion_json({"choices": [{"index": 0, "message": None}]}))),
    # unknown_model no longer arises from generation: a model's rollouts go to its own task queue and wait
    # there for a worker that serves it (tests/test_model_queues.py).
    "bad_task": ("bad_task", lambda gf, s, r: gf.make_input(r, faulty_task("bad_task", slow_s="slow"), 0, "policy")),
    "unknown_env": ("unknown_environment", lambda gf, s, r: gf.make_input(
        r, Task(id="unknown_env", env="no_such_env", messages=(ChatMessage(role="user", content="hi"),)),
        0, "policy")),
    "too_large": ("transcript_too_large", lambda gf, s, r: _limits(
        _faulty(gf, r, "too_large", [tool_call("echo", {"text": "y" * 3000})] * 3, s),
        max_episode_bytes=4000)),
    "env_setup": ("environment_error", lambda gf, s, r: _faulty(gf, r, "env_setup", [], s, fail_in="setup")),
    "env_tool": ("environment_error", lambda gf, s, r: _faulty(gf, r, "env_tool", [tool_call("boom", {})], s)),
    "env_verify": ("environment_error", lambda gf, s, r: _faulty(gf, r, "env_verify", [text("x")], s,
                                                                  fail_in="verify")),
    "masked": ("verifier_failed", lambda gf, s, r: _faulty(gf, r, "masked", [text("x")], s, mask=True)),
    "timeout": ("activity_timeout", lambda gf, s, r: _limits(
        _model(gf, s, r, "timeout", [text("late", delay_s=2.5)] * 2),
        generate={"start_to_close_s": 1, "heartbeat_s": None, "max_attempts": 2})),
}


@pytest.mark.parametrize("case", list(CASES))
async def test_each_failure_type_is_recorded_typed_and_short(gf, scripted, sql, faulty_env, case):  # noqa: F811
    await _recorded_typed_and_short(gf, scripted, sql, case, RUN_ID)


@pytest_asyncio.fixture(loop_scope="session")
async def all_local(gf: GymflowClient, settings: Settings) -> AsyncIterator[GymflowClient]:
    """Every step in the workflow pool: generation and the test environment placed "local". The SDK raises a
    local activity's failure differently from a queued one's; the record must not tell them apart."""
    models = {name: cfg.model_copy(update={"placement": "local"}) for name, cfg in settings.models.items()}
    envs = {**settings.environments, NAME: {"placement": "local"}}
    client = await GymflowClient.connect(settings.model_copy(update={"models": models, "environments": envs}))
    yield client
    await client.close()


@pytest.mark.parametrize("case", list(CASES))
async def test_each_failure_type_is_recorded_typed_when_every_step_is_local(all_local, scripted, sql,
                                                                           faulty_env, case):  # noqa: F811
    await _recorded_typed_and_short(all_local, scripted, sql, case, RUN_ID + "-local")


async def _recorded_typed_and_short(gf: GymflowClient, scripted, sql, case: str, run_id: str) -> None:  # noqa: ANN001
    expected, build = CASES[case]
    inp = build(gf, scripted, run_id)
    summary = await gf.run_rollout(inp)
    rows = sql("SELECT status, masked, reward, failure_type, failure_message FROM rollouts WHERE id = %s",
               inp.rollout_id)
    assert rows, f"{case}: nothing recorded"
    status, masked, reward, ftype, message = rows[0]
    assert ftype in FAILURE_TYPES and ftype == expected == summary.failure_type, (case, ftype, message)
    assert reward is None, "a failure is never scored"
    if FAILURE_TYPES[expected].outcome == "masked":
        assert (status, masked) == ("completed", True)
    else:
        assert status == "failed" and message
        assert len(message) <= MAX_MESSAGE_CHARS and "Traceback" not in message and "\n" not in message
        assert TRACEBACK_TEXT.splitlines()[1] not in message
    # The record keeps what the episode stored before it failed (with every step local, the turn activity that
    # also begins and finishes the episode says what in its failure's details).
    (transcript,) = sql("SELECT transcript FROM rollouts WHERE id = %s", inp.rollout_id)[0]
    ends_with = {"context": "user", "env_tool": "assistant", "env_verify": "assistant", "masked": "assistant",
                 "env_setup": None}
    if case in ends_with:
        assert (transcript[-1]["role"] if transcript else None) == ends_with[case], (case, transcript)
    if expected in ("context_length_exceeded", "model_bad_request", "model_auth_failed"):
        assert len(scripted.requests) == 1, "a deterministic model failure is not retried"
    if case in ("5xx", "429", "reset", "html_200", "no_choices", "null_message"):
        assert len(scripted.requests) == 2, "a transient model failure is retried, boundedly"
