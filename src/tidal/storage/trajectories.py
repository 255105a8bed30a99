"""Episode records of a run by RL step, and its per-tag eval records (`eval/<tag>.jsonl`).

`TrajectoryWriter` reads the run's trajectory store (store.py) and, for runs made before the
store, the JSONL step files in `trajectories/`; it sits above both, which is why it is not in
run.py, the run folder the store itself is built on.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tidal.errors import CheckpointError
from tidal.storage.run import RunFolder, read_jsonl, write_jsonl_atomic

_STEP_FILE = re.compile(r"^step-(\d+)\.jsonl$")
_SAFE_TAG = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@+=-]*$")


class TrajectoryWriter:
    """Episode records of a run by RL step, plus per-tag eval records.

    Since the trajectory store (store.py), the loop writes Parquet segments; the readers here
    (`steps`, `read_step`, `read_all`, `find`) read the run's store and, for runs made before it,
    its JSONL step files, so old and new runs read alike. `write_step` still writes a JSONL step
    file, replacing the whole file atomically (for tools and tests of the JSONL format).
    """

    def __init__(self, run: RunFolder) -> None:
        self.run = run

    def step_path(self, step: int) -> Path:
        return self.run.trajectories_dir / f"step-{step:06d}.jsonl"

    def write_step(self, step: int, records: list[dict[str, Any]]) -> Path:
        """Write the records of `step` (replacing any earlier file of that step)."""
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            raise ValueError(f"step must be a non-negative int, got {step!r}")
        path = self.step_path(step)
        write_jsonl_atomic(path, records)
        return path

    def _store(self) -> Any:
        """The run's trajectory store (read-only), or None for a run without one."""
        from tidal.storage.store import existing_run_store

        return existing_run_store(self.run)

    def jsonl_steps(self) -> list[int]:
        """The steps that have a JSONL step file (runs made before the store), in order."""
        folder = self.run.trajectories_dir
        if not folder.is_dir():
            return []
        found = (_STEP_FILE.match(entry.name) for entry in folder.iterdir())
        return sorted(int(match.group(1)) for match in found if match)

    def read_jsonl_step(self, step: int) -> list[dict[str, Any]]:
        return list(read_jsonl(self.step_path(step)))

    def steps(self) -> list[int]:
        """The steps written so far (store and JSONL), in increasing order."""
        store = self._store()
        return sorted(set(self.jsonl_steps()) | set(store.steps() if store else ()))

    def read_step(self, step: int) -> list[dict[str, Any]]:
        store = self._store()
        if store is not None and step in store.steps():
            return list(store.records(step))
        path = self.step_path(step)
        if not path.is_file():
            raise CheckpointError(f"{path}: step {step} has no trajectories in {self.run.path}")
        return list(read_jsonl(path))

    def read_all(self) -> Iterator[dict[str, Any]]:
        """Every record, in step order (numeric, so step 1000000 comes after 999999)."""
        store = self._store()
        stored = set(store.steps()) if store else set()
        jsonl = [step for step in self.jsonl_steps() if step not in stored]
        by_step: dict[int, list[dict[str, Any]]] = {}
        for record in store.records() if store else ():
            by_step.setdefault(record["step"], []).append(record)
        for step in sorted(stored | set(jsonl)):
            if step in stored:
                yield from by_step[step]
            else:
                yield from read_jsonl(self.step_path(step))

    def find(self, id: str) -> dict[str, Any] | None:
        """The record whose `id` is `id`, or None: from the store, else a linear scan of the JSONL
        files in which the text of the encoded id is looked for first, so only candidate lines
        are parsed."""
        store = self._store()
        found = store.get(id) if store else None
        if found is not None:
            return found
        needle = json.dumps(id, ensure_ascii=False)
        for step in self.jsonl_steps():
            path = self.step_path(step)
            with path.open(encoding="utf-8") as handle:
                for line in handle:
                    if needle not in line:
                        continue
                    record = json.loads(line)
                    if record.get("id") == id:
                        return record
        return None

    # -- eval records --------------------------------------------------------------------------

    def eval_path(self, tag: str) -> Path:
        if not isinstance(tag, str) or not _SAFE_TAG.match(tag):
            raise ValueError(f"eval tag {tag!r}: use letters, digits and . _ - @ + = (no slashes), e.g. 'before'")
        return self.run.eval_dir / f"{tag}.jsonl"

    def write_eval(self, tag: str, records: list[dict[str, Any]]) -> Path:
        """Write the eval records of `tag` (e.g. 'before', 'after', 'step-000040') atomically."""
        path = self.eval_path(tag)
        write_jsonl_atomic(path, records)
        return path

    def read_eval(self, tag: str) -> list[dict[str, Any]]:
        path = self.eval_path(tag)
        if not path.is_file():
            raise CheckpointError(f"{path}: no eval records tagged {tag!r} in {self.run.path}")
        return list(read_jsonl(path))

    def eval_tags(self) -> list[str]:
        folder = self.run.eval_dir
        if not folder.is_dir():
            return []
        return sorted(p.stem for p in folder.glob("*.jsonl") if not p.name.startswith("."))
