"""constraints.txt, the versions CI ran with that scripts/setup.sh installs through: every line
parses, it pins every dependency pyproject.toml names (and the extras setup.sh installs) within
pyproject's ranges, pins torch at 2.13.0 and never tidal itself, and this environment (made by
setup.sh) holds exactly the pinned versions."""

from __future__ import annotations

import importlib.util
import re
from importlib import metadata
from pathlib import Path

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

tomllib = pytest.importorskip("tomllib")  # Python 3.11+, as CI's environment and the generator
ROOT = Path(__file__).resolve().parents[2]
_SPEC = importlib.util.spec_from_file_location("tidal_scripts_constraints", ROOT / "scripts" / "constraints.py")
assert _SPEC is not None and _SPEC.loader is not None
constraints = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(constraints)


def _pins() -> dict[str, Requirement]:
    pins = {}
    for line in (ROOT / "constraints.txt").read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.startswith("#"):
            requirement = Requirement(line)
            assert not requirement.extras and len(requirement.specifier) == 1, line
            [spec] = requirement.specifier
            assert spec.operator == "==" and "+" not in spec.version, f"{line}: an exact public version"
            assert canonicalize_name(requirement.name) not in pins, f"{requirement.name} pinned twice"
            pins[canonicalize_name(requirement.name)] = requirement
    return pins


def _applies(requirement: Requirement) -> bool:
    return requirement.marker is None or requirement.marker.evaluate(default_environment())


def test_every_dependency_is_pinned_within_pyproject_ranges() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    pins = _pins()
    assert "tidal" not in pins  # tidal is this folder, installed editable
    assert str(pins["torch"].specifier) == "==2.13.0"
    wanted = list(project["dependencies"])
    for extra in constraints.EXTRAS:
        wanted += project["optional-dependencies"][extra]
    setup = (ROOT / "scripts/setup.sh").read_text(encoding="utf-8")
    assert f"-e '.[{','.join(constraints.EXTRAS)}]'" in setup and setup.count("-c constraints.txt") == 2
    for text in wanted:
        required = Requirement(text)
        pin = pins.get(canonicalize_name(required.name))
        assert pin is not None, f"{required.name} (pyproject.toml) is not in constraints.txt"
        if _applies(pin):
            [spec] = pin.specifier
            assert required.specifier.contains(Version(spec.version), prereleases=True), \
                f"constraints.txt pins {pin} outside pyproject.toml's {text}"


def test_this_environment_holds_the_pinned_versions() -> None:
    wrong = []
    for name, pin in _pins().items():
        if not _applies(pin):
            continue
        [spec] = pin.specifier
        try:
            installed = metadata.version(name)
        except metadata.PackageNotFoundError:
            wrong.append(f"{name}: not installed")
            continue
        if Version(Version(installed).public) != Version(spec.version):
            wrong.append(f"{name}: {installed} installed, {spec.version} pinned")
    assert not wrong, ("this environment is not what constraints.txt pins (run scripts/setup.sh, or after an "
                       "upgrade on purpose `python scripts/constraints.py`): " + "; ".join(wrong))


def test_the_generator_writes_what_is_committed() -> None:
    strip = lambda text: [line for line in text.splitlines() if not re.match("#", line)]
    assert strip(constraints.render()) == strip((ROOT / "constraints.txt").read_text(encoding="utf-8"))
