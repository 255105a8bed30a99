"""The intelligence index: a weighted aggregate of per-category pass rates, with a task-clustered
bootstrap interval, compared only between evals of the same task set.

A category (seed 003's five by default: reasoning, code, math, knowledge, agent) collects tasks by
domain or by task-id pattern; its score is the mean over its tasks of each task's score (the mean
of its scored epochs, `compare.scores_from_records`), so a task weighs the same however many epochs
ran. The index is Σ w_c · score_c / Σ w_c over the categories that have tasks (a configured
category without tasks is listed as missing, and the weights of the rest are renormalised).

The interval is a percentile bootstrap that resamples tasks with replacement *within* each
category, all epochs of a task together (a task's score is resampled, never single episodes): the
interval is about another draw of tasks of the same mix, which is what a different benchmark of
the same kind would be. It is seeded (`IndexConfig.seed`) and reports B and the seed.

Two evals are comparable only when they ran the same tasks with the same content: `taskset.json`
in each eval folder holds a SHA-256 over the sorted (task id, content hash) pairs, written by the
harness before anything runs. A difference between two evals is paired by task: the same bootstrap
draws of tasks are applied to both, and the interval is that of the difference of the two indices.
A trend over a series of eval folders (versions) reports each index and the paired difference of
each version against the one before it; any mismatch of task sets is a `TaskSetMismatch` naming
both folders and both hashes.
"""

from __future__ import annotations

import fnmatch
import hashlib
import itertools
import json
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from tidal.errors import EvalError

TASK_SET = "taskset.json"


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Category(_Section):
    """One category of the index: which tasks it holds and its weight."""

    weight: float = Field(1.0, gt=0, description="weight in the index (weights are normalised to sum to 1)")
    domains: list[str] = Field(default_factory=list, description="task domains in this category")
    tasks: list[str] = Field(default_factory=list, description="task-id glob patterns (fnmatch), checked first")


def _seed_categories() -> dict[str, Category]:
    """Seed 003's five categories with equal weights; general tasks count as reasoning."""
    return {"reasoning": Category(weight=0.2, domains=["reasoning", "general"]),
            "code": Category(weight=0.2, domains=["code"]), "math": Category(weight=0.2, domains=["math"]),
            "knowledge": Category(weight=0.2, domains=["knowledge"]), "agent": Category(weight=0.2, domains=["agent"])}


class IndexConfig(_Section):
    """Categories, weights and the bootstrap of the intelligence index (`index` in the eval config)."""

    categories: dict[str, Category] = Field(default_factory=_seed_categories, description="name -> category")
    bootstrap: int = Field(2000, ge=100, le=200_000, description="bootstrap resamples (B)")
    seed: int = Field(0, ge=0, description="bootstrap seed")
    confidence: float = Field(0.95, gt=0.5, lt=1.0, description="interval confidence")

    @model_validator(mode="after")
    def _check(self) -> IndexConfig:
        problems = []
        if not self.categories:
            problems.append("categories: at least one category")
        owner: dict[str, str] = {}
        for name, category in self.categories.items():
            if not category.domains and not category.tasks:
                problems.append(f"categories.{name}: names no domains and no task patterns")
            for domain in category.domains:
                if domain in owner:
                    problems.append(f"categories.{name}: domain {domain!r} is already in {owner[domain]!r}")
                owner[domain] = name
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def category_of(self, task_id: str, domain: str) -> str | None:
        """The category of a task: the first whose task patterns match its id, else its domain's."""
        for name, category in self.categories.items():
            if any(fnmatch.fnmatchcase(task_id, pattern) for pattern in category.tasks):
                return name
        return next((name for name, c in self.categories.items() if domain in c.domains), None)


class TaskSetMismatch(EvalError):
    """Two evals ran different task sets (ids or content), so their indices cannot be compared."""

    def __init__(self, first: str, first_hash: str, second: str, second_hash: str, detail: str = "") -> None:
        self.first, self.first_hash, self.second, self.second_hash = first, first_hash, second, second_hash
        super().__init__(f"{first} (task set {first_hash[:16]}) and {second} (task set {second_hash[:16]}) did not "
                         f"run the same tasks{': ' + detail if detail else ''}; an index is compared only between "
                         "evals of the same task set (taskset.json)")


# ------------------------------------------------------------------------------------------ task sets


def task_content_hash(task: Any) -> str:
    """SHA-256 of a task's full content (prompt, verifier, tests, files, limits, metadata)."""
    data = task.model_dump(mode="json") if hasattr(task, "model_dump") else task
    return hashlib.sha256(json.dumps(data, sort_keys=True, ensure_ascii=False).encode("utf-8")).hexdigest()


def task_set(tasks: Iterable[Any]) -> dict[str, Any]:
    """The task set of an eval: per-task content hashes and one hash over the sorted pairs."""
    contents = {task.id: task_content_hash(task) for task in tasks}
    return {"kind": "content", "hash": _set_hash(contents), "tasks": dict(sorted(contents.items()))}


def _set_hash(contents: Mapping[str, str]) -> str:
    joined = "\n".join(f"{task_id}\t{digest}" for task_id, digest in sorted(contents.items()))
    return hashlib.sha256(joined.encode("utf-8")).hexdigest()


def write_task_set(out: Path, tasks: Iterable[Any]) -> dict[str, Any]:
    """Write taskset.json into an eval folder (the tasks this run scores, quarantined ones left out)."""
    data = task_set(tasks)
    tmp = (out / TASK_SET).with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1), encoding="utf-8")
    os.replace(tmp, out / TASK_SET)
    return data


def read_task_set(folder: Path) -> dict[str, Any]:
    """An eval folder's task set; a folder from before taskset.json falls back to its task ids
    (`kind: ids`), whose hash never equals a content hash."""
    path = folder / TASK_SET
    if path.is_file():
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except ValueError as error:
            raise EvalError(f"{path}: not JSON ({error}); rerun tidal eval into the folder to rewrite it") from None
        if not isinstance(data, dict) or not isinstance(data.get("hash"), str) or not isinstance(data.get("tasks"), dict):
            raise EvalError(f"{path}: expected {{kind, hash, tasks}}")
        return data
    spec_path = folder / "eval.json"
    ids = json.loads(spec_path.read_text(encoding="utf-8")).get("tasks", []) if spec_path.is_file() else []
    contents = {str(task_id): "" for task_id in ids}
    return {"kind": "ids", "hash": "ids:" + _set_hash(contents), "tasks": contents}


def check_same_task_set(first: str, a: Mapping[str, Any], second: str, b: Mapping[str, Any]) -> None:
    """Raise `TaskSetMismatch` unless the two task sets are the same (hash and kind)."""
    if a["hash"] == b["hash"]:
        return
    only_a, only_b = set(a["tasks"]) - set(b["tasks"]), set(b["tasks"]) - set(a["tasks"])
    changed = sorted(t for t in set(a["tasks"]) & set(b["tasks"]) if a["tasks"][t] != b["tasks"][t])
    parts = []
    if only_a or only_b:
        parts.append(f"{len(only_a)} task(s) only in the first (e.g. {sorted(only_a)[:3]}), "
                     f"{len(only_b)} only in the second (e.g. {sorted(only_b)[:3]})")
    if changed:
        parts.append(f"{len(changed)} task(s) with other content (e.g. {changed[:3]})")
    if a.get("kind") != b.get("kind"):
        parts.append("one folder has no taskset.json (written by tidal eval since the index exists)")
    raise TaskSetMismatch(first, a["hash"], second, b["hash"], "; ".join(parts))


# ------------------------------------------------------------------------------------------ the index


@dataclass
class _Scored:
    """Per-category task scores of one eval, in a fixed task order (for paired draws)."""

    tasks: dict[str, list[str]]  # category -> task ids, sorted
    scores: dict[str, np.ndarray]  # category -> (n_c,) task scores in [0, 1]
    unmapped: list[str]


def _scored(records: Sequence[Mapping[str, Any]], config: IndexConfig) -> _Scored:
    from tidal.eval.compare import scores_from_records

    scores = scores_from_records("index", [dict(r) for r in records])
    tasks: dict[str, list[str]] = {name: [] for name in config.categories}
    unmapped = []
    for task_id in sorted(scores.scores):
        category = config.category_of(task_id, scores.domains[task_id])
        if category is None:
            unmapped.append(task_id)
        else:
            tasks[category].append(task_id)
    arrays = {name: np.asarray([scores.scores[t] for t in ids], dtype=np.float64) for name, ids in tasks.items()}
    return _Scored(tasks, arrays, unmapped)


def _draws(sizes: Mapping[str, int], config: IndexConfig) -> dict[str, np.ndarray]:
    """Bootstrap task indices per category: (B, n_c) each, from one seeded generator."""
    rng = np.random.default_rng(config.seed)
    return {name: rng.integers(0, n, size=(config.bootstrap, n)) for name, n in sizes.items() if n}


def _weights(scored: _Scored, config: IndexConfig) -> dict[str, float]:
    present = {name: config.categories[name].weight for name, ids in scored.tasks.items() if ids}
    total = sum(present.values())
    return {name: weight / total for name, weight in present.items()}


def _percentile(samples: np.ndarray, confidence: float) -> list[float]:
    tail = (1 - confidence) / 2 * 100
    return [float(np.percentile(samples, tail)), float(np.percentile(samples, 100 - tail))]


def compute_index(records: Sequence[Mapping[str, Any]], config: IndexConfig | None = None,
                  task_set_hash: str | None = None) -> dict[str, Any]:
    """The index of one eval's records: per-category scores with bootstrap intervals, the weighted
    index and its interval, B, the seed, and the task-set hash (see the module docstring)."""
    config = config or IndexConfig()
    scored = _scored(records, config)
    weights = _weights(scored, config)
    draws = _draws({name: len(ids) for name, ids in scored.tasks.items()}, config)
    categories: dict[str, Any] = {}
    index_samples = np.zeros(config.bootstrap)
    for name in config.categories:
        values = scored.scores[name]
        if not values.size:
            categories[name] = {"weight": 0.0, "tasks": 0, "score": None, "ci": None}
            continue
        samples = values[draws[name]].mean(axis=1)  # (B,)
        index_samples += weights[name] * samples
        categories[name] = {"weight": weights[name], "tasks": int(values.size), "score": float(values.mean()),
                            "ci": _percentile(samples, config.confidence)}
    value = sum(weights[n] * categories[n]["score"] for n in weights) if weights else None
    return {"index": value, "ci": _percentile(index_samples, config.confidence) if weights else None,
            "categories": categories, "missing": [n for n in config.categories if not scored.tasks[n]],
            "unmapped": scored.unmapped, "tasks": sum(len(ids) for ids in scored.tasks.values()),
            "bootstrap": config.bootstrap, "seed": config.seed, "confidence": config.confidence,
            "method": "percentile bootstrap, tasks resampled within category, all epochs of a task together",
            "task_set": task_set_hash, "config": config.model_dump(mode="json")}


def _aligned(scored: _Scored, tasks: Mapping[str, list[str]]) -> dict[str, np.ndarray]:
    """Per category, the scores of `tasks` in that order."""
    out = {}
    for name, ids in tasks.items():
        position = {task: at for at, task in enumerate(scored.tasks[name])}
        out[name] = np.asarray([scored.scores[name][position[t]] for t in ids], dtype=np.float64)
    return out


def paired_index_difference(before: Sequence[Mapping[str, Any]], after: Sequence[Mapping[str, Any]],
                            config: IndexConfig | None = None) -> dict[str, Any]:
    """index(after) − index(before) over the same tasks, with the paired bootstrap interval (the
    same draws of tasks for both). The caller checks the task sets first (`check_same_task_set`);
    tasks scored in only one of them (all epochs infra errors) are left out of both."""
    config = config or IndexConfig()
    a, b = _scored(before, config), _scored(after, config)
    shared = {name: sorted(set(a.tasks[name]) & set(b.tasks[name])) for name in config.categories}
    rows_a, rows_b = _aligned(a, shared), _aligned(b, shared)
    present = {name: config.categories[name].weight for name, ids in shared.items() if ids}
    if not present:
        return {"diff": None, "ci": None, "tasks": 0, "bootstrap": config.bootstrap, "seed": config.seed}
    total = sum(present.values())
    draws = _draws({name: len(ids) for name, ids in shared.items()}, config)
    diff, samples = 0.0, np.zeros(config.bootstrap)
    for name, weight in present.items():
        delta = rows_b[name] - rows_a[name]  # (n_c,) per-task differences
        diff += weight / total * float(delta.mean())
        samples += weight / total * delta[draws[name]].mean(axis=1)
    return {"diff": diff, "ci": _percentile(samples, config.confidence),
            "tasks": sum(len(ids) for ids in shared.values()), "bootstrap": config.bootstrap, "seed": config.seed,
            "per_category": {name: float((rows_b[name] - rows_a[name]).mean()) for name in present}}


# ------------------------------------------------------------------------------------------ folders


@dataclass
class Version:
    """One eval folder of a trend, with its label."""

    label: str
    folder: Path
    records: list[dict[str, Any]]
    task_set: dict[str, Any]


def parse_version(spec: str) -> tuple[Path, str]:
    """`DIR` or `DIR:LABEL` (an existing path wins over the split); the label defaults to the folder name."""
    path = Path(spec)
    if not path.exists() and ":" in spec:
        head, _, label = spec.rpartition(":")
        return Path(head), label
    return path, path.name


def load_version(spec: str) -> Version:
    """An eval folder's records (latest per task and epoch, quarantined tasks left out) and task set."""
    from tidal.eval.results import QUARANTINE, RESULTS, latest_records, read_results

    folder, label = parse_version(spec)
    if not (folder / RESULTS).is_file():
        raise EvalError(f"{folder}: no {RESULTS}; is it an eval folder (tidal eval --out)?")
    skipped = set()
    if (folder / QUARANTINE).is_file():
        skipped = {e["task_id"] for e in json.loads((folder / QUARANTINE).read_text(encoding="utf-8"))["quarantined"]}
    records = [r for r in latest_records(read_results(folder / RESULTS)) if r["task_id"] not in skipped]
    return Version(label, folder, records, read_task_set(folder))


def version_key(label: str) -> list[Any]:
    """Natural order of version labels: v2 < v10, 1.9 < 1.10."""
    return [(0, int(part)) if part.isdigit() else (1, part) for part in re.split(r"(\d+)", label) if part]


def trend(versions: Sequence[Version], config: IndexConfig | None = None) -> dict[str, Any]:
    """The index of each version and the paired difference of each against the one before it.
    Every version must have the first one's task set (`TaskSetMismatch` otherwise)."""
    config = config or IndexConfig()
    if not versions:
        raise EvalError("tidal index needs at least one eval folder")
    first = versions[0]
    for other in versions[1:]:
        check_same_task_set(str(first.folder), first.task_set, str(other.folder), other.task_set)
    rows = [{"label": v.label, "folder": str(v.folder), **compute_index(v.records, config, v.task_set["hash"])}
            for v in versions]
    steps = [{"from": a.label, "to": b.label, **paired_index_difference(a.records, b.records, config)}
             for a, b in itertools.pairwise(versions)]
    return {"task_set": first.task_set["hash"], "task_set_kind": first.task_set.get("kind"),
            "versions": rows, "differences": steps, "bootstrap": config.bootstrap, "seed": config.seed,
            "confidence": config.confidence, "categories": list(config.categories)}


def trend_of_folders(specs: Sequence[str], config: IndexConfig | None = None, by_label: bool = False) -> dict[str, Any]:
    """`tidal index`: the trend over eval folders (`DIR` or `DIR:LABEL`), in the order given or, with
    `by_label`, in the natural order of their labels."""
    versions = [load_version(spec) for spec in specs]
    labels = [v.label for v in versions]
    if len(set(labels)) < len(labels):
        raise EvalError(f"two eval folders share a label ({labels}); name them DIR:LABEL")
    if by_label:
        versions.sort(key=lambda v: version_key(v.label))
    return trend(versions, config)
