"""Environment images: a named, content-hashed Python tree that sandboxes mount read-only as root.

An image is a folder `<root>/<name>-<hash>/` with `python/` (a copy of an interpreter installation
without its site-packages, test suite, IDLE, tkinter or ensurepip, so what a sandbox can import is
exactly the image's), `site/` (the pinned packages and their dependencies) and `manifest.json`
(the spec, hash, resolved versions, interpreter version, machine, and a digest of every file, which
`verify_image` recomputes). The hash covers the spec, the interpreter's full version and the
machine, so changing any of them builds a new image next to the old one. Builds are atomic (a
temporary folder renamed into place: a concurrent build of the same image wins or loses the
rename, never mixes). Packages are copied from this environment when it has exactly the pinned
version installed (offline; that is how the default `python3` image, pinned to the installed
pytest, is built), else installed with `pip install --target`. Only the running interpreter's
major.minor version can be imaged: the spec must name it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tidal.errors import ConfigError, SandboxUnavailableError

log = logging.getLogger(__name__)

DEFAULT_IMAGE = "python3"
DEFAULT_PACKAGES = ("pytest",)  # the default image pins these at the versions installed here
IMAGES_ENV = "TIDAL_IMAGES"  # where images live; default ~/.cache/tidal/images
SKIPPED_STDLIB = {"site-packages", "dist-packages", "test", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3"}
MANIFEST = "manifest.json"
LAYOUT = 3  # the image folder layout; part of the hash, so a layout change rebuilds


def images_root(root: str | Path | None = None) -> Path:
    if root is not None:
        return Path(root)
    if os.environ.get(IMAGES_ENV):
        return Path(os.environ[IMAGES_ENV])
    return Path.home() / ".cache" / "tidal" / "images"


@dataclass(frozen=True)
class ImageSpec:
    """What an image holds. `packages` are exact pins (`name==version`)."""

    name: str
    python: str  # major.minor, e.g. "3.11"
    packages: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()

    def digest(self) -> str:
        payload = {
            "layout": LAYOUT,
            "name": self.name,
            "python": self.python,
            "python_full": platform.python_version(),
            "implementation": sys.implementation.name,
            "machine": platform.machine(),
            "packages": sorted(p.lower() for p in self.packages),
            "env": sorted(self.env),
        }
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()

    @property
    def folder_name(self) -> str:
        return f"{self.name}-{self.digest()[:12]}"


def default_spec() -> ImageSpec:
    """The `python3` image: this interpreter plus pytest (and its dependencies) as installed."""
    import importlib.metadata as metadata

    pins = []
    for name in DEFAULT_PACKAGES:
        try:
            pins.append(f"{name}=={metadata.version(name)}")
        except metadata.PackageNotFoundError as error:
            raise SandboxUnavailableError(f"the default image needs {name}, which is not installed here") from error
    return ImageSpec(DEFAULT_IMAGE, _this_python(), tuple(pins))


def _this_python() -> str:
    return f"{sys.version_info.major}.{sys.version_info.minor}"


def load_spec(path: str | Path) -> ImageSpec:
    """An image spec from YAML: `name`, `python`, `packages` (exact pins), optional `env`."""
    where = str(path)
    try:
        raw = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as error:
        raise ConfigError([f"{where}: cannot read the image spec: {error}"]) from error
    problems: list[str] = []
    if not isinstance(raw, dict):
        raise ConfigError([f"{where}: an image spec is a mapping with name, python and packages"])
    unknown = set(raw) - {"name", "python", "packages", "env"}
    problems += [f"{where}: {key}: unknown field (known: name, python, packages, env)" for key in sorted(unknown)]
    name, python = raw.get("name"), str(raw.get("python", _this_python()))
    if not isinstance(name, str) or not name.replace("-", "").replace("_", "").replace(".", "").isalnum():
        problems.append(f"{where}: name: must be letters, digits, '-', '_' or '.' (got {name!r})")
    packages = raw.get("packages") or []
    if not isinstance(packages, list):
        problems.append(f"{where}: packages: must be a list of pins like 'numpy==2.1.0'")
        packages = []
    for at, pin in enumerate(packages):
        if not isinstance(pin, str) or "==" not in pin or pin.count("==") != 1 or not pin.split("==")[1].strip():
            problems.append(f"{where}: packages[{at}]: {pin!r} is not an exact pin (name==version)")
    env = raw.get("env") or {}
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        problems.append(f"{where}: env: must map names to strings")
        env = {}
    if python != _this_python():
        problems.append(f"{where}: python: only this interpreter's version ({_this_python()}) can be imaged, not {python}")
    if problems:
        raise ConfigError(problems)
    return ImageSpec(str(name), python, tuple(p.replace(" ", "") for p in packages), tuple(sorted(env.items())))


@dataclass
class Image:
    """A built image on disk."""

    spec: ImageSpec
    path: Path
    manifest: dict[str, Any] = field(default_factory=dict)

    @property
    def python_root(self) -> Path:
        return self.path / "python"

    @property
    def site(self) -> Path:
        return self.path / "site"

    @property
    def executable(self) -> str:
        """The interpreter, relative to `python_root`."""
        return str(self.manifest["executable"])

    @property
    def needs_libpython(self) -> bool:
        return bool(self.manifest.get("libpython"))


def _copy_interpreter(target: Path) -> dict[str, Any]:
    """Copy this interpreter's installation into `target` (see the module docstring)."""
    base = Path(os.path.realpath(sys.base_prefix))
    version = _this_python()
    binary = base / "bin" / f"python{version}"  # the installation's interpreter, also under a venv
    if not binary.exists():
        binary = Path(os.path.realpath(sys.executable))
    stdlib = base / "lib" / f"python{version}"
    if not (stdlib / "os.py").exists():
        raise SandboxUnavailableError(f"cannot find the standard library of {binary} at {stdlib}")
    (target / "bin").mkdir(parents=True)
    shutil.copy2(binary, target / "bin" / f"python{version}")
    for alias in ("python3", "python"):  # so `python3 ...` finds the image's interpreter on PATH
        (target / "bin" / alias).symlink_to(f"python{version}")

    def skip(folder: str, names: list[str]) -> set[str]:
        if Path(folder) == stdlib:
            return {n for n in names if n in SKIPPED_STDLIB or n.startswith("config-")}
        return set()

    shutil.copytree(stdlib, target / "lib" / f"python{version}", ignore=skip, symlinks=True)
    libpython = sorted((base / "lib").glob("libpython*.so*"))
    for library in libpython:
        shutil.copy2(library, target / "lib" / library.name, follow_symlinks=False)
    return {"executable": f"bin/python{version}", "libpython": bool(libpython), "source": str(base)}


def _requirement_names(requires: list[str] | None) -> list[str]:
    """Names of the requirements that apply here (extras and foreign platforms left out)."""
    try:
        from packaging.requirements import Requirement
    except ImportError:  # pragma: no cover - packaging ships with pytest
        Requirement = None  # type: ignore[assignment,misc]
    names = []
    for text in requires or []:
        if Requirement is not None:
            requirement = Requirement(text)
            if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
                continue
            names.append(requirement.name)
        elif "extra ==" not in text:
            match = re.match(r"[A-Za-z0-9._-]+", text)
            if match:
                names.append(match.group(0))
    return names


def _installed_files(pin: str) -> tuple[list[tuple[Path, str]], list[str]] | None:
    """(host file, path under site) for `pin` and its dependencies when this environment has
    exactly that version installed; None when it does not (pip must fetch it)."""
    import importlib.metadata as metadata

    name, version = pin.split("==")
    try:
        if metadata.version(name) != version:
            return None
    except metadata.PackageNotFoundError:
        return None
    files: list[tuple[Path, str]] = []
    seen: set[str] = set()
    pending, resolved = [name], []
    while pending:
        current = pending.pop()
        key = current.lower().replace("_", "-")
        if key in seen:
            continue
        seen.add(key)
        try:
            dist = metadata.distribution(current)
        except metadata.PackageNotFoundError:
            return None
        resolved.append(f"{dist.metadata['Name']}=={dist.version}")
        pending.extend(_requirement_names(dist.requires))
        site = Path(str(dist.locate_file("")))
        for file in dist.files or []:
            relative = str(file)
            if relative.startswith("..") or relative.endswith(".pth") or "__pycache__" in file.parts:
                continue
            host = site / relative
            if host.is_file():
                files.append((host, relative))
    return files, resolved


def _install_packages(spec: ImageSpec, site: Path) -> None:
    to_fetch = []
    for pin in spec.packages:
        local = _installed_files(pin)
        if local is None:
            to_fetch.append(pin)
            continue
        for host, relative in local[0]:
            destination = site / relative
            destination.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(host, destination)
    if to_fetch:
        command = [sys.executable, "-m", "pip", "install", "--quiet", "--no-input", "--disable-pip-version-check",
                   "--no-compile", "--target", str(site), *to_fetch]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            raise SandboxUnavailableError(
                f"image {spec.name}: pip could not install {', '.join(to_fetch)}: {done.stderr.strip()[-2000:]}"
            )


def _compile(work: Path) -> None:
    """Byte-compile the packages (and any stdlib module without a cached .pyc) as they will be
    seen inside the sandbox: the image is read-only there and runs with -B, so a module without a
    .pyc would be compiled again by every process that imports it."""
    import compileall

    targets = [(work / "site", "/opt/tidal/site")]
    targets += [(lib, f"/opt/tidal/python/lib/{lib.name}") for lib in (work / "python" / "lib").glob("python3*")]
    for folder, inside in targets:
        compileall.compile_dir(str(folder), ddir=inside, quiet=2, workers=1)


def _tree_digest(root: Path) -> str:
    digest = hashlib.sha256()
    for folder, dirs, names in os.walk(root):
        dirs.sort()
        for name in sorted(names):
            path = Path(folder, name)
            relative = path.relative_to(root).as_posix()
            if relative == MANIFEST:
                continue
            digest.update(relative.encode() + b"\0")
            if path.is_symlink():
                digest.update(b"link:" + os.readlink(path).encode())
            else:
                with path.open("rb") as handle:
                    for chunk in iter(lambda: handle.read(1 << 20), b""):
                        digest.update(chunk)
            digest.update(b"\0")
    return digest.hexdigest()


def _resolved_packages(site: Path) -> dict[str, str]:
    found = {}
    for info in site.glob("*.dist-info"):
        stem = info.name[: -len(".dist-info")]
        name, _, version = stem.partition("-")
        found[name] = version
    return dict(sorted(found.items()))


def build_image(spec: ImageSpec, root: str | Path | None = None, force: bool = False) -> Image:
    """Build `spec` under `root` (or find it built); returns the image."""
    base = images_root(root)
    target = base / spec.folder_name
    if not force:
        existing = _load(target, spec)
        if existing is not None:
            return existing
    base.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix=f".{spec.name}-building-", dir=base))
    try:
        interpreter = _copy_interpreter(work / "python")
        (work / "site").mkdir()
        _install_packages(spec, work / "site")
        _compile(work)
        for folder, dirs, names in os.walk(work):
            for entry in dirs + names:
                path = os.path.join(folder, entry)
                if not os.path.islink(path):
                    os.chmod(path, os.stat(path).st_mode | 0o444 | (0o111 if os.path.isdir(path) else 0))
        manifest = {
            "name": spec.name,
            "hash": spec.digest(),
            "spec": {"python": spec.python, "packages": list(spec.packages), "env": dict(spec.env)},
            "python_full": platform.python_version(),
            "machine": platform.machine(),
            "packages": _resolved_packages(work / "site"),
            **interpreter,
            "tree_sha256": _tree_digest(work),
            "build_s": round(time.monotonic() - started, 2),
        }
        (work / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True))
        os.chmod(work, 0o755)
        if force and target.exists():
            shutil.rmtree(target)
        try:
            os.rename(work, target)
        except OSError:
            if _load(target, spec) is None:  # someone else's build won the race only if it is whole
                raise
        (base / f"{spec.name}.json").write_text(json.dumps({"folder": spec.folder_name, "spec": manifest["spec"]}))
        log.info("built image %s at %s in %.1fs", spec.name, target, manifest["build_s"])
    finally:
        if work.exists():
            shutil.rmtree(work, ignore_errors=True)
    image = _load(target, spec)
    if image is None:
        raise SandboxUnavailableError(f"image {spec.name} at {target} is incomplete after its build")
    return image


def _load(path: Path, spec: ImageSpec) -> Image | None:
    try:
        manifest = json.loads((path / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    if manifest.get("hash") != spec.digest():
        return None
    return Image(spec, path, manifest)


def find_image(name: str, root: str | Path | None = None) -> Image:
    """The image called `name`: the default `python3` is built on first use; any other must have
    been built with `tidal image build` (SandboxUnavailableError otherwise)."""
    if name == DEFAULT_IMAGE:
        return build_image(default_spec(), root)
    base = images_root(root)
    spec, folder = _pointer(name, base)
    image = _load(base / folder, spec)
    if image is None:
        raise SandboxUnavailableError(
            f"image {name!r} at {base / pointer['folder']} is missing or was built for another interpreter; rebuild it"
        )
    return image


def _pointer(name: str, base: Path) -> tuple[ImageSpec, str]:
    """The spec and folder of image `name` as built under `base` (SandboxUnavailableError if never built)."""
    try:
        pointer = json.loads((base / f"{name}.json").read_text())
        spec_raw = pointer["spec"]
        spec = ImageSpec(name, spec_raw["python"], tuple(spec_raw["packages"]), tuple(sorted(spec_raw["env"].items())))
        return spec, str(pointer["folder"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
        raise SandboxUnavailableError(
            f"image {name!r} is not built in {base}; build it with `tidal image build SPEC.yaml` "
            f"(images there: {', '.join(sorted(p.stem for p in base.glob('*.json'))) or 'none'})"
        ) from error


def image_spec(name: str, root: str | Path | None = None) -> ImageSpec:
    """The spec of image `name` (the default's, or the one it was built from here): what another
    machine needs to build the same image."""
    return default_spec() if name == DEFAULT_IMAGE else _pointer(name, images_root(root))[0]


def verify_image(image: Image) -> bool:
    """Whether the files on disk are still the ones the manifest recorded."""
    return _tree_digest(image.path) == image.manifest.get("tree_sha256")


def list_images(root: str | Path | None = None) -> list[dict[str, Any]]:
    found = []
    for manifest_path in sorted(images_root(root).glob(f"*/{MANIFEST}")):
        try:
            manifest = json.loads(manifest_path.read_text())
        except (OSError, ValueError):
            continue
        found.append({"name": manifest.get("name"), "path": str(manifest_path.parent), "hash": manifest.get("hash", "")[:12],
                      "python": manifest.get("python_full"), "packages": manifest.get("packages", {})})
    return found
