"""The trajectory store: every trajectory of a run in append-only Parquet segments through fsspec,
and the ledger that makes each one trained exactly once (docs/design/store.md).

    store = open_run_store(run, cfg.run.trajectory_store)   # <run>/trajectories by default
    store.rollback(start_step)                              # resuming: void what the lost steps trained
    store.write_episodes(step, episodes, messages_by_task)  # before the trainer may use them
    ...update...
    store.mark_trained([e.id for e in kept], step)          # right after the update

Ids are deterministic (`<run>/step-<step>/g<group>/s<sample>`), so a step redone after a resume
gets the same ids and its rows replace the crashed attempt's as the latest version of each id. An
id is *trained* when a `trained` ledger row names it and no later `rollback` row voids it (a
rollback at step S voids the `trained` rows of steps >= S: those updates died with the process).
`mark_trained` refuses an id that is trained already, unknown to the store, or dropped by the gate.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
import yaml

from tidal.errors import ExactlyOnceError, StoreError, StoreUnavailableError
from tidal.storage.run import RunFolder, dumps
from tidal.storage.schema import (
    LEDGER,
    SCHEMA_VERSION,
    TRAJECTORIES,
    TRAJECTORY_SCHEMA,
    episode_row,
    record_from_row,
    table_from_rows,
)
from tidal.storage.segments import Segment, SegmentFiles
from tidal.types import Episode, Task

MANIFEST = "_store.json"
FORMAT = "tidal-trajectory-store"


def store_url(run: RunFolder | str | Path, configured: str | None = None) -> str:
    """Where a run's store lives: `<configured URL>/<run name>` when `run.trajectory_store` is set
    (one URL can hold many runs), else the run folder's `trajectories/`."""
    run = run if isinstance(run, RunFolder) else RunFolder(Path(run))
    if configured:
        return f"{configured.rstrip('/')}/{run.name}"
    return str(run.trajectories_dir)


def configured_store_url(run: RunFolder) -> str:
    """The store URL of an existing run, from `run.trajectory_store` in its saved config.yaml."""
    configured = None
    if run.config_path.is_file():
        data = yaml.safe_load(run.config_path.read_text(encoding="utf-8")) or {}
        configured = (data.get("run") or {}).get("trajectory_store") if isinstance(data, dict) else None
    return store_url(run, configured)


def existing_run_store(run: RunFolder, *, strict: bool = True) -> TrajectoryStore | None:
    """The store of an existing run opened read-only, or None when the run has none (a run of
    the JSONL era, or one that never reached RL)."""
    url = configured_store_url(run)
    files = SegmentFiles(url)
    if _read_manifest(files, files.join(MANIFEST)) is None:
        return None
    return TrajectoryStore.open(url, strict=strict)


def open_run_store(run: RunFolder, configured: str | None = None, **options: Any) -> TrajectoryStore:
    """The writable store of `run` (see `store_url`); raises StoreUnavailableError at once when
    the URL cannot be written."""
    return TrajectoryStore.open(store_url(run, configured), run=run.name, writable=True, **options)


class TrajectoryStore:
    """One run's trajectories and ledger. Open with `TrajectoryStore.open`.

    A writable store is one *attempt*: its segments are numbered after every segment already in
    the store, so readers can order them. It is always strict (a corrupt segment raises), since
    skipping a ledger segment would forget what was trained. A read-only store may be lenient.
    """

    def __init__(self, files: SegmentFiles, run: str, writable: bool, strict: bool, attempt: int) -> None:
        self.files, self.run, self.writable, self.strict, self.attempt = files, run, writable, strict, attempt
        self._sequence = 0
        self._latest: dict[str, tuple[int, int, int, bool]] | None = None  # id -> (attempt, sequence, step, keep)
        self._trained: dict[str, int] | None = None  # id -> step of the update that trained it
        self._written_now: set[str] = set()

    @property
    def url(self) -> str:
        return self.files.url

    @classmethod
    def open(
        cls,
        url: str,
        *,
        run: str | None = None,
        writable: bool = False,
        strict: bool = True,
        storage_options: dict[str, Any] | None = None,
    ) -> TrajectoryStore:
        """Open the store at `url`. Writable: create it if needed (for `run`), check that it can be
        written, and start a new attempt. Read-only: it must exist."""
        files = SegmentFiles(url, storage_options)
        manifest_path = files.join(MANIFEST)
        manifest = _read_manifest(files, manifest_path)
        if writable:
            if not strict:
                raise ValueError("a writable store is always strict: skipping a ledger segment would forget training")
            files.check_writable()
            if manifest is None:
                if not run:
                    raise StoreError(f"trajectory store {url!r} does not exist yet; give the run's name to create it", url)
                manifest = {"format": FORMAT, "schema_version": SCHEMA_VERSION, "run": run, "created_utc": _now().isoformat()}
                files.write_once(manifest_path, (dumps(manifest, indent=2) + "\n").encode())
        elif manifest is None:
            raise StoreUnavailableError(f"trajectory store {url!r}: no store there (no {MANIFEST})", url)
        if run and manifest.get("run") != run:
            raise StoreError(
                f"trajectory store {url!r} belongs to run {manifest.get('run')!r}, not {run!r}; give each run its own store",
                url,
            )
        segments = files.list(TRAJECTORIES) + files.list(LEDGER)
        attempt = max((s.attempt for s in segments), default=0) + (1 if writable else 0)
        return cls(files, str(manifest.get("run", "")), writable, strict, attempt)

    # -- writing -----------------------------------------------------------------------------------

    def write_episodes(
        self,
        step: int,
        episodes: list[Episode],
        tasks: Mapping[str, Task] | None = None,
        timings: dict[str, float] | None = None,
    ) -> Segment:
        """Store the episodes of RL step `step` as one segment (see `append`). `tasks` (by id)
        supply the prompt messages; `timings` are the step's, merged under each episode's own."""
        rows = []
        for episode in episodes:
            task = (tasks or {}).get(episode.task_id)
            rows.append(episode_row(episode, step, task.messages() if task else None, timings))
        return self.append(rows)

    def append(self, rows: list[dict[str, Any]]) -> Segment:
        """Write `rows` (trajectory rows, `schema.episode_row`) as one new segment. When this
        returns, the rows are durable and the trainer may use them.

        An id written earlier in this attempt, or already trained, is refused: rewriting a
        trained id would change what the ledger says was trained. An id from an earlier attempt
        that was not trained (a step redone after a resume) gets a new latest version.
        """
        self._need_writable()
        ids = [row["id"] for row in rows]
        if len(set(ids)) != len(ids):
            raise StoreError(f"trajectory store {self.url!r}: duplicate ids within one segment", self.url)
        trained = self.trained()
        done = [i for i in ids if i in trained]
        if done:
            raise ExactlyOnceError(
                f"trajectory store {self.url!r}: {done[:3]} ({len(done)} ids) were already trained at step "
                f"{trained[done[0]]}; a resumed run must call rollback(step) before redoing that step",
                self.url,
            )
        again = [i for i in ids if i in self._written_now]
        if again:
            raise StoreError(f"trajectory store {self.url!r}: {again[:3]} already written in this attempt", self.url)
        segment = self._next(TRAJECTORIES)
        stamp = _now()
        full = [{**row, "run": self.run, "attempt": segment.attempt, "sequence": segment.sequence, "written_at": stamp} for row in rows]
        try:
            table = table_from_rows(TRAJECTORIES, full)
        except ValueError as error:
            raise StoreError(f"trajectory store {self.url!r}: {error}", self.url) from None
        self.files.write_segment(segment, table)
        latest = self._index()
        for row in rows:
            latest[row["id"]] = (segment.attempt, segment.sequence, int(row["step"]), bool(row["keep"]))
        self._written_now.update(ids)
        return segment

    def mark_trained(self, ids: Iterable[str], step: int) -> Segment | None:
        """Record that the update of step `step` trained on `ids`. Call it right after the update,
        before the next one. Raises ExactlyOnceError (writing nothing) if an id is unknown to the
        store, was dropped by the gate, is trained already, or repeats."""
        self._need_writable()
        ids = list(ids)
        if not ids:
            return None
        latest, trained = self._index(), self.trained()
        problems = []
        if len(set(ids)) != len(ids):
            problems.append("ids repeat within the batch")
        unknown = [i for i in ids if i not in latest]
        dropped = [i for i in ids if i in latest and not latest[i][3]]
        twice = [i for i in ids if i in trained]
        if unknown:
            problems.append(f"never written to the store: {unknown[:3]} ({len(unknown)})")
        if dropped:
            problems.append(f"dropped by the quality gate: {dropped[:3]} ({len(dropped)})")
        if twice:
            problems.append(f"already trained at step {trained[twice[0]]}: {twice[:3]} ({len(twice)})")
        if problems:
            raise ExactlyOnceError(f"trajectory store {self.url!r}, step {step}: " + "; ".join(problems), self.url)
        segment = self._write_ledger([{"event": "trained", "id": i, "step": step} for i in ids])
        for i in ids:
            trained[i] = step
        return segment

    def rollback(self, step: int) -> Segment | None:
        """Start (or resume) training at update `step`: every `trained` record with step >= `step`
        is void from now on, since the model state holding those updates was lost with the crash.
        Writes a `rollback` row only when there is something to void."""
        self._need_writable()
        trained = self.trained()
        voided = [i for i, s in trained.items() if s >= step]
        if not voided:
            return None
        segment = self._write_ledger([{"event": "rollback", "id": None, "step": step}])
        for i in voided:
            del trained[i]
        return segment

    # -- reading -----------------------------------------------------------------------------------

    def segments(self, kind: str = TRAJECTORIES) -> list[Segment]:
        return self.files.list(kind)

    def table(self, columns: list[str] | None = None, *, all_versions: bool = False) -> pa.Table:
        """Trajectory rows as one Arrow table: the latest version of each id (or every version), in
        write order. Strictness as opened: a corrupt segment raises, or is skipped with a warning."""
        wanted = None if columns is None else list(dict.fromkeys([*columns, "id"]))
        parts = [t for _, t in self.files.read_all(TRAJECTORIES, self.strict, wanted)]
        if not parts:
            empty = TRAJECTORY_SCHEMA.empty_table()
            return empty.select(wanted) if wanted else empty
        table = pa.concat_tables(parts)
        if not all_versions:
            last: dict[str, int] = {}
            for index, id_ in enumerate(table.column("id").to_pylist()):
                last[id_] = index
            table = table.take(sorted(last.values()))
        return table.select(columns) if columns else table

    def records(self, step: int | None = None) -> Iterator[dict[str, Any]]:
        """The latest version of every trajectory (of RL step `step` only, if given), as
        `Episode.to_record()`-shaped dicts, ordered by step (then write order)."""
        table = self.table()
        steps = table.column("step").to_pylist()
        rows = range(table.num_rows) if step is None else [i for i, s in enumerate(steps) if s == step]
        order = sorted(rows, key=steps.__getitem__)
        for row in table.take(order).to_pylist():
            yield record_from_row(row)

    def get(self, id: str) -> dict[str, Any] | None:
        """The latest version of trajectory `id` as a record, or None."""
        found = None
        for _, part in self.files.read_all(TRAJECTORIES, self.strict):
            matches = [i for i, value in enumerate(part.column("id").to_pylist()) if value == id]
            if matches:
                found = part.slice(matches[-1], 1).to_pylist()[0]
        return record_from_row(found) if found else None

    def steps(self) -> list[int]:
        """The RL steps that have trajectories, in increasing order."""
        return sorted({step for _, step, _ in self._summary()})

    def trained(self) -> dict[str, int]:
        """Trained ids -> the step of the update that trained them (rollbacks applied). Cached by a
        writer, which alone appends to the ledger in its attempt; re-read by a reader."""
        if self._trained is None or not self.writable:  # a reader sees new ledger segments too
            trained: dict[str, int] = {}
            for _, part in self.files.read_all(LEDGER, self.strict, ["event", "id", "step"]):
                for event, id_, step in zip(*(part.column(c).to_pylist() for c in ("event", "id", "step"))):
                    if event == "trained":
                        trained.setdefault(id_, step)  # a second 'trained' row would be a bug; keep the first
                    elif event == "rollback":
                        trained = {i: s for i, s in trained.items() if s < step}
            self._trained = trained
        return self._trained

    def unconsumed(self, include_dropped: bool = False) -> list[str]:
        """Ids of stored trajectories the trainer has not trained on (those the gate kept, unless
        `include_dropped`), ordered by step and write order."""
        trained = self.trained()
        return [i for i, step, keep in self._summary() if i not in trained and (keep or include_dropped)]

    # -- internals ---------------------------------------------------------------------------------

    def _summary(self) -> list[tuple[str, int, bool]]:
        latest = self._index()
        ordered = sorted(latest.items(), key=lambda item: (item[1][2], item[1][0], item[1][1]))
        return [(i, step, keep) for i, (_, _, step, keep) in ordered]

    def _index(self) -> dict[str, tuple[int, int, int, bool]]:
        """id -> (attempt, sequence, step, keep) of its latest version; cached by a writer (it alone
        appends in its attempt), re-read on every call by a reader."""
        if self._latest is not None and self.writable:
            return self._latest
        latest: dict[str, tuple[int, int, int, bool]] = {}
        for segment, part in self.files.read_all(TRAJECTORIES, self.strict, ["id", "step", "keep"]):
            for id_, step, keep in zip(*(part.column(c).to_pylist() for c in ("id", "step", "keep"))):
                latest[id_] = (segment.attempt, segment.sequence, step, keep)
        self._latest = latest
        return latest

    def _next(self, kind: str) -> Segment:
        self._sequence += 1
        return self.files.new_segment(kind, self.attempt, self._sequence)

    def _write_ledger(self, rows: list[dict[str, Any]]) -> Segment:
        segment = self._next(LEDGER)
        stamp = _now()
        full = [{**row, "run": self.run, "attempt": segment.attempt, "sequence": segment.sequence, "written_at": stamp} for row in rows]
        self.files.write_segment(segment, table_from_rows(LEDGER, full))
        return segment

    def _need_writable(self) -> None:
        if not self.writable:
            raise StoreError(f"trajectory store {self.url!r} was opened read-only", self.url)


def _read_manifest(files: SegmentFiles, path: str) -> dict[str, Any] | None:
    try:
        data = files.fs.cat_file(path)
    except FileNotFoundError:
        return None
    except OSError as error:
        raise StoreUnavailableError(f"trajectory store {files.url!r}: cannot read {MANIFEST}: {error}", files.url) from None
    try:
        manifest = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise StoreError(f"{files.display(path)}: damaged store manifest (not JSON)", files.url) from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise StoreError(f"{files.display(path)}: not a tidal trajectory store manifest", files.url)
    if int(manifest.get("schema_version", 0)) > SCHEMA_VERSION:
        raise StoreError(
            f"{files.display(path)}: store schema version {manifest['schema_version']} is newer than this tidal's "
            f"{SCHEMA_VERSION}; upgrade tidal",
            files.url,
        )
    return manifest


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)
