"""Parquet read without Arrow's thread pools: every table the project reads goes through here.

Why: Arrow starts its CPU and I/O thread pools on the first threaded read (`pq.read_table`, a
`ParquetFile` with pre-buffering, `Table.to_pandas`), and a process that exits with those threads alive can
abort in C++ after its work is done (`terminate called without an active exception`, exit -6; apache/arrow
#34314, seen here once in `rw-status`). A reader of the store then fails a sweep it read correctly. Read
single-threaded, no such thread exists: the files are a job's few megabytes at a time, and the million-run
benchmark (`benchmarks/bench_store.py --section million`) measures what it costs.
"""
from __future__ import annotations

from typing import Iterable

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq


def parquet(raw: bytes) -> pq.ParquetFile:
    """Bytes of a Parquet file, opened to read in this thread (no pre-buffering: Arrow's I/O pool)."""
    return pq.ParquetFile(pa.BufferReader(raw), pre_buffer=False, page_checksum_verification=True)


def read(raw: bytes, columns: list[str] | None = None) -> pa.Table:
    """The table (`columns`: a selection, read alone)."""
    return parquet(raw).read(columns=columns, use_threads=False)


def read_rows(raw: bytes, column: str, values: Iterable[str]) -> pa.Table:
    """The rows whose `column` is one of `values`: row groups whose statistics rule them out are not read."""
    f, want = parquet(raw), pa.array(sorted(set(values)), pa.string())
    at = f.schema_arrow.get_field_index(column)
    groups = []
    for i in range(f.num_row_groups):
        stats = f.metadata.row_group(i).column(at).statistics
        if len(want) and (stats is None or not stats.has_min_max
                          or (want[0].as_py() <= stats.max and want[-1].as_py() >= stats.min)):
            groups.append(i)
    table = f.read_row_groups(groups, use_threads=False) if groups else f.schema_arrow.empty_table()
    return table.filter(pc.is_in(table[column], value_set=want))


def to_pandas(table: pa.Table) -> pd.DataFrame:
    """The table as a DataFrame, converted in this thread."""
    return table.to_pandas(use_threads=False)
