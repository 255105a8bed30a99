"""Tasks from datasets in other layouts: `tidal tasks import` and a domain's `sources:` entries.

A dataset's rows (readers.py: JSONL, JSON, CSV, Parquet, Arrow, saved `datasets` folders) are
renamed by a field map, then converted by a format:

- `hf`: the row already holds tidal's task fields (prompt, verifier, ...), a verifier given as its
  name with an `answer` field beside it, fields in CSV given as JSON text;
- `code-tests`: `prompt`, `test`, `entry_point`, optional `canonical_solution` (the common code
  benchmark layout) into a `python_tests` task: the tests are a pytest file that calls
  `check(<entry_point>)`, or that runs each top-level assert as its own test; the reference is
  prompt + solution when the solution is a function body, else the solution;
- `qa`: `question`, `answer` (and `aliases`): a GSM8K-style `#### 42` or a MATH-style `\\boxed{...}`
  final answer is taken out of a worked solution; numbers go to the `math` verifier, other
  answers to `exact_match` with the aliases;
- `mcq`: `question`, `choices` (a list, or `{label, text}` lists), `answer` (a letter, a 0-based
  index, a label, or the choice's text), scored on the letter by `exact_match`;
- `inspect`: inspect_ai samples (`input`, `target`, `choices`, `id`, `metadata`): with choices as
  `mcq`, otherwise as `qa` with the first target and the others as aliases.

A map entry is `field=column` (a dotted path reaches into nested fields), `field={template}` (a
`str.format` template over the row: `{question}\\n\\n{context}`, `{test_list[0]}`),
`field=[a,b,c]` (a list of columns), or `field="text"` (that text, for every row). Each task
keeps its provenance in `metadata.source` ({path, row, format, split}). Every row that misses a field or cannot be converted is reported
with its file and row, all at once, as a `TaskFormatError`; no task is returned when any failed,
so `tidal tasks import` writes whole files only.
"""

from __future__ import annotations

import ast
import json
import re
import string
import textwrap
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from tidal.errors import TaskFormatError
from tidal.tasks.readers import Row, read_rows
from tidal.types import Task

MAX_PROBLEMS_SHOWN = 50
LETTERS = string.ascii_uppercase
CODE_INSTRUCTION = "Complete the following Python code. Answer with the complete code in one ```python block."
TEXT_CODE_INSTRUCTION = "Answer with the complete Python code in one ```python block."
MCQ_INSTRUCTION = "Answer with the letter of the correct choice."
# A number a math verifier can check: 42, -3.5, 1,000, $12, 15%, 3/4.
NUMBER = re.compile(r"[-+]?\$?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?%?|[-+]?\d+\s*/\s*\d+")
GSM8K_FINAL = re.compile(r"####\s*(.+?)\s*$", re.DOTALL)


class RowError(ValueError):
    """What is wrong with one row (its label is added where the row is known)."""


Converter = Callable[[dict[str, Any]], dict[str, Any]]


# ----------------------------------------------------------------------------------------- the map


def parse_map(items: Iterable[str]) -> dict[str, str]:
    """`["prompt=question", ...]` (the CLI's --map) -> {"prompt": "question", ...}."""
    mapping: dict[str, str] = {}
    for item in items:
        field, sep, spec = item.partition("=")
        if not sep or not field.strip() or not spec:
            raise TaskFormatError([f"--map {item!r}: write FIELD=COLUMN, FIELD={{template}} or FIELD=[a,b]"])
        mapping[field.strip()] = spec
    return mapping


class _Fields(dict):  # type: ignore[type-arg]
    def __missing__(self, key: str) -> Any:
        raise RowError(f"no field {key!r} for the template (fields: {', '.join(sorted(self)) or 'none'})")


def _column(data: Mapping[str, Any], name: str) -> Any:
    if name in data:
        return data[name]
    value: Any = data
    for part in name.split("."):
        if isinstance(value, Mapping) and part in value:
            value = value[part]
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            raise RowError(f"no field {name!r} (fields: {', '.join(sorted(data)) or 'none'})")
    return value


def _resolve(spec: str, data: Mapping[str, Any]) -> Any:
    if len(spec) >= 2 and spec[0] == spec[-1] == '"':
        return spec[1:-1]
    if spec.startswith("[") and spec.endswith("]"):
        return [_resolve(part.strip(), data) for part in spec[1:-1].split(",") if part.strip()]
    if "{" in spec:
        try:
            return spec.format_map(_Fields(data))
        except (IndexError, KeyError, AttributeError, ValueError) as error:
            if isinstance(error, RowError):
                raise
            raise RowError(f"the template {spec!r} does not fit the row: {error}") from None
    return _column(data, spec)


def apply_map(data: Mapping[str, Any], mapping: Mapping[str, str]) -> dict[str, Any]:
    """The row with each mapped field set from its column, template or list of columns."""
    fields = dict(data)
    for field, spec in mapping.items():
        fields[field] = _resolve(spec, data)
    return fields


def _need(fields: Mapping[str, Any], name: str) -> Any:
    value = fields.get(name)
    if value is None or (isinstance(value, str) and not value.strip()):
        present = ", ".join(sorted(fields)) or "none"
        raise RowError(f"no `{name}` (fields: {present}); map one with --map {name}=COLUMN")
    return value


def _text(value: Any, name: str) -> str:
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return "\n".join(value)
    if isinstance(value, (str, int, float)) and not isinstance(value, bool):
        return str(value)
    raise RowError(f"`{name}` must be text, got {type(value).__name__}")


# ----------------------------------------------------------------------------------------- formats


def from_fields(fields: dict[str, Any]) -> dict[str, Any]:
    """`hf`: tidal's own task fields, with JSON text (from CSV) and a named verifier accepted."""
    data = {key: fields[key] for key in Task.model_fields if key in fields and fields[key] is not None}
    for key in ("verifier", "tests", "files", "limits", "metadata", "tools", "prompt"):
        value = data.get(key)
        if isinstance(value, str) and value.lstrip()[:1] in ("{", "[") and key != "prompt" or (
                key == "prompt" and isinstance(value, str) and value.lstrip().startswith("[{")):
            try:
                data[key] = json.loads(value)
            except json.JSONDecodeError as error:
                raise RowError(f"`{key}` looks like JSON but is not: {error.msg}") from None
    _need(data, "prompt")
    verifier = _need(data, "verifier")
    if isinstance(verifier, str):
        verifier = {"name": verifier}
    if isinstance(verifier, dict) and "answer" in fields and "answer" not in verifier:
        verifier = {**verifier, "answer": fields["answer"]}
    data["verifier"] = verifier
    data.setdefault("domain", "custom")
    return data


def _parses(code: str) -> bool:
    try:
        ast.parse(code)
    except (SyntaxError, ValueError):
        return False
    return True


def _test_module(tests: str, entry_point: str | None) -> str:
    """A pytest file for `tests`: `check(candidate)` called with the entry point, or each
    top-level assert as its own test (the other statements kept at module level)."""
    try:
        tree = ast.parse(tests)
    except SyntaxError as error:
        raise RowError(f"`test` is not valid Python: {error.msg} (line {error.lineno})") from None
    header = "from solution import *  # noqa: F403 (the tests name the solution's functions)\n"
    if entry_point:
        header += f"from solution import {entry_point}\n"
    defines_check = any(isinstance(node, ast.FunctionDef) and node.name == "check" for node in tree.body)
    if defines_check:
        if not entry_point:
            raise RowError("the tests define check(candidate) but there is no `entry_point` to call it with; "
                           "map one with --map entry_point=COLUMN")
        return f"{header}\n{tests.rstrip()}\n\n\ndef test_check():\n    check({entry_point})\n"
    kept, asserts = [], []
    for node in tree.body:
        segment = ast.get_source_segment(tests, node) or ""
        (asserts if isinstance(node, ast.Assert) else kept).append(segment)
    if not asserts:
        raise RowError("the tests define no check(candidate) function and hold no top-level assert")
    body = "\n".join(kept)
    cases = "".join(f"\n\ndef test_assert_{i}():\n{textwrap.indent(a, '    ')}\n" for i, a in enumerate(asserts))
    return f"{header}\n{body}\n{cases}" if body else f"{header}{cases}"


def from_code_tests(fields: dict[str, Any]) -> dict[str, Any]:
    """`code-tests`: prompt + tests + entry point into a `python_tests` task (module docstring)."""
    prompt = _text(_need(fields, "prompt"), "prompt")
    tests = _text(_need(fields, "test"), "test")
    entry_point = fields.get("entry_point")
    if entry_point is not None and not (isinstance(entry_point, str) and entry_point.isidentifier()):
        raise RowError(f"`entry_point` must be a Python name, got {entry_point!r}")
    code_prompt = _parses(prompt) and re.search(r"^\s*(def|class)\s", prompt, re.MULTILINE) is not None
    if code_prompt:
        text = f"{CODE_INSTRUCTION}\n\n```python\n{prompt.rstrip()}\n```"
    else:
        text = f"{prompt.rstrip()}\n\n{TEXT_CODE_INSTRUCTION}"
    reference = None
    solution = fields.get("canonical_solution")
    if solution is not None and str(solution).strip():
        solution = _text(solution, "canonical_solution")
        reference = solution if _parses(solution) or not code_prompt else prompt + solution
        if not _parses(reference):
            raise RowError("the reference (prompt + canonical_solution, or the solution alone) is not valid Python")
    return {
        "domain": "code", "prompt": text, "reference": reference,
        "verifier": {"name": "python_tests", "entrypoint": "solution.py"},
        "tests": {"test_solution.py": _test_module(tests, entry_point)},
        "metadata": {"entry_point": entry_point} if entry_point else {},
    }


def _last_boxed(text: str) -> str | None:
    """The content of the last `\\boxed{...}` (braces balanced), or None."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, begin = 0, start + len("\\boxed{")
    for position in range(begin, len(text)):
        depth += {"{": 1, "}": -1}.get(text[position], 0)
        if depth < 0:
            return text[begin:position]
    return None


def final_answer(answer: str) -> tuple[str, str]:
    """(the final answer, where it came from: `####`, `boxed` or `plain`) of a reference answer
    or worked solution."""
    found = GSM8K_FINAL.search(answer)
    if found:
        return found.group(1).strip().replace(",", ""), "####"
    boxed = _last_boxed(answer)
    if boxed is not None and boxed.strip():
        return boxed.strip(), "boxed"
    return answer.strip(), "plain"


def from_qa(fields: dict[str, Any]) -> dict[str, Any]:
    """`qa`: a question and its answer (module docstring)."""
    question = _text(_need(fields, "question"), "question")
    answer = _text(_need(fields, "answer"), "answer")
    final, origin = final_answer(answer)
    if not final:
        raise RowError("the answer has an empty final answer")
    aliases = fields.get("aliases") or []
    if isinstance(aliases, str):
        aliases = [aliases]
    if not isinstance(aliases, list):
        raise RowError(f"`aliases` must be a list, got {type(aliases).__name__}")
    numeric = origin != "plain" or NUMBER.fullmatch(final) is not None
    if numeric:
        verifier: dict[str, Any] = {"name": "math", "answer": final}
        if origin == "####":  # the worked solution, ending in an answer the math verifier reads
            reference = GSM8K_FINAL.sub("", answer).rstrip() + f"\nThe answer is \\boxed{{{final}}}."
        else:
            reference = answer.strip()
    else:
        verifier = {"name": "exact_match", "answer": final, "aliases": [str(a) for a in aliases]}
        reference = final
    return {"domain": "math" if numeric else "knowledge", "prompt": question, "reference": reference,
            "verifier": verifier, "metadata": {"answer_from": origin}}


def _choices(value: Any) -> tuple[list[str], list[str] | None]:
    """(choice texts, their own labels if the dataset gives some)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            raise RowError("`choices` is text that is not a JSON list; map a list with --map choices=[A,B,C,D]") from None
    if isinstance(value, dict) and "text" in value:
        texts, labels = value["text"], value.get("label")
    else:
        texts, labels = value, None
    if not isinstance(texts, list) or len(texts) < 2 or len(texts) > len(LETTERS):
        raise RowError(f"`choices` must be a list of 2 to {len(LETTERS)} choices, got {texts!r:.80}")
    return [str(t) for t in texts], ([str(label) for label in labels] if isinstance(labels, list) else None)


def _choice_index(answer: Any, texts: list[str], labels: list[str] | None) -> int:
    count = len(texts)
    if isinstance(answer, bool):
        raise RowError(f"`answer` {answer!r} is neither a letter, an index nor a choice")
    if isinstance(answer, int):
        if 0 <= answer < count:
            return answer
        raise RowError(f"`answer` index {answer} is out of range for {count} choices (0-based)")
    text = str(answer).strip()
    if labels and text in labels:
        return labels.index(text)
    if len(text) == 1 and text.upper() in LETTERS[:count]:
        return LETTERS.index(text.upper())
    if text.isdigit() and int(text) < count:
        return int(text)
    folded = [t.strip().casefold() for t in texts]
    if text.casefold() in folded:
        return folded.index(text.casefold())
    raise RowError(f"`answer` {text!r:.60} is neither a letter, a 0-based index, a label nor the text of one of "
                   f"the {count} choices")


def _multiple_choice(question: str, texts: list[str], index: int) -> dict[str, Any]:
    lines = "\n".join(f"{LETTERS[i]}. {text}" for i, text in enumerate(texts))
    letter, text = LETTERS[index], texts[index]
    aliases = [f"({letter})", f"{letter})", f"{letter}. {text}", f"{letter}) {text}", f"({letter}) {text}"]
    return {"domain": "knowledge", "prompt": f"{question.rstrip()}\n\n{lines}\n\n{MCQ_INSTRUCTION}",
            "reference": letter, "verifier": {"name": "exact_match", "answer": letter, "aliases": aliases},
            "metadata": {"choices": len(texts)}}


def from_mcq(fields: dict[str, Any]) -> dict[str, Any]:
    """`mcq`: question, choices and answer, scored on the letter."""
    question = _text(_need(fields, "question"), "question")
    texts, labels = _choices(_need(fields, "choices"))
    return _multiple_choice(question, texts, _choice_index(_need(fields, "answer"), texts, labels))


def _inspect_prompt(value: Any) -> str | list[dict[str, str]]:
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise RowError(f"`input` must be text or a list of chat messages, got {type(value).__name__}")
    messages = []
    for index, message in enumerate(value):
        if not isinstance(message, dict) or message.get("role") not in ("system", "user", "assistant"):
            raise RowError(f"input[{index}] must be a system, user or assistant message")
        content = message.get("content")
        if isinstance(content, list):  # content parts: keep the text ones
            content = "\n".join(part.get("text", "") for part in content if isinstance(part, dict)
                                and part.get("type", "text") == "text")
        if not isinstance(content, str):
            raise RowError(f"input[{index}].content must be text")
        messages.append({"role": message["role"], "content": content})
    return messages


def from_inspect(fields: dict[str, Any]) -> dict[str, Any]:
    """`inspect`: an inspect_ai sample (module docstring)."""
    prompt = _inspect_prompt(_need(fields, "input"))
    target = _need(fields, "target")
    targets = [str(t) for t in target] if isinstance(target, list) else [str(target)]
    if not targets or not targets[0].strip():
        raise RowError("`target` is empty; tidal needs a target to score the sample")
    metadata = fields.get("metadata") if isinstance(fields.get("metadata"), dict) else {}
    if fields.get("choices"):
        if not isinstance(prompt, str):
            raise RowError("a multiple-choice sample's `input` must be text")
        texts, labels = _choices(fields["choices"])
        data = _multiple_choice(prompt, texts, _choice_index(targets[0], texts, labels))
    else:
        data = from_qa({"question": "q", "answer": targets[0], "aliases": targets[1:]})
        data["prompt"] = prompt
    data["metadata"] = {**metadata, **data["metadata"]}
    return data


FORMATS: dict[str, Converter] = {
    "hf": from_fields,
    "code-tests": from_code_tests,
    "qa": from_qa,
    "mcq": from_mcq,
    "inspect": from_inspect,
}


# ----------------------------------------------------------------------------------------- importing


def _tidal_split(split: str | None) -> str:
    return "train" if split in (None, "train") else "eval"


def _task_id(template: str | None, fields: Mapping[str, Any], row: Row, index: int) -> str:
    if template is not None:
        values = {**fields, "index": index, "row": row.row, "stem": Path(row.path).stem}
        try:
            return template.format_map(_Fields(values))
        except (IndexError, KeyError, AttributeError, ValueError) as error:
            if isinstance(error, RowError):
                raise
            raise RowError(f"--id {template!r} does not fit the row: {error}") from None
    for key in ("id", "task_id"):
        if isinstance(fields.get(key), (str, int)) and not isinstance(fields.get(key), bool) and str(fields[key]):
            return str(fields[key])
    return f"{Path(row.path).stem}-{row.row}"


def _problem_lines(label: str, error: ValidationError) -> list[str]:
    return [f"{label} {'.'.join(str(p) for p in item['loc']) or '(root)'}: {item['msg']}" for item in error.errors()]


def import_tasks(sources: str | Path | Sequence[str | Path], format: str, *, mapping: Mapping[str, str] | None = None,
                 split: str | None = None, domain: str | None = None, id: str | None = None,
                 limit: int | None = None, known_verifiers: set[str] | None = None) -> list[Task]:
    """The tasks of every row of `sources` in `format` (see the module docstring); at most
    `limit` of them. Raises `TaskFormatError` with every bad row's file and row."""
    converter = FORMATS.get(format)
    if converter is None:
        raise TaskFormatError([f"unknown format {format!r}; known: {', '.join(FORMATS)}"])
    if limit is not None and limit < 1:
        raise TaskFormatError([f"--limit {limit}: must be >= 1"])
    if isinstance(sources, (str, Path)):
        sources = [sources]
    tasks: list[Task] = []
    problems: list[str] = []
    first: dict[str, str] = {}
    index = 0
    for source in sources:
        for row in read_rows(source, split):
            if limit is not None and index >= limit:
                break
            task = _convert(row, index, converter, format, mapping or {}, split, domain, id, known_verifiers, problems)
            index += 1
            if task is None:
                continue
            if task.id in first:
                problems.append(f"{row.label} [{task.id}] id: duplicate id, first at {first[task.id]}; "
                                "give an --id template that tells rows apart, e.g. --id '{stem}-{row}'")
                continue
            first[task.id] = row.label
            tasks.append(task)
    if problems:
        shown = problems[:MAX_PROBLEMS_SHOWN]
        if len(problems) > len(shown):
            shown.append(f"... and {len(problems) - len(shown)} more")
        raise TaskFormatError(shown)
    return tasks


def _convert(row: Row, index: int, converter: Converter, format: str, mapping: Mapping[str, str],
             split: str | None, domain: str | None, template: str | None, known_verifiers: set[str] | None,
             problems: list[str]) -> Task | None:
    label = row.label
    try:
        fields = apply_map(row.data, mapping)
        task_id = _task_id(template, fields, row, index)
        label = f"{row.label} [{task_id}]"
        data = converter(fields)
    except RowError as error:
        problems.append(f"{label}: {error}")
        return None
    data["id"] = task_id
    data["split"] = _tidal_split(split if split is not None else data.get("split"))
    if domain is not None:
        data["domain"] = domain
    provenance = {"path": row.path, "row": row.row, "format": format, **({"split": row.split} if row.split else {})}
    data["metadata"] = {**(data.get("metadata") or {}), "source": provenance}
    try:
        task = Task.model_validate(data)
    except ValidationError as error:
        problems.extend(_problem_lines(label, error))
        return None
    if known_verifiers is not None and task.verifier.name not in known_verifiers:
        problems.append(f"{label} verifier.name: unknown verifier {task.verifier.name!r}; known: "
                        f"{', '.join(sorted(known_verifiers))}")
        return None
    return task


def load_sources(sources: Sequence[str | Mapping[str, Any]], known_verifiers: set[str] | None = None) -> list[Task]:
    """A domain's `sources:`: task files and folders (loader.load_tasks) and dataset entries
    `{path, format, map, split, domain, id, limit}` imported here."""
    from tidal.tasks.loader import load_tasks

    files = [s for s in sources if isinstance(s, (str, Path))]
    tasks = load_tasks(files, known_verifiers=known_verifiers) if files else []
    for entry in sources:
        if isinstance(entry, (str, Path)):
            continue
        tasks += import_tasks(entry["path"], entry["format"], mapping=entry.get("map") or {},
                              split=entry.get("split"), domain=entry.get("domain"), id=entry.get("id"),
                              limit=entry.get("limit"), known_verifiers=known_verifiers)
    return tasks
