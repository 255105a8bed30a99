"""SQL over a run's trajectory store with DuckDB, reading the Parquet segments where they lie.

Views (docs/design/store.md, "Querying"):

- `trajectories_all`: every stored version of every trajectory (a step redone after a resume
  leaves its crashed attempt's rows here too);
- `trajectories`: the latest version of each id, the one that was (or will be) trained;
- `ledger`: the raw exactly-once ledger rows (`trained` and `rollback` events);
- `trained`: the ids that count as trained (id, step, attempt, written_at), rollbacks applied.

Segments are checked (footer manifest) before DuckDB sees them; a corrupt one raises in strict
mode or is left out with a warning in lenient mode. Non-local stores are read through their
fsspec filesystem, registered with DuckDB.
"""

from __future__ import annotations

import datetime as dt
import warnings
from decimal import Decimal
from typing import Any

import duckdb
import pyarrow as pa

from tidal.errors import CorruptSegmentError, StoreError
from tidal.storage.schema import LEDGER, LEDGER_SCHEMA, TRAJECTORIES, TRAJECTORY_SCHEMA
from tidal.storage.segments import CorruptSegmentWarning
from tidal.storage.store import TrajectoryStore

_LATEST = """
CREATE VIEW trajectories AS
SELECT * EXCLUDE (_version) FROM (
    SELECT *, row_number() OVER (PARTITION BY id ORDER BY attempt DESC, sequence DESC) AS _version
    FROM trajectories_all
) WHERE _version = 1
"""

_TRAINED = """
CREATE VIEW trained AS
SELECT t.id, t.step, t.attempt, t.written_at FROM ledger AS t
WHERE t.event = 'trained' AND NOT EXISTS (
    SELECT 1 FROM ledger AS r
    WHERE r.event = 'rollback' AND r.step <= t.step
      AND (r.attempt > t.attempt OR (r.attempt = t.attempt AND r.sequence > t.sequence))
)
"""


def connect(store: TrajectoryStore) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB connection with the store's views registered."""
    con = duckdb.connect(":memory:")
    if not store.files.local:
        con.register_filesystem(store.files.fs)
    for kind, view, schema in ((TRAJECTORIES, "trajectories_all", TRAJECTORY_SCHEMA), (LEDGER, "ledger", LEDGER_SCHEMA)):
        urls = _finished_urls(store, kind)
        if urls:
            listing = ", ".join(_quote(u) for u in urls)
            con.execute(f"CREATE VIEW {view} AS SELECT * FROM read_parquet([{listing}], union_by_name = true)")
        else:
            con.register(f"_empty_{view}", schema.empty_table())
            con.execute(f"CREATE VIEW {view} AS SELECT * FROM _empty_{view}")
    con.execute(_LATEST)
    con.execute(_TRAINED)
    return con


def run_query(store: TrajectoryStore, sql: str) -> pa.Table:
    """The result of `sql` over the store's views, as an Arrow table."""
    con = connect(store)
    try:
        relation = con.sql(sql)
        return relation.to_arrow_table() if relation is not None else pa.table({})
    except duckdb.Error as error:
        raise StoreError(f"query over {store.url!r} failed: {error}", store.url) from None
    finally:
        con.close()


def _finished_urls(store: TrajectoryStore, kind: str) -> list[str]:
    """Segments whose footer manifest reads back; the others raise or are skipped with a warning."""
    import pyarrow.parquet as pq

    urls = []
    for segment in store.files.list(kind):
        try:
            with store.files.fs.open(segment.path, "rb") as handle:
                meta = pq.read_metadata(handle)
            if (meta.metadata or {}).get(b"tidal.kind", b"").decode() != kind:
                raise ValueError(f"not a tidal {kind} segment")
        except (pa.ArrowException, OSError, ValueError) as error:
            where = store.files.display(segment.path)
            problem = CorruptSegmentError(f"{where}: corrupt {kind} segment ({error})", store.url, where)
            if store.strict:
                raise problem from None
            warnings.warn(f"skipped: {problem}", CorruptSegmentWarning, stacklevel=2)
            continue
        urls.append(store.files.url_of(segment))
    return urls


def _quote(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def rows_of(table: pa.Table) -> list[dict[str, Any]]:
    """A result's rows as dicts of JSON-ready values: maps as dicts, DuckDB's decimals (e.g. a
    `sum` of integers) as int or float, times as ISO text."""
    return [{key: _plain(value) for key, value in row.items()} for row in table.to_pylist()]


def _plain(value: Any) -> Any:
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, (dt.datetime, dt.date, dt.time)):
        return value.isoformat()
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        if value and all(isinstance(v, tuple) and len(v) == 2 for v in value):  # an Arrow map
            return {k: _plain(v) for k, v in value}
        return [_plain(v) for v in value]
    return value
