"""The task-family registry and the generator loop that every family shares.

A family is a function `(rng, difficulty) -> Draft` registered with `@family("name")`. It draws
one problem of the given difficulty; `generate_tasks` turns drafts into `Task`s and owns what must
hold for every family: determinism, the difficulty spread, ids, and the train/eval split.

The split is decided by a stable hash of the draft's content key (the problem's parameters, not
its phrasing), never by the seed or by `n`. So a problem whose key lands in eval can never be
drawn for train, whatever seeds and sizes the two splits are generated with.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from tidal.errors import TidalError, UnknownNameError
from tidal.types import Task, is_domain_name

Split = Literal["train", "eval"]
MAX_LEVEL = 5  # built-in families define difficulty levels 1..5
EVAL_FRACTION = 0.2  # share of content keys held out for eval by the default split rule
# Draws per task spent looking for content not generated yet in this call; after that a repeat
# is accepted, because small spaces (e.g. single-digit sums) have fewer problems than tasks asked.
FRESH_DRAWS = 64
# Draws after which a family that never produces the wanted split is reported as broken.
MAX_DRAWS = 2000


@dataclass(frozen=True)
class Draft:
    """One generated problem, before it gets an id and a split.

    `key` identifies the content: two drafts with the same key are the same problem, however
    phrased. It decides the split, so it must be a function of the prompt's parameters.
    """

    key: str
    prompt: str
    reference: str
    verifier: dict[str, Any]
    tests: dict[str, str] = field(default_factory=dict)
    limits: dict[str, Any] | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    # Agent tasks: the starting workspace, the tools and the step budget.
    files: dict[str, str] = field(default_factory=dict)
    tools: list[str] = field(default_factory=list)
    max_steps: int = 1


FamilyFunction = Callable[[random.Random, int], Draft]
SplitRule = Callable[[str], Split]


@dataclass(frozen=True)
class FamilySpec:
    name: str
    domain: str
    make: FamilyFunction
    split_of: SplitRule


def stable_fraction(text: str) -> float:
    """A number in [0, 1) that depends only on `text` (not on PYTHONHASHSEED or the platform)."""
    digest = hashlib.sha256(text.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def hash_split(family_name: str) -> SplitRule:
    """The default rule: a fixed fraction of content keys, chosen by hash, is eval."""

    def split_of(key: str) -> Split:
        return "eval" if stable_fraction(f"{family_name}\x00{key}") < EVAL_FRACTION else "train"

    return split_of


FAMILIES: dict[str, FamilySpec] = {}


def family(
    name: str, *, domain: str | None = None, split_of: SplitRule | None = None
) -> Callable[[FamilyFunction], FamilyFunction]:
    """Register a task family. `domain` defaults to the family name when that is an identifier
    (else `custom`); `split_of` replaces the default hash split when a family needs a stricter
    rule (knowledge keeps every fact in train under some phrasing)."""

    def register(make: FamilyFunction) -> FamilyFunction:
        if name in FAMILIES:
            raise ValueError(f"task family {name!r} is registered twice")
        chosen_domain = domain or (name if is_domain_name(name) else "custom")
        if not is_domain_name(chosen_domain):
            raise ValueError(f"task family {name!r}: domain {chosen_domain!r} is not an identifier")
        FAMILIES[name] = FamilySpec(name, chosen_domain, make, split_of or hash_split(name))
        return make

    return register


def _load_plugins() -> None:
    # Installed entry points of group tidal.families: a module registers with @family; a function
    # is registered under the entry point's name (its `domain` attribute, when set, as its domain).
    from tidal import plugins

    for name, loaded in plugins.entry_point_objects("tidal.families"):
        if callable(loaded) and not isinstance(loaded, type(plugins)) and name not in FAMILIES:
            family(name, domain=getattr(loaded, "domain", None))(loaded)


def known_families() -> list[str]:
    _load_plugins()
    return sorted(FAMILIES)


def get_family(name: str) -> FamilySpec:
    _load_plugins()
    if name not in FAMILIES:
        raise UnknownNameError("task family", name, list(FAMILIES))
    return FAMILIES[name]


def difficulty_levels(min_difficulty: int, max_difficulty: int) -> list[int]:
    if not 1 <= min_difficulty <= max_difficulty <= MAX_LEVEL:
        raise TidalError(
            f"difficulty range [{min_difficulty}, {max_difficulty}] is invalid: built-in families "
            f"have levels 1..{MAX_LEVEL} and min_difficulty must be <= max_difficulty"
        )
    return list(range(min_difficulty, max_difficulty + 1))


def _draw(spec: FamilySpec, rng: random.Random, level: int, split: Split, seen: set[str]) -> Draft:
    """The first draft of the wanted split whose content is new, else the first of that split."""
    fallback: Draft | None = None
    for attempt in range(MAX_DRAWS):
        draft = spec.make(rng, level)
        if spec.split_of(draft.key) != split:
            continue
        if draft.key not in seen:
            return draft
        fallback = fallback or draft
        if attempt >= FRESH_DRAWS:
            return fallback
    if fallback is not None:
        return fallback
    raise TidalError(
        f"task family {spec.name!r} produced no {split} task at difficulty {level} in {MAX_DRAWS} "
        "draws; its content space at this level is too small for the split rule"
    )


def generate_tasks(
    family: str,
    n: int,
    split: Split,
    seed: int,
    min_difficulty: int = 1,
    max_difficulty: int = 3,
) -> list[Task]:
    """`n` tasks of one family and split, deterministic for the same arguments.

    Task `i` has difficulty `levels[i % len(levels)]`, so the levels are spread evenly, and its
    own random stream, so a larger `n` extends a smaller one instead of reshuffling it.
    """
    spec = get_family(family)
    # TidalError, not ValueError: these come from user flags and config, and the CLI reports
    # TidalErrors cleanly instead of with a traceback.
    if split not in ("train", "eval"):
        raise TidalError(f"split must be 'train' or 'eval', got {split!r}")
    if n < 0:
        raise TidalError(f"the number of tasks must be >= 0, got {n}")
    levels = difficulty_levels(min_difficulty, max_difficulty)
    tasks: list[Task] = []
    seen: set[str] = set()
    for index in range(n):
        level = levels[index % len(levels)]
        # A string seed goes through sha512 in `random`, so it is stable across processes.
        rng = random.Random(f"{family}|{seed}|{split}|{level}|{index}")
        draft = _draw(spec, rng, level, split, seen)
        seen.add(draft.key)
        extra: dict[str, Any] = {"limits": draft.limits} if draft.limits is not None else {}
        if draft.files or draft.tools or draft.max_steps != 1:
            extra.update(files=draft.files, tools=draft.tools, max_steps=draft.max_steps)
        tasks.append(
            Task(
                id=f"{family}/{split}-{index:05d}",
                domain=spec.domain,
                prompt=draft.prompt,
                verifier=draft.verifier,
                tests=draft.tests,
                reference=draft.reference,
                split=split,
                metadata={"difficulty": level, "family": family, "key": draft.key, **draft.metadata},
                **extra,
            )
        )
    return tasks
