"""The calendar environment (NeMo Gym's `calendar` resources server): multi-turn scheduling, no tools.

The model keeps a day calendar and prints it as a JSON list of `{"event_id", "event_name", "start_time",
"duration"}` objects. Only the final answer is graded, against `exp_cal_state` (event id -> duration,
constraint, min/max window), with NeMo Gym's rules in NeMo Gym's order; `details.reason` uses NeMo's labels
(`think_found`, `no_json_list`, `different_number_of_events`, `conflicting_events`, `constraint_violated`,
`error_in_grading`, `pass`) plus `no_answer`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gymflow.environments.base import JSON, Environment, TaskData, VerifyContext, final_assistant_text
from pydantic import Field, field_validator

from gymflow.kernel.wire import ChatMessage, Score, Task

# ---- times and constraints ---------------------------------------------------------------------------

_TIME_12H = re.compile(r"(\d+)(?::(\d+))?\s*(am|pm)")
_TIME_24H = re.compile(r"(\d+):(\d+)")
_UNBOUNDED = 10**6  # minutes; beyond any window


def to_minutes(text: object) -> int:
    """'10am', '11:45am', '12pm', '16:00' -> minutes after midnight. Raises ValueError otherwise."""
    if not isinstance(text, str):
        raise ValueError(f"time must be a string, got {text!r}")
    t = text.strip()
    if m := _TIME_12H.fullmatch(t):
        hour = int(m[1])
        # NeMo's arithmetic: 12am is midnight, 12pm is noon.
        return (0 if hour == 12 else hour) * 60 + int(m[2] or 0) + (720 if m[3] == "pm" else 0)
    if m := _TIME_24H.fullmatch(t):
        return int(m[1]) * 60 + int(m[2])
    raise ValueError(f"unable to parse time {text!r}")


def format_24h(minutes: int) -> str:
    return f"{minutes // 60:02d}:{minutes % 60:02d}"


@dataclass(frozen=True)
class Constraint:
    """'before X' ends at or before X, 'after X' starts at or after X, 'between X and Y', 'at X' starts at X."""

    kind: str
    times: tuple[int, ...]

    def holds(self, start: int, end: int) -> bool:
        first = self.times[0]
        if self.kind == "before":
            return end <= first
        if self.kind == "after":
            return start >= first
        if self.kind == "between":
            return start >= first and end <= self.times[1]
        return start == first  # "at"

    def start_bounds(self, duration: int) -> tuple[int, int]:
        """(earliest, latest) start time this constraint allows."""
        first, last = self.times[0], self.times[-1]
        if self.kind == "before":
            return -_UNBOUNDED, first - duration
        if self.kind == "after":
            return first, _UNBOUNDED
        if self.kind == "between":
            return first, last - duration
        return first, first


def parse_constraint(text: str | None) -> Constraint | None:
    if text is None:
        return None
    for kind in ("before", "after", "at"):
        if text.startswith(kind + " "):
            return Constraint(kind, (to_minutes(text[len(kind) + 1:]),))
    if text.startswith("between "):
        parts = text[len("between "):].split(" and ")
        if len(parts) != 2:
            raise ValueError(f"invalid 'between' constraint {text!r}")
        return Constraint("between", (to_minutes(parts[0]), to_minutes(parts[1])))
    # NeMo lets an unknown constraint pass; we refuse the row instead, so bad data shows up at once.
    raise ValueError(f"unknown constraint {text!r} (expected before/after/between/at)")


# ---- task type -------------------------------------------------------------------------------------------


class ExpectedEvent(TaskData):
    event_id: int | str | None = None
    duration: int = Field(gt=0)
    constraint: str | None = None
    min_time: str
    max_time: str

    @field_validator("min_time", "max_time")
    @classmethod
    def _time(cls, v: str) -> str:
        to_minutes(v)
        return v

    @field_validator("constraint")
    @classmethod
    def _constraint(cls, v: str | None) -> str | None:
        parse_constraint(v)
        return v

    def start_bounds(self) -> tuple[int, int]:
        """(earliest, latest) start satisfying both the min/max window and the constraint."""
        lo, hi = to_minutes(self.min_time), to_minutes(self.max_time) - self.duration
        rule = parse_constraint(self.constraint)
        if rule is not None:
            c_lo, c_hi = rule.start_bounds(self.duration)
            lo, hi = max(lo, c_lo), min(hi, c_hi)
        return lo, hi


class CalendarTask(TaskData):
    exp_cal_state: dict[str, ExpectedEvent]


# ---- extracting the JSON list ----------------------------------------------------------------------------


def _list_span(text: str) -> tuple[int, int] | None:
    """The span NeMo's regex `\\[ITEM*\\{ITEM*\\}ITEM*\\]`, ITEM = `[^\\[\\]]|\\{[^}]*\\}`, finds with re.search.

    That regex backtracks exponentially on e.g. '[' + '{}' * 30, so it is replayed here in linear time:
    `ok[s][i]` says whether the match can finish from position i in loop s (0 before the required
    `{`, 1 inside it, 2 after its `}`); walking the alternatives in the regex's order and taking the
    first that can finish gives the same span backtracking returns.
    """
    if "[" not in text or "{" not in text:
        return None
    n = len(text)
    close_at = [-1] * (n + 1)  # the first '}' at or after i
    for i in range(n - 1, -1, -1):
        close_at[i] = i if text[i] == "}" else close_at[i + 1]
    ok = [[False] * (n + 1) for _ in range(3)]
    for i in range(n - 1, -1, -1):
        for s in (2, 1, 0):
            ok[s][i] = any(nxt is None or ok[nxt[0]][nxt[1]] for nxt in _moves(text, close_at, s, i))
    for start in range(n):
        if text[start] == "[" and ok[0][start + 1]:
            s, i = 0, start + 1
            while True:
                nxt = next(m for m in _moves(text, close_at, s, i) if m is None or ok[m[0]][m[1]])
                if nxt is None:
                    return start, i + 1
                s, i = nxt
    return None


def _moves(text: str, close_at: list[int], s: int, i: int) -> list[tuple[int, int] | None]:
    """Successor (loop, position) states in the regex's preference order; None means the closing ']'."""
    c = text[i]
    out: list[tuple[int, int] | None] = []
    if c not in "[]":
        out.append((s, i + 1))  # one more ITEM, as a plain character
    if c == "{" and close_at[i + 1] != -1:
        out.append((s, close_at[i + 1] + 1))  # one more ITEM, as a brace group
    if (s, c) in ((0, "{"), (1, "}")):
        out.append((s + 1, i + 1))  # leave the loop through the required object's brace
    elif (s, c) == (2, "]"):
        out.append(None)
    return out


def extract_json_list(text: str) -> Any:
    """The first bracketed list holding an object, parsed; None when there is none or it is not JSON.

    As NeMo: only that first candidate is tried, a later valid list is not looked for.
    """
    span = _list_span(text)
    if span is None:
        return None
    try:
        return json.loads(text[span[0]:span[1]])
    except (ValueError, RecursionError):
        return None


# ---- grading ---------------------------------------------------------------------------------------------


def _fail(reason: str, **details: Any) -> Score:
    return Score(reward=0.0, details={"reason": reason, **details})


def _span(event: Any) -> tuple[int, int]:
    start = to_minutes(event["start_time"])
    return start, start + event["duration"]


def _first_conflict(calendar: list[Any]) -> tuple[Any, Any] | None:
    spans = [_span(e) for e in calendar]
    for a, (a_start, a_end) in zip(calendar, spans, strict=True):
        for b, (b_start, b_end) in zip(calendar, spans, strict=True):
            # NeMo skips every entry equal to the one checked, so an exact duplicate is no clash.
            if b != a and not (a_end <= b_start or a_start >= b_end):
                return a["event_id"], b["event_id"]
    return None


def _violated_rule(event: Any, expected: ExpectedEvent) -> str | None:
    """The first rule the event breaks: duration, window, or the constraint's kind."""
    if event["duration"] != expected.duration:
        return "duration"
    start, end = _span(event)
    if start < to_minutes(expected.min_time) or end > to_minutes(expected.max_time):
        return "window"
    rule = parse_constraint(expected.constraint)
    if rule is not None and not rule.holds(start, end):
        return rule.kind
    return None


def _grade_calendar(calendar: Any, expected: Mapping[str, ExpectedEvent]) -> Score:
    if not calendar:
        return _fail("no_json_list")
    by_id = {str(e["event_id"]): e for e in calendar}
    if len(by_id) != len(expected):
        return _fail("different_number_of_events", expected=len(expected), got=len(by_id))
    clash = _first_conflict(calendar)
    if clash is not None:
        return _fail("conflicting_events", event_ids=list(clash))
    for key, exp in expected.items():
        if key not in by_id:
            return _fail("error_in_grading", error=f"event_id {key} missing")
        rule = _violated_rule(by_id[key], exp)
        if rule is not None:
            return _fail("constraint_violated", event_id=key, rule=rule, constraint=exp.constraint,
                         start_time=by_id[key]["start_time"], duration=by_id[key]["duration"])
    return Score(reward=1.0, details={"reason": "pass"})


def grade(answer: str | None, expected: Mapping[str, ExpectedEvent]) -> Score:
    """Score the final answer text as NeMo Gym's calendar verifier does."""
    if not answer:
        return _fail("no_answer")
    if "<think>" in answer:
        return _fail("think_found")
    if not expected:
        return Score(reward=1.0, details={"reason": "pass"})  # NeMo: no change expected, anything goes
    try:
        return _grade_calendar(extract_json_list(answer), expected)
    except (KeyError, TypeError, ValueError, AttributeError) as e:  # the model's JSON has the wrong shape
        return _fail("error_in_grading", error=f"{type(e).__name__}: {e}")


# ---- gold calendar ---------------------------------------------------------------------------------------


def _schedule(bounds: Mapping[str, tuple[int, int, int]]) -> dict[str, int] | None:
    """Start times for key -> (earliest, latest start, duration) with no overlap, or None if impossible.

    Exhaustive, yet small: any feasible calendar stays feasible when each event, in start order, is
    pulled left to max(previous end, its earliest start), so trying orders of such placements suffices.
    """
    failed: set[tuple[frozenset[str], int]] = set()

    def place(left: frozenset[str], now: int) -> dict[str, int] | None:
        if not left:
            return {}
        if (left, now) in failed or any(bounds[k][1] < now for k in left):
            return None
        for key in sorted(left, key=lambda k: (bounds[k][1], k)):  # earliest deadline first
            lo, hi, duration = bounds[key]
            start = max(now, lo)
            if start <= hi and (rest := place(left - {key}, start + duration)) is not None:
                return {key: start, **rest}
        failed.add((left, now))
        return None

    return place(frozenset(bounds), 0)


def _event_id(key: str) -> int | str:
    return int(key) if key.isdigit() and str(int(key)) == key else key


def gold_calendar(expected: Mapping[str, ExpectedEvent]) -> list[JSON] | None:
    """A calendar meeting every expectation, or None when the constraints admit none."""
    starts = _schedule({k: (*e.start_bounds(), e.duration) for k, e in expected.items()})
    if starts is None:
        return None
    return [{"event_id": _event_id(k), "event_name": f"event {k}", "start_time": format_24h(starts[k]),
             "duration": expected[k].duration} for k in sorted(starts, key=lambda k: starts[k])]


# ---- environment -----------------------------------------------------------------------------------------


class CalendarEnvironment(Environment[CalendarTask]):
    name = "calendar"
    task_type = CalendarTask
    placement = "local"  # in-process and cheap: runs inside the workflow pool

    async def verify(self, data: CalendarTask, messages: Sequence[ChatMessage], state: JSON,
                     ctx: VerifyContext) -> Score:
        return grade(final_assistant_text(messages), data.exp_cal_state)

    async def validate(self, task: Task) -> Score | None:
        """Score a scheduled gold calendar; None when `exp_cal_state` admits no calendar at all."""
        data = self.parse_task(task)
        gold = gold_calendar(data.exp_cal_state)
        if gold is None:
            return None
        answer = ChatMessage(role="assistant", content=json.dumps(gold))
        return await self.verify(data, (*task.messages, answer), {}, VerifyContext(""))
