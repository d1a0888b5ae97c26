"""Example arguments for a tool call, built from the tool's JSON schema.

Deterministic and small: the first enum value, `const`, `default` or `examples` entry when given, else a
plain value of the type that meets the simple bounds (minimum, minLength, minItems). Enough for a scripted
call that the tool's own argument checks should accept; not a fuzzer.
"""

from __future__ import annotations

from typing import Any

_MAX_DEPTH = 8  # a recursive or hostile schema still ends


def example_value(schema: Any, depth: int = 0) -> Any:
    """A value that fits `schema` (a JSON Schema dict); None for what it cannot read."""
    if not isinstance(schema, dict) or depth > _MAX_DEPTH:
        return None
    for key in ("const", "default"):
        if key in schema:
            return schema[key]
    for key in ("enum", "examples"):
        if isinstance(schema.get(key), list) and schema[key]:
            return schema[key][0]
    for key in ("anyOf", "oneOf", "allOf"):
        if isinstance(schema.get(key), list) and schema[key]:
            return example_value(schema[key][0], depth + 1)
    kind = schema.get("type")
    if isinstance(kind, list):  # ["string", "null"]: the first that is not null
        kind = next((k for k in kind if k != "null"), "null")
    if kind is None and "properties" in schema:
        kind = "object"
    return _of_type(kind, schema, depth)


def _of_type(kind: Any, schema: dict[str, Any], depth: int) -> Any:
    if kind == "object":
        props = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
        return {str(k): example_value(v, depth + 1) for k, v in props.items()}
    if kind == "array":
        count = schema.get("minItems", 1)
        count = count if isinstance(count, int) and 0 <= count <= 3 else 1
        return [example_value(schema.get("items"), depth + 1) for _ in range(count)]
    if kind in ("integer", "number"):
        low = schema.get("minimum", schema.get("exclusiveMinimum"))
        value = low + 1 if isinstance(low, (int, float)) and not isinstance(low, bool) else 1
        return int(value) if kind == "integer" else float(value)
    if kind == "boolean":
        return True
    if kind == "string":
        length = schema.get("minLength", 0)
        length = length if isinstance(length, int) and 0 <= length <= 1000 else 0
        return "example".ljust(length, "x")
    return None
