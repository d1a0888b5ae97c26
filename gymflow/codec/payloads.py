"""The codec protocol's payload list, decoded: each JSON payload that holds `head_id` somewhere gets a
`head_message` beside it (the message that id names, summarised). Anything else comes back exactly as sent.

Payloads are proto3 JSON: `{"metadata": {key: base64}, "data": base64}`. Only `json/plain` payloads (the
pydantic data converter's) are read; a payload that does not parse, or whose ids cannot be looked up,
is returned unchanged or annotated with an error, never dropped, so decoding never fails the UI.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable, Collection
from typing import Any

from gymflow.codec.messages import StoreUnavailable
from gymflow.codec.render import summarize

HEAD_KEY, ADDED_KEY = "head_id", "head_message"
MAX_DEPTH = 64  # of JSON nesting searched for head ids; our wire types are 3 deep
MAX_IDS = 500  # distinct ids looked up per request (a UI request carries a handful)
Fetch = Callable[[Collection[int]], dict[int, tuple[str, Any]]]


class BadRequest(ValueError):
    """The request body is not the codec protocol's shape."""


def _b64(value: Any) -> bytes:
    if not isinstance(value, str):
        raise ValueError("not a base64 string")
    return base64.b64decode(value, validate=True)


def json_body(payload: dict[str, Any]) -> Any:
    """The JSON a `json/plain` payload holds; ValueError for any other payload."""
    metadata = payload.get("metadata")
    if not isinstance(metadata, dict) or _b64(metadata.get("encoding")) != b"json/plain":
        raise ValueError("not json/plain")
    return json.loads(_b64(payload.get("data", "")))


def _is_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def head_ids(node: Any, depth: int = 0) -> set[int]:
    """Every integer `head_id` in a JSON value, at any depth up to MAX_DEPTH."""
    if depth > MAX_DEPTH:
        return set()
    found: set[int] = set()
    if isinstance(node, dict):
        if _is_id(node.get(HEAD_KEY)):
            found.add(node[HEAD_KEY])
        for value in node.values():
            found |= head_ids(value, depth + 1)
    elif isinstance(node, list):
        for value in node:
            found |= head_ids(value, depth + 1)
    return found


def annotate(node: Any, messages: dict[int, dict[str, Any]], depth: int = 0) -> Any:
    """`node` with `head_message` right after each integer `head_id` (ids missing from `messages` get an error)."""
    if depth > MAX_DEPTH:
        return node
    if isinstance(node, list):
        return [annotate(v, messages, depth + 1) for v in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == ADDED_KEY and _is_id(node.get(HEAD_KEY)):
            continue  # ours replaces a field of that name
        out[key] = annotate(value, messages, depth + 1)
        if key == HEAD_KEY and _is_id(value):
            out[ADDED_KEY] = messages.get(value) or {"error": f"message {value} not found"}
    return out


def _encode(body: Any) -> str:
    return base64.b64encode(json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()).decode()


def validate(request: Any, max_payloads: int) -> list[dict[str, Any]]:
    """The payload list of a request body, or BadRequest saying what is wrong with it."""
    if not isinstance(request, dict) or not isinstance(request.get("payloads"), list):
        raise BadRequest('expected {"payloads": [...]}')
    payloads = request["payloads"]
    if len(payloads) > max_payloads:
        raise BadRequest(f"at most {max_payloads} payloads per request, got {len(payloads)}")
    if not all(isinstance(p, dict) for p in payloads):
        raise BadRequest("each payload must be an object")
    return payloads


def decode(payloads: list[dict[str, Any]], fetch: Fetch) -> list[dict[str, Any]]:
    """The decoded payload list, in order. Payloads without a head id are the very objects passed in."""
    parsed: dict[int, Any] = {}
    wanted: set[int] = set()
    for index, payload in enumerate(payloads):
        try:
            body = json_body(payload)
        except (ValueError, binascii.Error, RecursionError):
            continue  # not ours to read: returned as sent
        ids = head_ids(body)
        if ids:
            parsed[index] = body
            wanted |= ids
    if not parsed:
        return payloads
    messages: dict[int, dict[str, Any]]
    try:
        if len(wanted) > MAX_IDS:
            raise LookupError(f"more than {MAX_IDS} message ids in one request")
        messages = {i: summarize(role, body) for i, (role, body) in fetch(wanted).items()}
    except Exception as e:  # noqa: BLE001 - the payloads still come back, each saying why it is not expanded
        # Our own errors say what happened; anything else by type only (its text could name a host).
        safe = isinstance(e, (LookupError, StoreUnavailable))
        error = {"error": str(e) if safe else f"lookup failed ({type(e).__name__})"}
        messages = dict.fromkeys(wanted, error)
    out = list(payloads)
    for index, body in parsed.items():
        out[index] = {**payloads[index], "data": _encode(annotate(body, messages))}
    return out
