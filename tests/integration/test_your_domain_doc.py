"""docs/your_domain.md runs as written: its blocks, in order, become one bash script (a block
with `file=NAME` writes that file, a `bash` block is run) that a fresh folder executes with the
real `tidal` command: validate, train the tiny model, evaluate the oracle and the trained policy.

The script is made from the page's text at test time, so an edit to the page is what is tested.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "your_domain.md"
FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```\s*$", re.S | re.M)
SHOWN_ONLY = ("toml",)  # snippets of other projects' files (a package's pyproject.toml), not run
HEREDOC = "TIDAL_DOC_EOF"


def doc_script(text: str) -> str:
    """The page's blocks as one bash script, in the page's order."""
    lines = ["set -euo pipefail"]
    for info, body in FENCE.findall(text):
        words = info.split()
        language = words[0] if words else ""
        target = next((w.split("=", 1)[1] for w in words[1:] if w.startswith("file=")), None)
        if target is not None:
            if HEREDOC in body:
                raise ValueError(f"block for {target} contains the heredoc marker")
            lines += [f"cat > {target} <<'{HEREDOC}'", body.rstrip("\n"), HEREDOC]
        elif language == "bash":
            lines += [f"echo '+ block {len(lines)}'", body.rstrip("\n")]
        elif language not in SHOWN_ONLY:
            raise ValueError(f"a ```{info} block is neither a file=NAME, a bash block nor one of {SHOWN_ONLY}")
    return "\n".join(lines) + "\n"


def test_the_script_has_every_file_and_command_of_the_page() -> None:
    text = DOC.read_text(encoding="utf-8")
    script = doc_script(text)
    for name in ("units.jsonl", "units_reward.py", "units.yaml", "eval_units.yaml"):
        assert f"cat > {name} <<" in script
    for command in ("tidal tasks validate", "tidal train units.yaml", "tidal eval --model oracle", 'tidal eval --model "$POLICY"'):
        assert command in script
    assert script.count("cat > ") + script.count("+ block") == len(FENCE.findall(text)) - sum(
        info.split()[0] in SHOWN_ONLY for info, _ in FENCE.findall(text) if info.split())
    with pytest.raises(ValueError, match="neither"):
        doc_script("```python\nprint('unnamed')\n```\n")


def test_the_tutorial_runs_as_written(tmp_path: Path) -> None:
    script = tmp_path / "your_domain.sh"
    script.write_text(doc_script(DOC.read_text(encoding="utf-8")))
    work = tmp_path / "work"
    work.mkdir()
    bin_dir = str(Path(sys.executable).parent)  # the `tidal` and `python` of this environment
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
           "PYTHONPATH": str(ROOT / "src"), "HF_HUB_OFFLINE": "1"}
    env.pop("TIDAL_IMPORTS", None)
    result = subprocess.run(["bash", str(script)], cwd=work, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, f"{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
    assert "ok: 8 tasks (units: 8)" in result.stdout
    assert "{'oracle': 1.0, 'trained': 0.0}" in result.stdout  # the oracle passes all, the 2-step tiny model none
    assert (work / "runs" / "units" / "report.html").is_file()
    saved = (work / "runs" / "units" / "config.yaml").read_text()
    assert str((work / "units_reward.py").resolve()) in saved  # the run's config imports it from anywhere
