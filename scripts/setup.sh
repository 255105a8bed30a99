#!/usr/bin/env bash
# Set up a virtual environment in .venv with tidal and its dependencies, at the versions CI ran
# with: every install goes through constraints.txt (pins made by scripts/constraints.py from CI's
# environment), while pyproject.toml keeps ranges for those who install tidal into their own.
# torch is pinned to 2.13.0, the CPU build on this machine's disk (an unpinned torch pulls a
# multi-GB CUDA build). TIDAL_VENV=DIR sets up DIR instead of .venv (a throwaway check).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v bwrap >/dev/null 2>&1; then
    echo "installing bubblewrap (the sandbox for model-written code)" >&2
    if [ "$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq bubblewrap
    else sudo apt-get update -qq && sudo apt-get install -y -qq bubblewrap; fi
fi
venv="${TIDAL_VENV:-.venv}"
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/python" -m pip install -q --upgrade pip >/dev/null
"$venv/bin/python" -m pip install -q -c constraints.txt torch==2.13.0
# The `ray` extra: the async loop's Ray backend, which the tests run on a local Ray cluster.
# The `telemetry` extra: the W&B and MLflow sinks, whose offline and file modes the tests run.
# The `browser` extra: playwright, which the dashboard and report tests drive Debian's chromium with.
# The `data` extra: `datasets`, which reads saved dataset folders for `tidal tasks import` (and its tests).
# (scripts/constraints.py's EXTRAS: the extras whose dependencies constraints.txt pins.)
"$venv/bin/python" -m pip install -q -c constraints.txt -e '.[ray,telemetry,browser,data]'
