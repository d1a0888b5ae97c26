"""Analytics tools (NeMo Gym's AnalyticsTool): read-only visit data plus a list of created plots."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import Any

from gymflow.environments.workplace_assistant.common import fail
from gymflow.environments.workplace_assistant.registry import tool
from gymflow.environments.workplace_assistant.world import Row, World

OWNER = "AnalyticsTool"
T = "analytics"
PLOT_VALUES = ("total_visits", "session_duration_seconds", "user_engaged", "visits_direct", "visits_referral",
               "visits_search_engine", "visits_social_media")
PLOT_TYPES = ("bar", "line", "scatter", "histogram")


def _in_range(w: World, time_min: Any, time_max: Any) -> list[Row]:
    # Dates are compared as text, as NeMo Gym compares its string column.
    rows = w.tables[T]
    if time_min:
        rows = [r for r in rows if r["date_of_visit"] >= time_min]
    if time_max:
        rows = [r for r in rows if r["date_of_visit"] <= time_max]
    return rows


def _per_day(rows: list[Row], value: Callable[[list[Row]], Any]) -> dict[str, Any]:
    """`groupby("date_of_visit")`: one entry per day present, days in sorted order."""
    days: dict[str, list[Row]] = defaultdict(list)
    for r in rows:
        days[r["date_of_visit"]].append(r)
    return {day: value(days[day]) for day in sorted(days)}


@tool("analytics_get_visitor_information_by_id", OWNER)
def get_visitor_information_by_id(w: World, visitor_id: Any = None) -> list[Row]:
    if not visitor_id:
        fail("Visitor ID not provided.")
    found = [dict(r) for r in w.tables[T] if r["visitor_id"] == visitor_id]
    if not found:
        fail("Visitor not found.")
    return found


@tool("analytics_create_plot", OWNER, mutating=True)
def create_plot(w: World, time_min: Any = None, time_max: Any = None, value_to_plot: Any = None,
                plot_type: Any = None) -> str:
    if not time_min:
        fail("Start date not provided.")
    if not time_max:
        fail("End date not provided.")
    if value_to_plot not in PLOT_VALUES:
        fail(f"Value to plot must be one of {', '.join(repr(v) for v in PLOT_VALUES)}")
    if plot_type not in PLOT_TYPES:
        fail("Plot type must be one of 'bar', 'line', 'scatter', or 'histogram'")
    # Nothing is drawn: the plot's path is the state that verification compares.
    path = f"plots/{time_min}_{time_max}_{value_to_plot}_{plot_type}.png"
    w.plots.append(path)
    return path


@tool("analytics_total_visits_count", OWNER)
def total_visits_count(w: World, time_min: Any = None, time_max: Any = None) -> dict[str, int]:
    return _per_day(_in_range(w, time_min, time_max), len)


@tool("analytics_engaged_users_count", OWNER)
def engaged_users_count(w: World, time_min: Any = None, time_max: Any = None) -> dict[str, int]:
    return _per_day(_in_range(w, time_min, time_max), lambda rs: sum(int(bool(r["user_engaged"])) for r in rs))


@tool("analytics_traffic_source_count", OWNER)
def traffic_source_count(w: World, time_min: Any = None, time_max: Any = None,
                         traffic_source: Any = None) -> dict[str, int]:
    rows = _in_range(w, time_min, time_max)
    if not traffic_source:
        return _per_day(rows, len)
    # Days without a visit from the source still appear, with 0.
    return _per_day(rows, lambda rs: sum(1 for r in rs if r["traffic_source"] == traffic_source))


@tool("analytics_get_average_session_duration", OWNER)
def get_average_session_duration(w: World, time_min: Any = None, time_max: Any = None) -> dict[str, float]:
    rows = _in_range(w, time_min, time_max)
    return _per_day(rows, lambda rs: sum(float(r["session_duration_seconds"]) for r in rs) / len(rs))
