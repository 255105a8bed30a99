"""Agent tools: `bash`, `python`, `read_file`, `write_file`, `submit`, and the registry users extend.

A tool is a function `(ToolContext, arguments) -> ToolOutput` registered with
`@tool(name, description, parameters)`, where `parameters` is the JSON schema of its arguments;
`tool_schemas` returns the OpenAI-style declarations (`{"type": "function", "function": ...}`)
the policy shows the model. Arguments are checked against the schema before the tool runs
(`check_arguments`: the subset of JSON Schema tools need: object, properties of type string,
integer, number, boolean, array or object, `required`, `additionalProperties: false`, `enum`,
`maxLength`), so a tool body only ever sees well-typed arguments.

Every command runs in a fresh sandbox over the session's workspace (`SandboxSession.exec`): files
persist between calls, processes do not; its time limit is its own, cut to what is left of the
episode's wall time (`ToolContext.command_timeout`), and it is killed at it. A tool's own failure (a command that exits 1, a file
that does not exist) is a normal `ToolOutput` with `ok=False`: the model reads it and carries on.
Only a sandbox that cannot start raises (`SandboxUnavailableError`), which the runner turns into
an infra error.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tidal.errors import UnknownNameError
from tidal.sandbox.base import SandboxStatus
from tidal.sandbox.session import SandboxSession

MAX_WRITE_BYTES = 1 << 20  # write_file content
MAX_READ_BYTES = 256 * 1024  # read_file returns at most this much (the context policy cuts further)
MAX_CODE_CHARS = 64 * 1024  # bash command / python code
WORKSPACE_PREFIX = "/workspace/"  # the workspace's path inside the bwrap sandbox

_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,), "integer": (int,), "number": (int, float), "boolean": (bool,),
    "array": (list,), "object": (dict,),
}


@dataclass
class ToolContext:
    """What a tool may use: the episode's session and the interpreter path inside the sandbox."""

    session: SandboxSession
    python: str
    timeout_s: float | None = None  # per command; None: the session's limits
    deadline: float | None = None  # time.monotonic() at which the episode's wall time runs out

    def command_timeout(self) -> float:
        """A command's time limit: its own (or the session's), cut to what is left of the episode."""
        own = self.timeout_s if self.timeout_s is not None else self.session.limits.timeout_s
        if self.deadline is None:
            return own
        return max(0.001, min(own, self.deadline - time.monotonic()))


@dataclass
class ToolOutput:
    """A tool's result as the model will read it, plus what the runner needs to know."""

    text: str
    ok: bool = True
    submitted: bool = False  # the episode ends after this call
    answer: str | None = None  # submit's optional final answer
    exit_code: int | None = None


ToolFunction = Callable[[ToolContext, dict[str, Any]], ToolOutput]


@dataclass(frozen=True)
class ToolSpec:
    name: str
    description: str
    parameters: dict[str, Any]  # JSON schema of the arguments (type: object)
    run: ToolFunction

    def schema(self) -> dict[str, Any]:
        """The OpenAI-style declaration."""
        return {"type": "function",
                "function": {"name": self.name, "description": self.description, "parameters": self.parameters}}


TOOLS: dict[str, ToolSpec] = {}
DEFAULT_TOOLS = ("bash", "python", "read_file", "write_file", "submit")


def tool(name: str, description: str, parameters: dict[str, Any]) -> Callable[[ToolFunction], ToolFunction]:
    """Register `fn(ctx, arguments) -> ToolOutput` as the tool `name`."""

    def register(function: ToolFunction) -> ToolFunction:
        if name in TOOLS and TOOLS[name].run is not function:
            raise ValueError(f"tool {name!r} is already registered by {TOOLS[name].run.__module__}")
        if parameters.get("type") != "object":
            raise ValueError(f"tool {name!r}: parameters must be a JSON schema of type object")
        TOOLS[name] = ToolSpec(name, description, parameters, function)
        return function

    return register


def get_tools(names: list[str] | tuple[str, ...]) -> dict[str, ToolSpec]:
    """The specs of `names` (an empty list means the default set); UnknownNameError otherwise."""
    chosen = list(names) or list(DEFAULT_TOOLS)
    unknown = [n for n in chosen if n not in TOOLS]
    if unknown:
        raise UnknownNameError("tool", unknown[0], list(TOOLS))
    if "submit" not in chosen:
        chosen.append("submit")  # every episode needs a way to end
    return {n: TOOLS[n] for n in chosen}


def tool_schemas(tools: dict[str, ToolSpec]) -> list[dict[str, Any]]:
    return [spec.schema() for spec in tools.values()]


def check_arguments(schema: dict[str, Any], arguments: dict[str, Any], where: str = "arguments") -> list[str]:
    """Every way `arguments` breaks `schema` (the subset in the module docstring); [] when it fits."""
    problems: list[str] = []
    expected = schema.get("type")
    if expected in _TYPES:
        allowed = _TYPES[expected]
        # JSON true is a bool, which Python also counts as an int; a schema integer means a number.
        if not isinstance(arguments, allowed) or (isinstance(arguments, bool) and expected != "boolean"):
            return [f"{where}: must be {expected}, got {type(arguments).__name__}"]
    if "enum" in schema and arguments not in schema["enum"]:
        problems.append(f"{where}: must be one of {schema['enum']}")
    if isinstance(arguments, str) and "maxLength" in schema and len(arguments) > schema["maxLength"]:
        problems.append(f"{where}: longer than {schema['maxLength']} characters")
    if isinstance(arguments, dict):
        properties = schema.get("properties", {})
        for name in schema.get("required", []):
            if name not in arguments:
                problems.append(f"{where}.{name}: is required")
        for name, value in arguments.items():
            if name in properties:
                problems += check_arguments(properties[name], value, f"{where}.{name}")
            elif schema.get("additionalProperties", True) is False:
                problems.append(f"{where}.{name}: unknown argument (known: {', '.join(properties) or 'none'})")
    if isinstance(arguments, list) and "items" in schema:
        for index, item in enumerate(arguments):
            problems += check_arguments(schema["items"], item, f"{where}[{index}]")
    return problems


def workspace_path(path: str) -> str:
    """A path as the model may write it (relative, or under /workspace) as a workspace-relative one."""
    path = path.removeprefix(WORKSPACE_PREFIX)
    return path.removeprefix("./")


def _command_output(ctx: ToolContext, argv: list[str]) -> ToolOutput:
    result = ctx.session.exec(argv, timeout_s=ctx.command_timeout())
    parts = [result.stdout_text]
    if result.stderr:
        parts.append(("" if not result.stdout or result.stdout.endswith(b"\n") else "\n") + result.stderr_text)
    if result.stdout_truncated or result.stderr_truncated:
        parts.append("\n[output capped by the sandbox]")
    if result.status is not SandboxStatus.OK:
        parts.append(f"\n[{result.status.value}: {result.detail}]")
    else:
        parts.append(f"\n[exit code {result.exit_code}]")
    ok = result.status is SandboxStatus.OK and result.exit_code == 0
    return ToolOutput("".join(parts).lstrip("\n"), ok=ok, exit_code=result.exit_code)


_STRING = {"type": "string"}


@tool("bash", "Run a shell command in the workspace (bash -c). Files persist between calls; "
      "processes, environment variables and the working directory do not.",
      {"type": "object", "properties": {"command": {**_STRING, "maxLength": MAX_CODE_CHARS}},
       "required": ["command"], "additionalProperties": False})
def bash(ctx: ToolContext, arguments: dict[str, Any]) -> ToolOutput:
    return _command_output(ctx, ["bash", "-c", arguments["command"]])


@tool("python", "Run Python code in the workspace (python -c) and return what it prints.",
      {"type": "object", "properties": {"code": {**_STRING, "maxLength": MAX_CODE_CHARS}},
       "required": ["code"], "additionalProperties": False})
def python(ctx: ToolContext, arguments: dict[str, Any]) -> ToolOutput:
    return _command_output(ctx, [ctx.python, "-c", arguments["code"]])


@tool("read_file", "Read a text file of the workspace.",
      {"type": "object", "properties": {"path": _STRING}, "required": ["path"], "additionalProperties": False})
def read_file(ctx: ToolContext, arguments: dict[str, Any]) -> ToolOutput:
    path = workspace_path(arguments["path"])
    try:
        data = ctx.session.read_file(path, MAX_READ_BYTES + 1)
    except (OSError, ValueError) as error:
        return ToolOutput(f"error: cannot read {arguments['path']!r}: {getattr(error, 'strerror', None) or error}", ok=False)
    text = data[:MAX_READ_BYTES].decode("utf-8", errors="replace")
    if len(data) > MAX_READ_BYTES:
        text += f"\n[file longer than {MAX_READ_BYTES} bytes; the rest is not shown]"
    return ToolOutput(text)


@tool("write_file", "Create or overwrite a text file of the workspace (folders are created).",
      {"type": "object", "properties": {"path": _STRING, "content": _STRING},
       "required": ["path", "content"], "additionalProperties": False})
def write_file(ctx: ToolContext, arguments: dict[str, Any]) -> ToolOutput:
    path, content = workspace_path(arguments["path"]), arguments["content"]
    size = len(content.encode("utf-8", errors="surrogatepass"))
    if size > MAX_WRITE_BYTES:
        return ToolOutput(f"error: {size} bytes is over the {MAX_WRITE_BYTES} byte limit of write_file", ok=False)
    try:
        ctx.session.write_files({path: content.encode("utf-8", errors="replace")})
    except (OSError, ValueError) as error:
        return ToolOutput(f"error: cannot write {arguments['path']!r}: {getattr(error, 'strerror', None) or error}", ok=False)
    return ToolOutput(f"wrote {size} bytes to {path}")


@tool("submit", "Finish the task. Optionally give a final answer; the workspace is then checked.",
      {"type": "object", "properties": {"answer": _STRING}, "additionalProperties": False})
def submit(ctx: ToolContext, arguments: dict[str, Any]) -> ToolOutput:
    return ToolOutput("submitted", submitted=True, answer=arguments.get("answer"))
