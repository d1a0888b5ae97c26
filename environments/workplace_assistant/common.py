"""Small helpers that reproduce the pandas behaviour NeMo Gym's tools rely on, without pandas."""

from __future__ import annotations

from datetime import datetime
from functools import lru_cache
from typing import Any, NoReturn

import re2

from gymflow.kernel.errors import ToolError

# What pandas raises when a filter column holds NaN (e.g. a customer added without an email).
NA_MASK = "Cannot mask with non-boolean array containing NA / NaN values"

# pd.Timestamp parses far more than ISO; these cover the shapes models actually send.
_EXTRA_FORMATS = ("%Y/%m/%d", "%Y/%m/%d %H:%M:%S", "%m/%d/%Y", "%B %d, %Y", "%b %d, %Y", "%B %d %Y", "%d %B %Y")


def fail(message: str) -> NoReturn:
    """NeMo Gym's tools return these strings; here they are tool errors the model sees verbatim."""
    raise ToolError(message)


def _options() -> re2.Options:
    options = re2.Options()
    options.case_sensitive = False
    options.log_errors = False  # a bad pattern is the model's: it gets the error, stderr gets nothing
    options.max_mem = 8 << 20  # RE2's default, stated: a pattern whose program needs more is refused
    return options


_OPTIONS = _options()


@lru_cache(maxsize=256)
def _compiled(pattern: str) -> Any:
    try:
        return re2.compile(pattern, _OPTIONS)
    except re2.error as e:
        detail = e.args[0].decode(errors="replace") if e.args and isinstance(e.args[0], bytes) else str(e)
        raise ToolError(f"invalid search pattern {pattern[:200]!r}: {detail}") from None


def contains(pattern: Any, value: Any, *, na: bool | None = None) -> bool:
    """`Series.str.contains(pattern, case=False)`: a case-insensitive regex search.

    The pattern is the model's, so RE2 matches it (linear time: `(.*)*(.*)*Q` cannot backtrack for hours as
    Python's `re` did). RE2 accepts Python's syntax but for backreferences and lookaround; such a pattern is a
    ToolError. A non-string cell is NaN to pandas: `na` says what it becomes; without it pandas refuses the mask.
    """
    if not isinstance(value, str):
        if na is None:
            raise ValueError(NA_MASK)
        return na
    if not isinstance(pattern, str):
        raise TypeError("first argument must be string or compiled pattern")  # what `re` says, as NeMo Gym shows it
    return _compiled(pattern).search(value) is not None


def text_at_least(value: Any, bound: Any) -> bool:
    """`Series >= bound` on an object column: NaN compares False, strings compare as text."""
    return value is not None and value >= bound


def text_at_most(value: Any, bound: Any) -> bool:
    return value is not None and value <= bound


def parse_ts(value: Any) -> datetime:
    """A naive datetime, as `pd.Timestamp(value)` would give; ValueError when it cannot parse."""
    if isinstance(value, datetime):
        return value
    if not isinstance(value, str):
        raise TypeError(f"Cannot convert input [{value}] of type {type(value)} to Timestamp")
    text = value.strip()
    try:
        return datetime.fromisoformat(text).replace(tzinfo=None)
    except ValueError:
        pass
    for fmt in _EXTRA_FORMATS:
        try:
            return datetime.strptime(text, fmt)
        except ValueError:
            continue
    raise ValueError(f"could not convert string to Timestamp: {value!r}")


def paginate(items: list[Any], page: Any, page_size: Any, noun: str) -> tuple[list[Any], dict[str, Any]]:
    """NeMo Gym's pagination: out-of-range pages clamp to the last (or first) page."""
    total = len(items)
    total_pages = (total + page_size - 1) // page_size
    page = max(1, min(page, total_pages)) if total_pages > 0 else 1
    start = (page - 1) * page_size
    end = min(start + page_size, total)
    info = {f"total_{noun}": total, "page": page, "page_size": page_size, "total_pages": total_pages}
    return items[start:end], info


def records(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Copies for output, so nothing that leaves a tool aliases a world row."""
    return [dict(r) for r in rows]
