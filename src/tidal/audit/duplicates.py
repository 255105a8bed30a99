"""Check 9, `duplicates`: exact and near-duplicate tasks, within a split and across train/eval.

Each task gets three keys, compared with every task audited before it (streaming: only the keys
are kept, a few hundred bytes per task):

- **exact**: the normalised prompt (NFKC, case folded, whitespace collapsed) plus the expected answer;
- **near**: a MinHash signature of the prompt's word 3-gram shingles (`PERMUTATIONS` hashes),
  indexed by LSH in `BANDS` bands so that candidates are found without comparing every pair; a
  candidate is a near-duplicate when its estimated Jaccard similarity is at least
  `near_duplicate` *and* its solution key is the same (templated prompts that differ in one number
  have different solutions and are not duplicates);
- **code**: the reference's AST with identifiers renamed by first use, constants kept;
- **paraphrase** (paraphrase.py), across splits only: the prompts' content words (numbers,
  punctuation and case normalised, function words dropped, light stemming) have an estimated
  Jaccard similarity of at least `paraphrase_jaccard`, the same numbers, and the same solution;
- **short** and **tests** (short_prompts.py), across splits only: two short prompts with a few words
  changed (word, character 3-gram or content-word containment similarity, same numbers and
  solution), and two code tasks whose answers define the same functions for the same assertions.

The later task of a pair gets the finding, naming the earlier one; severities by split are in
docs/design/audit.md, "The checks". `checks.check_duplicates` calls the index (`ctx.duplicates`).
"""

from __future__ import annotations

import ast
import builtins
import hashlib
import re
import threading
import unicodedata
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from tidal import pyast
from tidal.audit.code import reference_code
from tidal.audit.paraphrase import ParaphraseIndex, solution_keys
from tidal.audit.records import Finding
from tidal.audit.short_prompts import ShortPromptIndex
from tidal.types import Task

CHECK = "duplicates"
PERMUTATIONS = 64
BANDS = 16  # rows per band = 4: pairs near Jaccard 0.5 and above become candidates
SHINGLE = 3
_RNG = np.random.default_rng(20240607)
_A = _RNG.integers(1, 2**63 - 1, PERMUTATIONS, dtype=np.uint64) | np.uint64(1)
_B = _RNG.integers(0, 2**63 - 1, PERMUTATIONS, dtype=np.uint64)
BUILTIN_NAMES = set(dir(builtins))


def normalised(text: str) -> str:
    return " ".join(unicodedata.normalize("NFKC", text).casefold().split())


def shingles(text: str, size: int = SHINGLE) -> set[str]:
    words = re.findall(r"\w+|[^\w\s]", normalised(text))
    if len(words) < size:
        return {" ".join(words)}
    return {" ".join(words[i:i + size]) for i in range(len(words) - size + 1)}


def minhash(items: set[str]) -> np.ndarray:
    """(PERMUTATIONS,) uint64: per hash function, the least hash over the items."""
    values = np.array([int.from_bytes(hashlib.blake2b(s.encode("utf-8"), digest_size=8).digest(), "little")
                       for s in items], dtype=np.uint64)
    with np.errstate(over="ignore"):  # multiply-shift hashing wraps around on purpose
        permuted = (values[:, None] * _A[None, :] + _B[None, :]) >> np.uint64(32)  # (items, PERMUTATIONS)
    return permuted.min(axis=0)


def similarity(a: np.ndarray, b: np.ndarray) -> float:
    """Estimated Jaccard similarity of two signatures."""
    return float(np.mean(a == b))


class _Canonical(ast.NodeTransformer):
    """Renames identifiers to v0, v1, ... by first use; builtins keep their names."""

    def __init__(self) -> None:
        self.names: dict[str, str] = {}

    def rename(self, name: str) -> str:
        if name in BUILTIN_NAMES:
            return name
        return self.names.setdefault(name, f"v{len(self.names)}")

    def visit_Name(self, node: ast.Name) -> ast.AST:
        node.id = self.rename(node.id)
        return node

    def visit_arg(self, node: ast.arg) -> ast.AST:
        node.arg, node.annotation = self.rename(node.arg), None
        return node

    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.AST:
        node.name = self.rename(node.name)
        return self.generic_visit(node)


def canonical_code(task: Task) -> str | None:
    code = reference_code(task)
    if code is None:
        return None
    return ast.dump(_Canonical().visit(pyast.parse(code)), annotate_fields=False)


def solution_key(task: Task) -> str:
    """What a right answer must be: the expected answer, the canonical reference, or the tests."""
    args = task.verifier.args
    for key in ("answer", "pattern"):
        if args.get(key) not in (None, ""):
            return f"{key}:{normalised(str(args[key]))}"
    canonical = canonical_code(task)
    if canonical is not None:
        return "code:" + canonical
    return "tests:" + hashlib.sha256(repr(sorted(task.tests.items())).encode()).hexdigest()


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]


@dataclass
class DuplicateIndex:
    """The keys of the tasks audited so far. `check` is called in input order (the runner does)."""

    threshold: float = 0.8
    exact: dict[str, tuple[str, str]] = field(default_factory=dict)  # key -> (task id, split)
    code: dict[str, tuple[str, str]] = field(default_factory=dict)
    buckets: dict[tuple[int, bytes], list[int]] = field(default_factory=lambda: defaultdict(list))
    entries: list[tuple[str, str, str, np.ndarray]] = field(default_factory=list)  # id, split, solution, signature
    paraphrases: ParaphraseIndex = field(default_factory=ParaphraseIndex)
    short: ShortPromptIndex = field(default_factory=ShortPromptIndex)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def check(self, task: Task) -> list[Finding]:
        with self.lock:
            return self._check(task)

    def _check(self, task: Task) -> list[Finding]:
        prompt = " ".join(m["content"] for m in task.messages())
        solution = solution_key(task)
        findings: list[Finding] = []
        exact_key = _digest(normalised(prompt) + "\x00" + solution)
        if exact_key in self.exact:
            findings.append(self._finding("exact", task, *self.exact[exact_key], 1.0))
        else:
            self.exact[exact_key] = (task.id, task.split)
        signature = minhash(shingles(prompt))
        rows = PERMUTATIONS // BANDS
        candidates: set[int] = set()
        bands = [(band, signature[band * rows:(band + 1) * rows].tobytes()) for band in range(BANDS)]
        for key in bands:
            candidates.update(self.buckets.get(key, ()))
        if not findings:
            # Among the near-duplicates, one across splits matters most; then the most similar.
            near = [(self.entries[i][1] != task.split, sim, -i) for i in candidates
                    if self.entries[i][2] == solution and (sim := similarity(signature, self.entries[i][3])) >= self.threshold]
            if near:
                _, sim, negative = max(near)
                other = self.entries[-negative]
                findings.append(self._finding("near", task, other[0], other[1], sim))
        canonical = canonical_code(task)
        if canonical is not None and not findings:
            code_key = _digest(canonical)
            if code_key in self.code:
                findings.append(self._finding("code", task, *self.code[code_key], 1.0))
            else:
                self.code[code_key] = (task.id, task.split)
        paraphrase, paraphrase_bands, paraphrase_entry = self.paraphrases.match(task, prompt, solution_keys(task, solution))
        if paraphrase is not None and not findings:
            findings.append(self._finding("paraphrase", task, paraphrase.other_id, paraphrase.other_split,
                                          paraphrase.similarity))
            findings[-1].evidence["estimated_similarity"] = round(paraphrase.estimated, 3)
        self.paraphrases.add(paraphrase_bands, paraphrase_entry)
        keys = solution_keys(task, solution)
        short = self.short.match(task, prompt, keys) if not findings else None
        if short is not None:
            findings.append(self._finding(short.kind, task, short.other_id, short.other_split, short.similarity))
        self.short.add(task, prompt, keys)
        index = len(self.entries)
        self.entries.append((task.id, task.split, solution, signature))
        for key in bands:
            self.buckets[key].append(index)
        return findings

    @staticmethod
    def _finding(kind: str, task: Task, other_id: str, other_split: str, score: float) -> Finding:
        across = other_split != task.split
        severity = {("exact", True): "quarantine", ("exact", False): "warn"}.get(
            (kind, across), "warn" if across else "info")
        what = {"exact": "an exact duplicate", "near": f"a near-duplicate (similarity {score:.2f})",
                "code": "the same problem (same canonical reference code)",
                "paraphrase": f"a paraphrase (content-word similarity {score:.2f}, same numbers and solution)",
                "short": f"a short prompt restated (similarity {score:.2f}, same numbers and solution)",
                "tests": "the same problem (same functions to define and the same test assertions)"}[kind]
        where = f"across splits ({task.split} vs {other_split})" if across else f"within the {task.split} split"
        return Finding(CHECK, severity, f"{what} of {other_id}, {where}",  # type: ignore[arg-type]
                       {"kind": kind, "duplicate_of": other_id, "similarity": round(score, 3), "across_splits": across})

