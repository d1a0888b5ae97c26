"""Secrets never reach the store through what a model or a tool says: a model that echoes its API key (or a tool
that prints one) has it replaced before the message is stored. The secrets are the values of the environment
variables the config names for keys (`models.<name>.api_key_env`, `temporal.api_key_env`), read in this worker
process, plus any named in $GYMFLOW_REDACT_ENV (comma-separated)."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

from gymflow.kernel.config import Settings

REDACT_ENV = "GYMFLOW_REDACT_ENV"
MIN_SECRET_CHARS = 8  # shorter values ("", "EMPTY", "none") would redact ordinary words


def secret_names(settings: Settings, environ: Mapping[str, str] | None = None) -> list[str]:
    """The environment variables whose values are secrets for this config."""
    env = os.environ if environ is None else environ
    names = [m.api_key_env for m in settings.models.values() if m.api_key_env]
    if settings.temporal.api_key_env:
        names.append(settings.temporal.api_key_env)
    names += [n.strip() for n in env.get(REDACT_ENV, "").split(",") if n.strip()]
    return list(dict.fromkeys(names))


class Redactor:
    def __init__(self, secrets: Mapping[str, str]) -> None:
        # Longest first: a secret that contains another is replaced whole.
        self._secrets = sorted(((v, k) for k, v in secrets.items() if len(v) >= MIN_SECRET_CHARS),
                               key=lambda p: -len(p[0]))

    @classmethod
    def from_settings(cls, settings: Settings, environ: Mapping[str, str] | None = None) -> Redactor:
        env = os.environ if environ is None else environ
        return cls({name: env[name] for name in secret_names(settings, env) if env.get(name)})

    def __bool__(self) -> bool:
        return bool(self._secrets)

    def text(self, value: str) -> str:
        for secret, name in self._secrets:
            if secret in value:
                value = value.replace(secret, f"[redacted: ${name}]")
        return value

    def hits(self, *values: str | None) -> bool:
        """Whether any of `values` holds a secret: the cheap check before rebuilding a message."""
        return any(v and secret in v for v in values for secret, _ in self._secrets)

    def body(self, body: Any) -> Any:
        """`body` (a message's JSON) with every string redacted; the same object when nothing needed it."""
        if not self._secrets:
            return body
        if isinstance(body, str):
            return self.text(body)
        if isinstance(body, dict):
            return {k: self.body(v) for k, v in body.items()}
        if isinstance(body, list | tuple):  # a message's model_dump keeps its tuples (tool_calls)
            return [self.body(v) for v in body]
        return body


# The worker's secrets, for what leaves the process without passing a message through an EpisodeActivities:
# failure messages at the activity boundary (Temporal history, rollouts.failure_message) and log records. One per
# process: the secrets are this process's environment variables.
_current = Redactor({})
_base_factory = logging.getLogRecordFactory()


def install(redactor: Redactor) -> None:
    """Make `redactor` the process's: boundary failures, and every log record as it is made (so every logger and
    handler, the SDK's and those added later included, sees only redacted text)."""
    global _current
    _current = redactor
    if logging.getLogRecordFactory() is not _redacting_record:
        logging.setLogRecordFactory(_redacting_record)


def current() -> Redactor:
    return _current


def _redacting_record(*args: Any, **kwargs: Any) -> logging.LogRecord:
    record = _base_factory(*args, **kwargs)
    red = _current
    if not red:
        return record
    try:
        text = record.getMessage()
    except Exception:  # a malformed format string: the handler reports it, as without us
        return record
    if red.hits(text):
        record.msg, record.args = red.text(text), ()
    if record.exc_info and record.exc_info[1] is not None:
        exc_text = logging.Formatter().formatException(record.exc_info)
        if red.hits(exc_text):
            record.exc_info, record.exc_text = None, red.text(exc_text)
    return record
