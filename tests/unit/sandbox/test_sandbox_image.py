"""Environment images: specs, content hashes, builds, reuse, verification, and what a sandbox sees."""

from __future__ import annotations

import importlib.metadata as metadata
from pathlib import Path

import pytest

from tidal.errors import ConfigError, SandboxUnavailableError
from tidal.sandbox import SandboxStatus, get_backend
from tidal.sandbox.image import ImageSpec, build_image, default_spec, find_image, list_images, load_spec, verify_image
from tidal.types import Limits


def test_spec_errors_are_all_reported_with_the_file(tmp_path: Path) -> None:
    spec = tmp_path / "bad.yaml"
    spec.write_text("name: 'has space'\npython: '2.7'\npackages: [numpy, 'x==']\ncolour: red\n")
    with pytest.raises(ConfigError) as caught:
        load_spec(spec)
    text = str(caught.value)
    for needle in ("colour: unknown field", "name: must be", "packages[0]: 'numpy' is not an exact pin",
                   "packages[1]", "python: only this interpreter's version"):
        assert needle in text, needle
    assert str(spec) in text


def test_hash_follows_the_spec() -> None:
    one = ImageSpec("a", "3.11", ("x==1",))
    assert one.digest() == ImageSpec("a", "3.11", ("X==1",)).digest()
    assert one.digest() != ImageSpec("a", "3.11", ("x==2",)).digest()
    assert one.digest() != ImageSpec("a", "3.11", ("x==1",), (("K", "v"),)).digest()
    assert default_spec().packages == (f"pytest=={metadata.version('pytest')}",)


@pytest.fixture(scope="module")
def yaml_image(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """An image holding PyYAML (installed here, so built offline) and its environment variable."""
    root = tmp_path_factory.mktemp("images")
    spec = root / "with-yaml.yaml"
    spec.write_text(f"name: with-yaml\npackages: ['PyYAML=={metadata.version('PyYAML')}']\nenv: {{IMAGE_FLAVOUR: yaml}}\n")
    return root, spec


def test_build_reuse_verify_and_list(yaml_image: tuple[Path, Path]) -> None:
    root, spec_file = yaml_image
    spec = load_spec(spec_file)
    image = build_image(spec, root)
    assert (image.python_root / image.executable).exists()
    assert (image.python_root / "bin" / "python3").is_symlink()
    assert image.manifest["packages"].get("pyyaml") == metadata.version("PyYAML")
    assert not list(image.python_root.glob("lib/python*/site-packages"))
    assert not list(image.python_root.glob("lib/python*/test"))
    again = build_image(spec, root)
    assert again.path == image.path and again.manifest["tree_sha256"] == image.manifest["tree_sha256"]
    assert find_image("with-yaml", root).path == image.path
    assert verify_image(image)
    assert [entry["name"] for entry in list_images(root)] == ["with-yaml"]
    victim = next(image.site.rglob("*.py"))
    victim.chmod(0o644)
    victim.write_text(victim.read_text() + "\n# changed\n")
    assert not verify_image(image)
    rebuilt = build_image(spec, root, force=True)
    assert verify_image(rebuilt)


def test_missing_image_says_how_to_build_it(tmp_path: Path) -> None:
    with pytest.raises(SandboxUnavailableError, match="tidal image build"):
        find_image("nope", tmp_path)


def test_sandbox_sees_only_its_image(yaml_image: tuple[Path, Path]) -> None:
    root, spec_file = yaml_image
    build_image(load_spec(spec_file), root)
    code = ("import os,sys\ntry:\n import yaml;print('yaml')\nexcept ImportError:\n print('no yaml')\n"
            "try:\n import numpy\nexcept ImportError:\n print('no numpy')\nprint(os.environ.get('IMAGE_FLAVOUR'))")
    with_yaml = get_backend("bwrap", image="with-yaml", image_root=str(root))
    result = with_yaml.run(["python3", "-c", code], {}, Limits(timeout_s=20))
    assert result.status == SandboxStatus.OK, result.stderr
    assert result.stdout.split() == [b"yaml", b"no", b"numpy", b"yaml"]
    default = get_backend("bwrap")
    result = default.run(["python3", "-c", code], {}, Limits(timeout_s=20))
    assert result.stdout.split() == [b"no", b"yaml", b"no", b"numpy", b"None"]


def test_hash_seed_is_a_knob() -> None:
    code = "print(hash('tidal'))"
    seeds = {}
    for seed in (0, 0, 7):
        backend = get_backend("bwrap", hash_seed=seed)
        seeds.setdefault(seed, set()).add(backend.run(["python3", "-c", code], {}, Limits(timeout_s=20)).stdout)
    assert len(seeds[0]) == 1 and seeds[0] != seeds[7]
