"""Error classification: what retries, what fails typed, how long a 429 waits."""

from __future__ import annotations

import httpx
import openai
from gymflow.activities.model_client import classify, retry_after_seconds


def _err(cls, status, message, headers=None, code=None):
    req = httpx.Request("POST", "http://x/v1/chat/completions")
    resp = httpx.Response(status, headers=headers or {}, request=req)
    return cls(message, response=resp, body={"message": message, "code": code})


def test_retry_after_parsing():
    assert retry_after_seconds(httpx.Headers({"retry-after": "3"})) == 3.0
    assert retry_after_seconds(httpx.Headers({})) is None
    assert retry_after_seconds(httpx.Headers({"retry-after": "soon"})) is None
    assert retry_after_seconds(httpx.Headers({"retry-after": "99999"})) == 600.0


def test_classification():
    e = classify(_err(openai.RateLimitError, 429, "slow", {"retry-after": "7"}), "m")
    assert e.type == "rate_limited" and not e.non_retryable and e.next_retry_delay.total_seconds() == 7
    e = classify(_err(openai.BadRequestError, 400, "maximum context length is 4096", code="context_length_exceeded"),
                 "m")
    assert e.type == "context_length_exceeded" and e.non_retryable
    e = classify(_err(openai.BadRequestError, 400, "bad temperature"), "m")
    assert e.type == "model_bad_request" and e.non_retryable
    e = classify(_err(openai.AuthenticationError, 401, "no"), "m")
    assert e.type == "model_auth_failed" and e.non_retryable
    e = classify(_err(openai.InternalServerError, 502, "gateway"), "m")
    assert e.type == "model_unavailable" and not e.non_retryable
