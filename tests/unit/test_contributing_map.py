"""CONTRIBUTING.md maps every folder of src/tidal: one row of its table each, and every
subpackage named somewhere on the page, so that a folder added without a row fails here."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "tidal"
MAP = ROOT / "CONTRIBUTING.md"


def _folders(parent: Path) -> list[Path]:
    return sorted(p for p in parent.iterdir() if p.is_dir() and not p.name.startswith((".", "_")))


def test_every_folder_of_the_package_has_a_row() -> None:
    text = MAP.read_text()
    rows = set(re.findall(r"^\| `([a-z_]+)/` \|", text, re.MULTILINE))
    missing = [p.name for p in _folders(PACKAGE) if p.name not in rows]
    assert not missing, f"CONTRIBUTING.md's table has no row `| \\`NAME/\\` | ... |` for src/tidal/{missing}: add one"
    stale = sorted(rows - {p.name for p in _folders(PACKAGE)})
    assert not stale, f"CONTRIBUTING.md maps folders that are gone: {stale}"


def test_every_subpackage_is_named() -> None:
    text = MAP.read_text()
    missing = [f"{p.parent.name}/{p.name}/" for top in _folders(PACKAGE) for p in _folders(top)
               if (p / "__init__.py").exists() and f"{p.parent.name}/{p.name}/" not in text]
    assert not missing, f"CONTRIBUTING.md does not name the subpackages {missing} of src/tidal"
