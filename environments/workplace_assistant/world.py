"""The workplace world: the CSV tables NeMo Gym's tools act on, loaded once per process and never mutated.

Each episode works on a `fork()`: fresh lists over the same row dicts. Tools replace a row dict
instead of editing it (copy-on-write), so the pristine world stays intact and forks stay cheap.
"""

from __future__ import annotations

import csv
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from gymflow.kernel.errors import ConfigError, ToolError

ENV_VAR = "GYMFLOW_WORKPLACE_DATA"
_REPO = Path(__file__).resolve().parents[2]
DEFAULT_DATA_DIR = _REPO.parent / "shared" / "data" / "nemo_gym" / "workplace_assistant"

Row = dict[str, Any]

# table name -> CSV file under <data>/world/
_FILES = {
    "emails": "emails.csv",
    "calendar": "calendar_events.csv",
    "analytics": "analytics_data.csv",
    "tasks": "project_tasks.csv",
    "crm": "customer_relationship_manager_data.csv",
}

# NeMo Gym reads the directory from csv_data/raw/email_addresses.csv, which the shared data lacks.
# Its order is the order `company_directory_find_email_address` answers in, so it is kept here;
# a test checks it is exactly the set of @atlas.com addresses the world's tables use.
DEFAULT_DIRECTORY = (
    "aisha.chen@atlas.com", "carlos.rodriguez@atlas.com", "fatima.khan@atlas.com", "dmitri.ivanov@atlas.com",
    "yuki.tanaka@atlas.com", "nia.johnson@atlas.com", "leila.azizi@atlas.com", "santiago.martinez@atlas.com",
    "chenwei.zhang@atlas.com", "anaya.patel@atlas.com", "kofi.mensah@atlas.com", "luis.ortiz@atlas.com",
    "olga.petrova@atlas.com", "jinsoo.kim@atlas.com", "amir.ali@atlas.com", "lena.schmidt@atlas.com",
    "raj.patel@atlas.com", "sofia.santos@atlas.com", "akira.sato@atlas.com", "nadia.moreau@atlas.com",
)


def data_dir() -> Path:
    """`$GYMFLOW_WORKPLACE_DATA`, else the shared data next to the repository."""
    return Path(os.environ.get(ENV_VAR) or DEFAULT_DATA_DIR)


@dataclass
class World:
    """Mutable per-episode tables; rows are dicts in CSV column order (NeMo Gym's record order)."""

    tables: dict[str, list[Row]]
    columns: dict[str, tuple[str, ...]]
    directory: tuple[str, ...]
    plots: list[str] = field(default_factory=list)

    def fork(self) -> World:
        return World({k: list(v) for k, v in self.tables.items()}, self.columns, self.directory, list(self.plots))

    def ids(self, table: str, id_column: str) -> list[Any]:
        return [r[id_column] for r in self.tables[table]]

    def find(self, table: str, id_column: str, value: Any) -> Row | None:
        """The first row whose id equals `value` (pandas `==`: "00000057" never equals 57)."""
        return next((r for r in self.tables[table] if r[id_column] == value), None)

    def update(self, table: str, id_column: str, value: Any, column: str, new_value: Any) -> None:
        """Set `column` on every row with this id, replacing the dicts (never editing shared ones)."""
        self.tables[table] = [{**r, column: new_value} if r[id_column] == value else r for r in self.tables[table]]

    def delete(self, table: str, id_column: str, value: Any) -> None:
        self.tables[table] = [r for r in self.tables[table] if r[id_column] != value]

    def append(self, table: str, values: Row) -> None:
        # Every row carries every column (pandas fills the gaps with NaN, which is None here).
        self.tables[table].append({c: values.get(c) for c in self.columns[table]})

    def next_id(self, table: str, id_column: str, *, width: int = 8) -> str:
        """NeMo Gym's id rule: int(max(ids)) + 1, zero-padded; max is pandas' string max."""
        return str(int(max(self.ids(table, id_column))) + 1).zfill(width)


def _read_csv(path: Path) -> tuple[tuple[str, ...], list[Row]]:
    # pandas.read_csv(dtype=str) semantics: everything is text and an empty cell is NaN (None here).
    with path.open(encoding="utf-8", newline="") as f:
        reader = csv.DictReader(f)
        rows = [{k: (v if v != "" else None) for k, v in row.items()} for row in reader]
        return tuple(reader.fieldnames or ()), rows


@cache
def _load(root: str) -> World:
    base = Path(root) / "world"
    if not base.is_dir():
        raise ConfigError(f"workplace_assistant world not found at {base}; set {ENV_VAR} to the data folder")
    tables: dict[str, list[Row]] = {}
    columns: dict[str, tuple[str, ...]] = {}
    for name, file in _FILES.items():
        columns[name], tables[name] = _read_csv(base / file)
    for row in tables["analytics"]:
        row["user_engaged"] = row["user_engaged"] == "True"  # NeMo Gym converts this column to bool
    directory_file = base / "email_addresses.csv"
    directory = DEFAULT_DIRECTORY
    if directory_file.is_file():
        directory = tuple(line.strip() for line in directory_file.read_text().splitlines() if line.strip())
    return World(tables, columns, directory)


def pristine() -> World:
    """The shared read-only world; call `.fork()` before changing anything."""
    return _load(str(data_dir().resolve()))


def delete_record(w: World, table: str, id_column: str, record_id: Any, noun: str,
                  check: Callable[[Any], None] | None = None) -> str:
    """The delete tools all share NeMo Gym's wording: '<Noun> ID not provided.', '<Noun> not found.'."""
    if not record_id:
        raise ToolError(f"{noun} ID not provided.")
    if check is not None:
        check(record_id)
    if w.find(table, id_column, record_id) is None:
        raise ToolError(f"{noun} not found.")
    w.delete(table, id_column, record_id)
    return f"{noun} deleted successfully."
