"""Before a Ray run scores anything, every scorer node says what it can score: a node without
bubblewrap is reported at start, and an image the run's tasks need is built there from its spec."""

from __future__ import annotations

from importlib import metadata
from pathlib import Path

import pytest

from tidal.pipeline.backends import BackendUnavailableError
from tidal.pipeline.backends import ray_scorer
from tidal.pipeline.backends.ray import check_scorer_nodes
from tidal.reward.registry import needs_sandbox
from tidal.sandbox.image import IMAGES_ENV, find_image, load_spec


def _spec(tmp_path: Path, flavour: str = "yaml"):  # noqa: ANN202 - an ImageSpec
    path = tmp_path / "with-yaml.yaml"
    path.write_text(f"name: with-yaml\npackages: ['PyYAML=={metadata.version('PyYAML')}']\n"
                    f"env: {{IMAGE_FLAVOUR: {flavour}}}\n")
    return load_spec(path)


def test_a_node_without_bubblewrap_is_reported_before_scoring(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ray_scorer.shutil, "which", lambda name: None)
    report = ray_scorer.node_preflight([], sandboxed=True)
    assert report["bwrap"] is None and "no bubblewrap" in report["problems"][0]
    with pytest.raises(BackendUnavailableError, match=rf"scorer 0 on {report['host']} \(pid \d+\): no bubblewrap"):
        check_scorer_nodes([report])
    assert ray_scorer.node_preflight([], sandboxed=False)["problems"] == []  # text-only runs need no sandbox


def test_a_missing_image_is_built_on_the_node_from_its_spec(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = _spec(tmp_path)
    node = tmp_path / "node-images"  # this "node" has never built it
    monkeypatch.setenv(IMAGES_ENV, str(node))
    first = ray_scorer.node_preflight([spec], sandboxed=True)
    assert first["problems"] == [] and first["built"] == ["with-yaml"]
    assert find_image("with-yaml").spec.digest() == spec.digest()
    assert ray_scorer.node_preflight([spec], sandboxed=True)["built"] == []  # built once
    changed = _spec(tmp_path, flavour="other")  # the driver's spec differs from the node's image
    assert ray_scorer.node_preflight([changed], sandboxed=True)["built"] == ["with-yaml"]
    assert find_image("with-yaml").spec.digest() == changed.digest()
    check_scorer_nodes([first])  # no problems: nothing raised


def test_sandboxed_verifiers_are_registered_as_such() -> None:
    assert needs_sandbox("python_tests") and needs_sandbox("program_io") and needs_sandbox("compile")
    assert not needs_sandbox("exact_match") and not needs_sandbox("math") and not needs_sandbox("nosuch")
