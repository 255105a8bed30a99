"""The sandbox side of a plain reward function (reward/function.py): import the user's file, call
its function on the task and the answer, send the result back over the report channel.

Not imported by tidal: shipped as a harness file and run with the sandbox's own interpreter, so
standard library only. The user's file is a harness file too (read-only, beside this one) and
keeps its line numbers; a small stand-in `tidal` package (`tidal.reward.reward_function`,
`tidal.types.Score`/`Outcome`) lets it import what a reward file needs. The job (task, answer,
file, function name) arrives on the report channel, never as a file the process could rewrite.
The reply is one JSON object: {"value", "outcome", ...} or {"error", "type", "file", "line"}.
"""

import json
import math
import os
import socket
import sys
import traceback


class View:
    """A task as attributes (`task.id`, `task.metadata`, `task.verifier.args`), from its JSON."""

    def __init__(self, data):
        for key, value in data.items():
            setattr(self, key, View(value) if isinstance(value, dict) and key == "verifier" else value)

    def __repr__(self):
        return f"View({vars(self)!r})"


def _channel():
    fd = int(os.environ.pop("TIDAL_REPORT_FD"))
    channel = socket.socket(fileno=fd)
    chunks = []
    while True:
        chunk = channel.recv(65536)
        if not chunk:
            break
        chunks.append(chunk)
    return channel, json.loads(b"".join(chunks))


def _located(error, path):
    frames = [f for f in traceback.extract_tb(error.__traceback__) if os.path.abspath(f.filename) == path]
    if isinstance(error, SyntaxError) and error.filename and os.path.abspath(error.filename) == path:
        return error.lineno
    return frames[-1].lineno if frames else None


def _result(value):
    if isinstance(value, bool):
        return {"value": float(value)}
    if isinstance(value, (int, float)):
        return {"value": float(value)} if math.isfinite(value) else {"error": f"returned {value!r}", "type": "ValueError"}
    fields = ("value", "outcome", "components", "detail", "info")
    if all(hasattr(value, f) for f in fields[:2]):
        outcome = getattr(value.outcome, "value", value.outcome)
        return {f: getattr(value, f, None) for f in fields} | {"outcome": str(outcome)}
    return {"error": f"returned a {type(value).__name__}, not a float or a Score", "type": "TypeError"}


def main():
    channel, job = _channel()
    harness = os.environ["TIDAL_HARNESS"]
    # -I leaves PYTHONPATH out: put back the harness folder (the stand-in tidal) and the image's
    # packages it names, and nothing else (no working directory, no user site).
    sys.path[:0] = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p] or [harness]
    path = os.path.abspath(os.path.join(harness, job["file"]))
    try:
        import importlib.util

        spec = importlib.util.spec_from_file_location("user_reward", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules["user_reward"] = module
        spec.loader.exec_module(module)
        function = getattr(module, job["function"])
        reply = _result(function(View(job["task"]), job["answer"]))
    except BaseException as error:  # the user's code: anything it raises is reported, never a 0
        reply = {"error": str(error)[:2000], "type": type(error).__name__, "line": _located(error, path),
                 "traceback": traceback.format_exc()[-3000:]}
    try:
        payload = json.dumps(reply, default=str)
    except (TypeError, ValueError) as error:
        payload = json.dumps({"error": f"the result cannot be sent back: {error}", "type": "TypeError"})
    channel.sendall(payload.encode("utf-8"))
    channel.close()


SHIM_TYPES = '''"""Stand-in for tidal.types inside the sandbox: Score and Outcome only."""
import enum
from dataclasses import dataclass, field


class Outcome(str, enum.Enum):
    PASSED = "passed"
    FAILED = "failed"
    TIMEOUT = "timeout"
    MEMORY_LIMIT = "memory_limit"
    CRASHED = "crashed"
    TAMPERED = "tampered"
    INFRA_ERROR = "infra_error"


@dataclass
class Score:
    value: float
    outcome: Outcome
    components: dict = field(default_factory=dict)
    detail: str = ""
    info: dict = field(default_factory=dict)
'''

SHIM_REWARD = '''"""Stand-in for tidal.reward inside the sandbox: the decorators register nothing here."""
from tidal.types import Outcome, Score


def reward_function(name=None, **options):
    if callable(name):
        return name
    return lambda function: function


def verifier(name, **options):
    return lambda function: function
'''

if __name__ == "__main__":
    main()
