"""Load a YAML config, apply dotted overrides (`trainer.lr=1e-5`), validate, report every error."""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from tidal.config.schema import TidalConfig
from tidal.errors import ConfigError


def parse_override(text: str) -> tuple[list[str], Any]:
    """`a.b.c=value` -> (["a", "b", "c"], value parsed as YAML, so 1e-5, true, [1, 2] work)."""
    if "=" not in text:
        raise ConfigError([f"{text}: an override looks like section.field=value"], source="overrides")
    key, raw = text.split("=", 1)
    parts = [p for p in key.strip().split(".") if p]
    if not parts:
        raise ConfigError([f"{text}: empty key"], source="overrides")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    # YAML reads 1e-5 as a string (no dot in the mantissa); a number is what was meant.
    if isinstance(value, str):
        try:
            value = float(value) if any(c in value for c in ".eE") else int(value)
        except ValueError:
            pass
    return parts, value


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    for text in overrides:
        parts, value = parse_override(text)
        node = data
        for part in parts[:-1]:
            child = node.get(part)
            if not isinstance(child, dict):
                child = {}
                node[part] = child
            node = child
        node[parts[-1]] = value
    return data


def _message(error: dict[str, Any]) -> str:
    kind, ctx = error["type"], error.get("ctx") or {}
    bounds = {"greater_than": ">", "greater_than_equal": ">=", "less_than": "<", "less_than_equal": "<="}
    for name, op in bounds.items():
        if kind == name:
            return f"must be {op} {next(iter(ctx.values()))}"
    if kind == "missing":
        return "is required"
    if kind == "value_error":
        return str(ctx.get("error", error["msg"]))
    return error["msg"][:1].lower() + error["msg"][1:]


def _known_fields(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """Field names of the section an unknown key was found in, for a 'did you mean'."""
    current: Any = model
    for part in loc[:-1]:
        fields = getattr(current, "model_fields", None)
        if fields is None or part not in fields:
            return []
        annotation = fields[part].annotation
        current = annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None
        if current is None:
            return []
    return list(getattr(current, "model_fields", {}))


def format_validation_error(error: ValidationError, model: type[BaseModel]) -> list[str]:
    problems = []
    for item in error.errors():
        loc = tuple(item["loc"])
        path = ".".join(str(p) for p in loc) or "(root)"
        if item["type"] == "extra_forbidden":
            guess = difflib.get_close_matches(str(loc[-1]), _known_fields(model, loc), n=1)
            hint = f" (did you mean {guess[0]!r}?)" if guess else ""
            problems.append(f"{path}: unknown field{hint}")
        else:
            problems.append(f"{path}: {_message(item)}")
    return problems


def load_config_imports(data: dict[str, Any], source: str = "config", base: Path | None = None) -> None:
    """Import the plugins the config's `imports:` names (tidal.plugins) before it is validated, so
    the verifiers, estimators and losses they register are known to its checks; relative files
    beside `base` (the config's folder) are made absolute in `data`. A plugin that fails to import
    is a ConfigError naming its file and line."""
    from tidal.plugins import PluginError, import_plugin, resolve_spec

    imports = data.get("imports")
    if imports is None:
        return
    if not isinstance(imports, list) or not all(isinstance(item, str) for item in imports):
        raise ConfigError(["imports: a list of module names or .py files"], source=source)
    problems = []
    resolved = []
    for index, spec in enumerate(imports):
        try:
            resolved.append(resolve_spec(spec, base))
            import_plugin(resolved[-1])
        except PluginError as error:
            problems.append(f"imports.{index}: {error}")
    if problems:
        raise ConfigError(problems, source=source)
    data["imports"] = resolved


def config_from_dict(data: dict[str, Any], source: str = "config", base: Path | None = None) -> TidalConfig:
    load_config_imports(data, source, base)
    try:
        return TidalConfig.model_validate(data)
    except ValidationError as error:
        raise ConfigError(format_validation_error(error, TidalConfig), source=source) from None


def load_config(path: str | Path | None, overrides: list[str] | None = None) -> TidalConfig:
    """Read `path` (YAML), apply overrides, validate. Raises ConfigError listing every problem."""
    data: dict[str, Any] = {}
    source = "overrides"
    if path is not None:
        path = Path(path)
        source = str(path)
        if not path.is_file():
            raise ConfigError([f"{path}: no such config file"], source=source)
        try:
            loaded = yaml.safe_load(path.read_text())
        except yaml.YAMLError as error:
            mark = getattr(error, "problem_mark", None)
            where = f"line {mark.line + 1}" if mark else "?"
            raise ConfigError([f"{where}: not valid YAML ({getattr(error, 'problem', error)})"], source=source) from None
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise ConfigError(["(root): a config is a mapping of sections"], source=source)
        data = loaded
    config = config_from_dict(apply_overrides(data, overrides or []), source=source,
                              base=path.parent if path is not None else None)
    if path is not None:
        _resolve_sources(config, path.parent)
    return config


def _resolve_sources(config: TidalConfig, folder: Path) -> None:
    """A relative task source that names no file from the working directory but one beside the
    config file is the config's own data (e.g. a shipped config's eval set): make it absolute, so
    the run (and its saved config) finds it from anywhere."""
    def resolved(source: str) -> str:
        if not Path(source).is_absolute() and not Path(source).exists() and (folder / source).exists():
            return str((folder / source).resolve())
        return source

    for domain in config.tasks.domains.values():
        domain.sources = [resolved(source) if isinstance(source, str)
                          else source.model_copy(update={"path": resolved(source.path)}) for source in domain.sources]


def save_config(config: TidalConfig, path: str | Path) -> None:
    """Write the resolved config (every default filled in) as YAML."""
    Path(path).write_text(yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False))
