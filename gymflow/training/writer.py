"""Batched, atomic export files: Parquet row groups (pyarrow) or JSON Lines, chosen by the file's suffix.

Rows are buffered up to a count and a rough size, then written and dropped, so memory stays flat however
many rows pass through. The file appears under its name only when complete: a failed export leaves none.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import TracebackType
from typing import IO, Any

import pyarrow as pa
import pyarrow.parquet as pq

from gymflow.training.rows import weight

SUFFIXES = (".parquet", ".jsonl")
BATCH_ROWS = 512
BATCH_WEIGHT = 64 * 2**20  # about 64 MiB of Python objects per row group


def check_out_path(out: Path) -> None:
    """Refuse an output path that cannot work, before anything is read from the database."""
    if out.suffix not in SUFFIXES:
        raise ValueError(f"--out {str(out)!r}: the name must end in .parquet or .jsonl (got {out.suffix or 'none'!r})")
    if not out.parent.is_dir():
        raise ValueError(f"--out {str(out)!r}: folder {str(out.parent)!r} does not exist")
    if out.is_dir():
        raise ValueError(f"--out {str(out)!r} is a folder")


class RowWriter:
    def __init__(self, out: Path, schema: pa.Schema, batch_rows: int = BATCH_ROWS,
                 batch_weight: int = BATCH_WEIGHT) -> None:
        check_out_path(out)
        self.out, self.schema = out, schema
        self.batch_rows, self.batch_weight = batch_rows, batch_weight
        self.partial = out.with_name(f".{out.name}.partial")
        self.rows = 0
        self._batch: list[dict[str, Any]] = []
        self._weight = 0
        self._parquet: pq.ParquetWriter | None = None
        self._jsonl: IO[str] | None = None
        if out.suffix == ".parquet":
            self._parquet = pq.ParquetWriter(self.partial, schema, compression="zstd")
        else:
            self._jsonl = open(self.partial, "w", encoding="utf-8")  # noqa: SIM115 - closed in close()

    def write(self, row: dict[str, Any]) -> None:
        self._batch.append(row)
        self._weight += weight(row)
        self.rows += 1
        if len(self._batch) >= self.batch_rows or self._weight >= self.batch_weight:
            self.flush()

    def flush(self) -> None:
        if not self._batch:
            return
        if self._parquet is not None:
            self._parquet.write_table(pa.Table.from_pylist(self._batch, schema=self.schema))
        elif self._jsonl is not None:
            self._jsonl.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in self._batch)
        self._batch, self._weight = [], 0

    def close(self, ok: bool) -> None:
        try:
            if ok:
                self.flush()
        finally:
            if self._parquet is not None:
                self._parquet.close()
            if self._jsonl is not None:
                self._jsonl.close()
        if ok:
            os.replace(self.partial, self.out)
        else:
            self.partial.unlink(missing_ok=True)

    def __enter__(self) -> RowWriter:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close(ok=exc_type is None)
