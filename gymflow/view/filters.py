"""The rollout table's filter, sort and page, parsed from a query string into SQL with bound parameters only.

Sort keys and directions come from a fixed map, never from the request text, so no request can shape the SQL.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

PAGE_SIZE = 50
MAX_PAGE_SIZE = 500

# key -> the ORDER BY expression on rollout_rows (aliased r); every order ends with the id, so pages are stable.
SORTS: dict[str, str] = {
    "task": "r.task_id {d}, r.sample_index {d}",
    "sample": "r.sample_index {d}, r.task_id {d}",
    "reward": "r.reward {d} NULLS LAST",
    "status": "r.status {d}",
    "failure": "r.failure_type {d} NULLS LAST",
    "turns": "r.turns {d}",
    "latency": "r.latency_s {d} NULLS LAST",
    "started": "r.started_at {d}",
}
STATUSES = ("completed", "failed", "running")
# query parameter -> (SQL condition, how to parse the value)
_EXACT = {"status": "r.status = :status", "failure": "coalesce(r.failure_type, 'none') = :failure",
          "task": "r.task_id = :task"}
_RANGES = {"sample": ("r.sample_index", int), "reward_min": ("r.reward >=", float),
           "reward_max": ("r.reward <=", float), "turns_min": ("r.turns >=", int), "turns_max": ("r.turns <=", int),
           "latency_min": ("r.latency_s >=", float), "latency_max": ("r.latency_s <=", float)}
# A rollout's policy versions are stamped on its assistant messages (tokens.policy_version); the messages of one
# rollout are found through the (rollout_id, producer, producer_index) unique index.
_POLICY = ("EXISTS (SELECT 1 FROM messages m WHERE m.rollout_id = r.id AND m.role = 'assistant' "
           "AND m.tokens->>'policy_version' = :policy)")
FIELDS = ("status", "failure", "task", "policy", *_RANGES)


@dataclass
class TableQuery:
    """A parsed rollout-table request: filters, sort key and direction, page."""

    filters: dict[str, Any] = field(default_factory=dict)
    sort: str = "task"
    desc: bool = False
    page: int = 1
    size: int = PAGE_SIZE
    errors: list[str] = field(default_factory=list)

    def where(self) -> tuple[str, dict[str, Any]]:
        """The WHERE conditions after `r.run_id = :run`, and their parameters."""
        parts, params = [], {}
        for key, value in self.filters.items():
            if key in _EXACT:
                parts.append(_EXACT[key])
            elif key == "policy":
                parts.append(_POLICY)
            elif key == "sample":
                parts.append("r.sample_index = :sample")
            else:
                parts.append(f"{_RANGES[key][0]} :{key}")
            params[key] = value
        return "".join(f" AND {p}" for p in parts), params

    def order_by(self) -> str:
        d = "DESC" if self.desc else "ASC"
        return SORTS[self.sort].format(d=d) + f", r.id {d}"

    @property
    def offset(self) -> int:
        return (self.page - 1) * self.size

    def link(self, **changes: Any) -> str:
        """The query string of this table with `changes` (None removes a key); a new filter or sort goes back
        to page 1 unless `page` is given."""
        state: dict[str, Any] = {**{k: _text(v) for k, v in self.filters.items()}, "sort": self.sort,
                                 "dir": "desc" if self.desc else "asc", "size": self.size, "page": self.page}
        if "page" not in changes:
            state["page"] = 1
        state.update({k: v for k, v in changes.items()})
        keep = {k: v for k, v in state.items() if v is not None and v != ""
                and not (k == "page" and v == 1) and not (k == "size" and v == PAGE_SIZE)}
        return "?" + urlencode(keep)

    def sort_link(self, key: str) -> str:
        """Clicking a column header: sort by it ascending, or flip the direction when it is the current key."""
        return self.link(sort=key, dir="asc" if (key != self.sort or self.desc) else "desc")


def _text(value: Any) -> str:
    return format(value, "g") if isinstance(value, float) else str(value)


def parse(query: Mapping[str, str]) -> TableQuery:
    """Parse a request's query; a bad value is dropped and named in `errors` (shown above the table)."""
    q = TableQuery()
    for key in FIELDS:
        raw = (query.get(key) or "").strip()
        if not raw:
            continue
        if key in _RANGES:
            try:
                value = _RANGES[key][1](raw)
            except ValueError:
                q.errors.append(f"{key}: not a number: {raw[:40]!r}")
                continue
            if isinstance(value, float) and not math.isfinite(value):
                q.errors.append(f"{key}: not a finite number")
                continue
            q.filters[key] = value
        else:
            q.filters[key] = raw[:500]
    sort = query.get("sort", "task")
    q.sort = sort if sort in SORTS else "task"
    q.desc = query.get("dir") == "desc"
    q.page = _positive(query.get("page"), 1)
    q.size = min(_positive(query.get("size"), PAGE_SIZE), MAX_PAGE_SIZE)
    return q


def _positive(raw: str | None, default: int) -> int:
    try:
        value = int(raw or default)
    except ValueError:
        return default
    return value if value >= 1 else default
