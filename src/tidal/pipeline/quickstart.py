"""The main job, `tidal quickstart`: the demo's config (configs/quickstart.yaml, or smoke.yaml for
a seconds-long run) run as any training run (pipeline/run.py), and a summary of its result."""

from __future__ import annotations

import json
import os
from pathlib import Path

from tidal.config import load_config
from tidal.errors import ConfigError
from tidal.pipeline.run import Job, start_run


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


def run_quickstart(config: Path | None, overrides: list[str], out: Path, name: str | None, smoke: bool = False) -> Path:
    """Run the demo in a new run folder under `out`; returns its report.html."""
    cfg = load_config(config or find_config("smoke" if smoke else "quickstart"), overrides)
    job = Job(cfg, start_run(cfg, out, name))
    report = job.execute()
    for line in summary_lines(job.run.summary_path):
        print(line)
    return report
