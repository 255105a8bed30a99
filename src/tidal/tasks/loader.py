"""Read and write task files: `.jsonl` (one JSON object per line) and `.yaml`/`.yml` (documents,
each a task or a list of tasks), or folders of them.

Loading never stops at the first bad task: every problem in every file is collected and raised
as one `TaskFormatError`, each line `FILE:LINE [task-id] field.path: message`, so an author fixes
a whole file in one pass. LINE is the JSONL line, or where the YAML document or list item starts.
"""

from __future__ import annotations

import difflib
import json
import os
import typing
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from tidal.errors import TaskFormatError
from tidal.types import Task

TASK_SUFFIXES = (".jsonl", ".yaml", ".yml")
Located = tuple[str, Any]  # ("FILE:LINE", the parsed object)


def load_tasks(
    paths: Iterable[str | Path] | str | Path, known_verifiers: set[str] | None = None
) -> list[Task]:
    """Tasks from files and folders (searched recursively, files in sorted order), in order.

    `known_verifiers`, when given, is the set of registered verifier names; a task naming another
    one is a problem. Raises `TaskFormatError` listing every problem found in all the files.
    """
    if isinstance(paths, (str, Path)):
        paths = [paths]
    problems: list[str] = []
    tasks: list[Task] = []
    first_defined: dict[str, str] = {}  # task id -> "FILE:LINE" where it first appeared
    for file in _task_files(paths, problems):
        for where, data in _read_objects(file, problems):
            task_id = data.get("id") if isinstance(data, dict) else None
            label = f"{where} [{task_id}]" if isinstance(task_id, (str, int)) and str(task_id) else where
            task = _validate(label, data, known_verifiers, problems)
            if isinstance(task_id, str) and task_id:
                if task_id in first_defined:
                    problems.append(f"{label} id: duplicate id, first defined at {first_defined[task_id]}")
                else:
                    first_defined[task_id] = where
            if task is not None:
                tasks.append(task)
    if problems:
        raise TaskFormatError(problems)
    return tasks


def write_tasks(tasks: Iterable[Task], path: str | Path) -> None:
    """Write tasks as JSONL, or as YAML documents when the name ends in .yaml/.yml.

    Every field is written, defaults included, so the file means the same thing if a default
    changes later. The file is replaced atomically.
    """
    path = Path(path)
    records = [task.model_dump(mode="json") for task in tasks]
    if path.suffix == ".jsonl":
        text = "".join(json.dumps(record, ensure_ascii=False) + "\n" for record in records)
    elif path.suffix in (".yaml", ".yml"):
        text = yaml.dump_all(
            records, Dumper=_BlockStringDumper, sort_keys=False, allow_unicode=True, explicit_start=True
        )
    else:
        raise TaskFormatError([f"{path}: cannot write tasks to {path.suffix or 'a name without a suffix'}; "
                               "use .jsonl, .yaml or .yml"])
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(text, encoding="utf-8")
    os.replace(temporary, path)


class _BlockStringDumper(yaml.SafeDumper):
    """Writes multi-line strings (code, tests) as `|` blocks, so a YAML task file reads like code."""


def _represent_string(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_BlockStringDumper.add_representer(str, _represent_string)


# ---------------------------------------------------------------------------------------------
# Finding and parsing files


def _task_files(paths: Iterable[str | Path], problems: list[str]) -> list[Path]:
    files: list[Path] = []
    seen: set[Path] = set()  # a file named directly and through its folder is read once
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            # Hidden folders (.git, editor backups) are not task sources.
            found = sorted(
                p for p in path.rglob("*")
                if p.is_file() and p.suffix in TASK_SUFFIXES
                and not any(part.startswith(".") for part in p.relative_to(path).parts)
            )
        elif path.is_file():
            if path.suffix not in TASK_SUFFIXES:
                problems.append(f"{path}: not a task file; task files end in .jsonl, .yaml or .yml")
                continue
            found = [path]
        else:
            problems.append(f"{path}: no such file or folder")
            continue
        for file in found:
            if file.resolve() not in seen:
                seen.add(file.resolve())
                files.append(file)
    return files


def _read_objects(file: Path, problems: list[str]) -> Iterator[Located]:
    try:
        content = file.read_bytes()
    except OSError as error:
        problems.append(f"{file}: cannot read the file ({error.strerror})")
        return
    if file.suffix == ".jsonl":
        yield from _read_jsonl(file, content, problems)
    else:
        yield from _read_yaml(file, content, problems)


def _not_utf8(file: Path, line: int, raw: bytes, error: UnicodeDecodeError) -> str:
    column = error.start - (raw.rfind(b"\n", 0, error.start) + 1) + 1
    return (f"{file}:{line}: not UTF-8 text (byte 0x{raw[error.start]:02x} at column {column}); "
            "save the file as UTF-8")


def _read_jsonl(file: Path, content: bytes, problems: list[str]) -> Iterator[Located]:
    # Decoding line by line keeps one bad byte from hiding the problems on every other line.
    for number, raw in enumerate(content.split(b"\n"), start=1):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as error:
            problems.append(_not_utf8(file, number, raw, error))
            continue
        if number == 1:
            line = line.removeprefix("\ufeff")  # byte-order mark some editors write
        if not line.strip():
            continue
        try:
            data = json.loads(line)
        except json.JSONDecodeError as error:
            problems.append(f"{file}:{number}: not valid JSON: {error.msg} (column {error.colno})")
            continue
        yield f"{file}:{number}", data


def _read_yaml(file: Path, content: bytes, problems: list[str]) -> Iterator[Located]:
    try:
        text = content.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as error:
        problems.append(_not_utf8(file, content.count(b"\n", 0, error.start) + 1, content, error))
        return
    # Composing node by node (instead of safe_load_all) keeps each document's and item's line.
    loader = yaml.SafeLoader(text)
    try:
        while loader.check_node():
            node = loader.get_node()
            data = loader.construct_document(node)
            if data is None:
                continue  # an empty document, e.g. a trailing `---`
            if isinstance(data, list) and isinstance(node, yaml.SequenceNode):
                for item_node, item in zip(node.value, data):
                    yield f"{file}:{item_node.start_mark.line + 1}", item
            else:
                yield f"{file}:{node.start_mark.line + 1}", data
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        line = mark.line + 1 if mark is not None else 1
        reason = getattr(error, "problem", None) or str(error)
        column = f" (column {mark.column + 1})" if mark is not None else ""
        # After a syntax error the rest of the stream cannot be read reliably.
        problems.append(f"{file}:{line}: not valid YAML: {reason}{column}; the rest of the file is skipped")
    finally:
        loader.dispose()


# ---------------------------------------------------------------------------------------------
# Validation


def _validate(label: str, data: Any, known_verifiers: set[str] | None, problems: list[str]) -> Task | None:
    if not isinstance(data, dict):
        problems.append(f"{label} (root): a task is a mapping of fields (a JSON object), "
                        f"got {_type_name(data)}")
        return None
    task = None
    try:
        task = Task.model_validate(data)
    except ValidationError as error:
        problems.extend(f"{label} {problem}" for problem in _field_problems(error, data))
    verifier = data.get("verifier")
    name = verifier.get("name") if isinstance(verifier, dict) else None
    if known_verifiers is not None and isinstance(name, str) and name and name not in known_verifiers:
        guess = difflib.get_close_matches(name, sorted(known_verifiers), n=1)
        hint = f" (did you mean {guess[0]!r}?)" if guess else ""
        known = ", ".join(sorted(known_verifiers)) or "(none)"
        problems.append(f"{label} verifier.name: unknown verifier {name!r}{hint}; known: {known}")
    return task


def _field_problems(error: ValidationError, data: dict[str, Any]) -> list[str]:
    """`field.path: message` lines. For a union field (the prompt: a string or a list of messages)
    pydantic reports every alternative; only the one matching the value's type is kept, or a
    single 'must be one of' line when none matches."""
    items = error.errors()
    alternatives: dict[tuple[Any, ...], list[str]] = {}
    for item in items:
        branch = _union_branch(tuple(item["loc"]), data, item["type"])
        if branch is not None:
            prefix = tuple(item["loc"])[:branch]
            alternatives.setdefault(prefix, []).append(str(item["loc"][branch]))
    problems: list[str] = []
    reported_unions: set[tuple[Any, ...]] = set()
    for item in items:
        loc = tuple(item["loc"])
        branch = _union_branch(loc, data, item["type"])
        if branch is not None:
            prefix, tag = loc[:branch], str(loc[branch])
            value = _value_at(data, prefix)
            matching = [t for t in alternatives[prefix] if t.split("[")[0] == _type_name(value, bare=True)]
            if matching:
                if tag != matching[0]:
                    continue
                loc = prefix + loc[branch + 1:]
            else:
                if prefix not in reported_unions:
                    reported_unions.add(prefix)
                    options = " or ".join(dict.fromkeys(alternatives[prefix]))
                    problems.append(f"{_path(prefix)}: must be {options}, got {_type_name(value)}")
                continue
        problems.append(f"{_path(loc)}: {_message(item, loc)}")
    return problems


def _union_branch(loc: tuple[Any, ...], data: Any, kind: str) -> int | None:
    """The index in `loc` of a union alternative's tag (e.g. 'list[Message]'), if any: a segment
    that names no key or index of the data it would step into."""
    current = data
    for index, segment in enumerate(loc):
        if isinstance(current, dict) and segment in current:
            current = current[segment]
        elif isinstance(current, list) and isinstance(segment, int) and 0 <= segment < len(current):
            current = current[segment]
        elif isinstance(current, dict) and index == len(loc) - 1 and kind == "missing":
            return None
        elif isinstance(segment, str) and segment != "[key]":
            return index
        else:
            return None
    return None


def _value_at(data: Any, loc: tuple[Any, ...]) -> Any:
    for segment in loc:
        data = data[segment]
    return data


def _path(loc: tuple[Any, ...]) -> str:
    return ".".join(str(segment) for segment in loc if segment != "[key]") or "(root)"


def _message(item: Any, loc: tuple[Any, ...]) -> str:
    kind, context = item["type"], item.get("ctx") or {}
    bounds = {"greater_than": ">", "greater_than_equal": ">=", "less_than": "<", "less_than_equal": "<="}
    if kind in bounds:
        return f"must be {bounds[kind]} {next(iter(context.values()))}, got {_show(item.get('input'))}"
    if kind == "missing":
        return "is required"
    if kind == "extra_forbidden":
        guess = difflib.get_close_matches(str(loc[-1]), _known_fields(loc), n=1)
        return "unknown field" + (f" (did you mean {guess[0]!r}?)" if guess else "")
    if kind == "value_error":
        return str(context.get("error", item["msg"]))
    if kind == "literal_error":
        return f"must be {context['expected']}, got {_show(item.get('input'))}"
    message = item["msg"][:1].lower() + item["msg"][1:]
    if "[key]" in loc:
        message = "the key: " + message
    if kind.endswith(("_type", "_parsing")):
        message += f", got {_show(item.get('input'))}"
    return message


def _known_fields(loc: tuple[Any, ...]) -> list[str]:
    """Field names of the model an unknown key sits in, for a 'did you mean'."""
    annotation: Any = Task
    for segment in loc[:-1]:
        model = _model_in(annotation)
        if isinstance(segment, int) or model is None:
            continue  # a list index keeps the element type, which _model_in unwraps
        field = model.model_fields.get(str(segment))
        if field is None:
            return []
        annotation = field.annotation
    model = _model_in(annotation)
    return list(model.model_fields) if model is not None else []


def _model_in(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for argument in typing.get_args(annotation):
        model = _model_in(argument)
        if model is not None:
            return model
    return None


def _type_name(value: Any, bare: bool = False) -> str:
    """'a list', 'a number', ... for messages; the Python type name when `bare`."""
    if bare:
        return type(value).__name__
    names = {dict: "a mapping", list: "a list", str: "a string", bool: "a boolean", int: "a number",
             float: "a number", type(None): "null"}
    return names.get(type(value), f"a {type(value).__name__}")


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
