"""Verification by state, as NeMo Gym's `is_correct` does it.

Both the model's calls and the ground-truth calls are replayed on fresh copies of the world, and the
five mutable tables are compared as multisets of rows: column order and row order do not matter,
text is compared case-insensitively except `status`, `list_name` and `board`, and a record created
during the episode is matched by its content, not by the id it happened to get. A seeded record keeps
its id as identity until it disappears (deleted, or its id changed); after that, an id reused by a new
record is a generated id like any other. Two rows sharing an id make the state wrong outright.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

from gymflow.environments.workplace_assistant.dispatch import Call, run
from gymflow.environments.workplace_assistant.world import Row, World, pristine

from gymflow.kernel.errors import ToolError

# (tool-name prefix, table, id column); analytics' state is the list of plots, which has no ids.
STATE_TABLES: tuple[tuple[str, str, str | None], ...] = (
    ("calendar", "calendar", "event_id"),
    ("email", "emails", "email_id"),
    ("analytics", "plots", None),
    ("project_management", "tasks", "task_id"),
    ("customer_relationship_manager", "crm", "customer_id"),
)
CASE_SENSITIVE = frozenset({"status", "list_name", "board"})
GENERATED = ("generated_id",)


def _key(value: Any) -> Any:
    """Hashable form of a cell (a model can store a list or object through `update`)."""
    try:
        hash(value)
    except TypeError:
        return repr(value)
    return value


def _rows(world: World, table: str) -> tuple[tuple[str, ...], list[Row]]:
    if table == "plots":
        return ("file_path",), [{"file_path": p} for p in world.plots]
    return world.columns[table], world.tables[table]


def replay_tracked(calls: Iterable[Call]) -> tuple[World, dict[str, set[Any]]]:
    """Replay onto a fresh world, tracking which seeded ids still name their original record."""
    world = pristine().fork()
    stable = {prefix: {_key(r[id_col]) for r in world.tables[table]}
              for prefix, table, id_col in STATE_TABLES if id_col}
    for name, args in calls:
        try:
            run(world, name, args)
        except ToolError:
            pass  # NeMo Gym skips a failing call and goes on
        for prefix, table, id_col in STATE_TABLES:
            if id_col and name.startswith(prefix + "_"):
                stable[prefix] &= {_key(r[id_col]) for r in world.tables[table]}
    return world, stable


def canonical(columns: tuple[str, ...], rows: list[Row], id_col: str | None,
              stable: set[Any]) -> tuple[tuple[str, ...], Counter[tuple[Any, ...]]] | None:
    if id_col is not None and len({_key(r[id_col]) for r in rows}) != len(rows):
        return None
    cols = tuple(sorted(columns))
    counts: Counter[tuple[Any, ...]] = Counter()
    for r in rows:
        cells = []
        for c in cols:
            value = r.get(c)
            if isinstance(value, str) and c not in CASE_SENSITIVE:
                value = value.lower()
            value = _key(value)
            if c == id_col and value not in stable:
                value = GENERATED
            cells.append(value)
        counts[tuple(cells)] += 1
    return cols, counts


def mismatched_tables(predicted: Iterable[Call], gold: Iterable[Call]) -> list[str]:
    """The tables whose final state differs; empty means the model did what the ground truth does."""
    got_world, got_stable = replay_tracked(predicted)
    want_world, want_stable = replay_tracked(gold)
    bad = []
    for prefix, table, id_col in STATE_TABLES:
        got = canonical(*_rows(got_world, table), id_col, got_stable.get(prefix, set()))
        want = canonical(*_rows(want_world, table), id_col, want_stable.get(prefix, set()))
        if got is None or want is None or got != want:
            bad.append(prefix)
    return bad
