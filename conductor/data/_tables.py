"""The tables of :class:`~conductor.data.store.ArtifactStore`: their names, schemas and
sort orders, what the store reports about them, and the checks a ``pairs`` batch passes
before it is written."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

import pyarrow as pa
import pyarrow.compute as pc
from prefect_conductor.conductor.data.records import PAIRS_SCHEMA, RUNS_SCHEMA, STEPS_SCHEMA
from prefect_conductor.conductor.errors import StoreError

__all__ = [
    "TABLES",
    "SCHEMAS",
    "SORT",
    "CompactResult",
    "StoreSummary",
    "TableName",
    "conform_pairs",
]

TableName = Literal["runs", "steps", "pairs"]
TABLES: tuple[TableName, ...] = ("runs", "steps", "pairs")

SCHEMAS: dict[str, pa.Schema] = {"runs": RUNS_SCHEMA, "steps": STEPS_SCHEMA, "pairs": PAIRS_SCHEMA}
# The order rows are written in (each file, and a compacted table, is sorted so).
SORT = {
    "runs": [("created_at", "ascending"), ("run_id", "ascending")],
    "steps": [("run_id", "ascending"), ("step", "ascending")],
    "pairs": [("created_at", "ascending"), ("pair_id", "ascending")],
}
# Pair columns a trainer cannot do without (``margin`` and the run ids may be null).
_PAIRS_NOT_NULL = ("pair_id", "question_id", "input", "chosen", "rejected", "source", "split")
_SPLITS = ("train", "test")


@dataclass(frozen=True)
class StoreSummary:
    """Counts over the whole store. Tokens and cost come from the ``runs`` table (run totals)."""

    runs: int
    steps: int
    failed_runs: int
    failed_steps: int
    skipped_steps: int
    input_tokens: int
    output_tokens: int
    cost_usd: float | None  # None when no run has a known cost
    files: Mapping[str, int]  # live data files per table


@dataclass(frozen=True)
class CompactResult:
    """Per table: live files before and after, and rows rewritten (0 when nothing was merged)."""

    files_before: dict[str, int]
    files_after: dict[str, int]
    rows: dict[str, int]
    busy: tuple[str, ...] = ()  # tables skipped because another compaction holds the lock


def conform_pairs(table: pa.Table, where: str) -> pa.Table:
    """``table`` with exactly the columns of ``PAIRS_SCHEMA``, in its order and types; a
    :class:`StoreError` starting with ``where`` names the first column that does not fit."""
    if not isinstance(table, pa.Table):
        raise StoreError(f"{where}: expected a pyarrow.Table, got {type(table).__name__}")
    names = table.column_names
    missing = [n for n in PAIRS_SCHEMA.names if n not in names]
    extra = sorted({n for n in names if n not in PAIRS_SCHEMA.names or names.count(n) > 1})
    if missing or extra:
        raise StoreError(
            f"{where}: columns must match PAIRS_SCHEMA; missing {missing}, "
            f"unexpected or repeated {extra}"
        )
    columns = []
    for field in PAIRS_SCHEMA:
        column = table[field.name]
        try:
            columns.append(column.cast(field.type))
        except pa.ArrowException as e:
            raise StoreError(
                f"{where}: column {field.name!r} is {column.type}, expected {field.type} ({e})"
            ) from e
        if field.name in _PAIRS_NOT_NULL and column.null_count:
            raise StoreError(
                f"{where}: column {field.name!r} has {column.null_count} null value(s)"
            )
    data = pa.Table.from_arrays(columns, schema=PAIRS_SCHEMA)
    bad = pc.invert(pc.is_in(data["split"], value_set=pa.array(_SPLITS)))
    if pc.any(bad).as_py():
        found = sorted(set(pc.filter(data["split"], bad).to_pylist()))
        raise StoreError(f"{where}: column 'split' must be 'train' or 'test', got {found}")
    return data
