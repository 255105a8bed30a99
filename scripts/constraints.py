"""Write constraints.txt: the exact versions of tidal's dependencies in this environment.

    .venv/bin/python scripts/constraints.py            # rewrite constraints.txt from .venv
    .venv/bin/python scripts/constraints.py --check    # exit 1 when constraints.txt is out of date

pyproject.toml states what tidal works with (ranges); constraints.txt states what CI ran with
(pins), and scripts/setup.sh installs through it (`pip install -c constraints.txt`), so the README's
two commands install the same versions on every machine: transformers moved from 5.24 to 5.25
between two runs of the same job before this file existed. After upgrading a dependency on
purpose, rerun this script and commit the file with the change.

What is pinned: the installed distributions that tidal (pyproject.toml) and the extras `setup.sh`
installs (`EXTRAS`) require, transitively, by their metadata; not tidal itself (an editable install of this
folder) and nothing else that happens to be in the environment. Local version labels are dropped
(torch's `+cpu`: `torch==2.13.0` is what PyPI knows, and it matches the local CPU build). A
release that does not support every Python tidal supports (`requires-python`) is pinned only for
the Pythons it does, by an environment marker; older Pythons resolve within pyproject's ranges.
"""

from __future__ import annotations

import argparse
import re
import sys
from importlib import metadata
from pathlib import Path

import tomllib
from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
OUTPUT = ROOT / "constraints.txt"
PACKAGE = "tidal"
EXTRAS = ("ray", "telemetry", "browser", "data")  # what scripts/setup.sh installs
PYTHONS = [f"3.{minor}" for minor in range(10, 15)]  # the Pythons tidal supports (requires-python >= 3.10)


def _wanted(requirement: Requirement, extras: set[str]) -> bool:
    """Whether `requirement` applies here with one of `extras` asked for (or none)."""
    if requirement.marker is None:
        return True
    return any(requirement.marker.evaluate({"extra": extra}) for extra in extras | {""})


def own_requirements(extras: tuple[str, ...]) -> list[Requirement]:
    """tidal's requirements with `extras`, from pyproject.toml (the installed metadata of an
    editable install can be older than the file)."""

    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    texts = list(project["dependencies"])
    for extra in extras:
        texts += project["optional-dependencies"][extra]
    return [Requirement(text) for text in texts]


def closure(extras: tuple[str, ...]) -> dict[str, metadata.Distribution]:
    """The installed distributions tidal with `extras` needs, transitively, by canonical name
    (tidal itself left out). A requirement that is not installed is an error: the environment
    does not hold what it should."""
    found: dict[str, metadata.Distribution] = {}
    todo = [(r.name, set(r.extras)) for r in own_requirements(extras) if r.marker is None or r.marker.evaluate()]
    seen: set[tuple[str, frozenset[str]]] = set()
    while todo:
        name, asked = todo.pop()
        key = (canonicalize_name(name), frozenset(asked))
        if key in seen:
            continue
        seen.add(key)
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            raise SystemExit(f"{name} is required (by {PACKAGE}'s dependencies) but not installed; run scripts/setup.sh")
        found[key[0]] = dist
        for text in dist.requires or []:
            requirement = Requirement(text)
            if _wanted(requirement, asked):
                todo.append((requirement.name, set(requirement.extras)))
    return found


def _public(version: str) -> str:
    return Version(version).public  # 2.13.0+cpu -> 2.13.0


def _python_marker(dist: metadata.Distribution) -> str:
    """An environment marker limiting the pin to the Pythons the release supports ('' for all)."""
    requires = dist.metadata.get("Requires-Python")
    if not requires:
        return ""
    specifier = SpecifierSet(requires)
    supported = [python for python in PYTHONS if specifier.contains(f"{python}.0", prereleases=True)]
    if supported == PYTHONS:
        return ""
    if not supported:
        return f'python_version < "{PYTHONS[0]}"'  # none of ours: effectively never pinned
    if supported == PYTHONS[PYTHONS.index(supported[0]):]:
        return f'python_version >= "{supported[0]}"'
    return " or ".join(f'python_version == "{python}"' for python in supported)


def render() -> str:
    lines = [
        "# The versions CI ran with: scripts/setup.sh installs through this file (pip install -c).",
        (f"# Made by `python scripts/constraints.py` from an environment of Python "
         f"{sys.version_info.major}.{sys.version_info.minor}; pyproject.toml keeps the ranges."),
        f"# {PACKAGE}[{','.join(EXTRAS)}] and what it needs, transitively; {PACKAGE} itself is this folder.",
    ]
    for name, dist in sorted(closure(EXTRAS).items()):
        marker = _python_marker(dist)
        if marker:
            Marker(marker)  # a marker pip could not read fails here, not at install
        lines.append(f"{name}=={_public(dist.version)}" + (f"; {marker}" if marker else ""))
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when constraints.txt differs from this environment")
    args = parser.parse_args()
    text = render()
    if args.check:
        current = OUTPUT.read_text(encoding="utf-8") if OUTPUT.is_file() else ""
        strip = lambda t: [line for line in t.splitlines() if not re.match(r"#", line)]
        if strip(current) != strip(text):
            print(f"{OUTPUT} is out of date with this environment; run python scripts/constraints.py", file=sys.stderr)
            return 1
        return 0
    OUTPUT.write_text(text, encoding="utf-8")
    print(f"wrote {OUTPUT} ({len(text.splitlines()) - 3} pins)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
