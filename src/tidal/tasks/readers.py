"""Rows of a dataset file, each with where it came from: the containers `tidal tasks import` reads.

- `.jsonl` (one JSON object a line; the place is the line), `.json` (a list of objects, or an
  object holding one list), `.csv` (a header row; the place is the data row, 1 = the first):
  read with the standard library;
- `.parquet`: read with pyarrow (a tidal dependency);
- `.arrow` files and folders written by `datasets.save_to_disk` (a `Dataset`, or a `DatasetDict`
  of splits): read with the `datasets` library, the optional `data` extra
  (`pip install 'tidal[data]'`). A folder that is not a saved dataset is read file by file.

`split` picks one split of a saved `DatasetDict` (required when it holds several); for a plain
file it names nothing and only says which tidal split the tasks get (importers.py).
A file that cannot be read is a `TaskFormatError` naming it; nothing is half read.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tidal.errors import TaskFormatError

SUFFIXES = (".jsonl", ".json", ".csv", ".parquet", ".arrow")


@dataclass(frozen=True)
class Row:
    """One record of a dataset and its place: `path`, its `row` (1-based), and a `label`
    ("FILE:line N" or "FILE:row N") for messages."""

    path: str
    row: int
    label: str
    split: str | None
    data: dict[str, Any]


def read_rows(source: str | Path, split: str | None = None) -> Iterator[Row]:
    """Every row of `source` (a file or folder; see the module docstring), in order."""
    path = Path(source)
    if not path.exists():
        raise TaskFormatError([f"{path}: no such file or folder"])
    if path.is_dir():
        if _is_saved_dataset(path):
            yield from _read_saved(path, split)
            return
        files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in SUFFIXES
                       and not any(part.startswith(".") for part in p.relative_to(path).parts))
        if not files:
            raise TaskFormatError([f"{path}: a folder with no dataset files ({', '.join(SUFFIXES)}) and not a "
                                   "folder saved by datasets.save_to_disk"])
        for file in files:
            yield from _read_file(file, split)
        return
    yield from _read_file(path, split)


def _read_file(path: Path, split: str | None) -> Iterator[Row]:
    readers = {".jsonl": _jsonl, ".json": _json, ".csv": _csv, ".parquet": _parquet, ".arrow": _arrow}
    reader = readers.get(path.suffix.lower())
    if reader is None:
        raise TaskFormatError([f"{path}: cannot read {path.suffix or 'a file without a suffix'}; dataset files end "
                               f"in {', '.join(SUFFIXES)} (or give a folder saved by datasets.save_to_disk)"])
    yield from reader(path, split)


def _row(path: Path, number: int, split: str | None, data: Any, unit: str = "row") -> Row:
    label = f"{path}:{unit} {number}"
    if not isinstance(data, dict):
        raise TaskFormatError([f"{label}: a row is an object of fields, got {type(data).__name__}"])
    return Row(str(path), number, label, split, data)


def _text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as error:
        raise TaskFormatError([f"{path}: not UTF-8 text ({error.reason} at byte {error.start}); save it as UTF-8"]) from None
    except OSError as error:
        raise TaskFormatError([f"{path}: cannot read the file ({error.strerror})"]) from None


def _jsonl(path: Path, split: str | None) -> Iterator[Row]:
    for number, line in enumerate(_text(path).split("\n"), start=1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
        except json.JSONDecodeError as error:
            raise TaskFormatError([f"{path}:line {number}: not valid JSON: {error.msg} (column {error.colno})"]) from None
        yield _row(path, number, split, data, "line")


def _json(path: Path, split: str | None) -> Iterator[Row]:
    try:
        data = json.loads(_text(path))
    except json.JSONDecodeError as error:
        raise TaskFormatError([f"{path}:line {error.lineno}: not valid JSON: {error.msg}"]) from None
    if isinstance(data, dict):  # {"data": [...]} or {"train": [...]}: the one list it holds, or the split's
        lists = {key: value for key, value in data.items() if isinstance(value, list)}
        if split in lists:
            data = lists[split]
        elif len(lists) == 1:
            data = next(iter(lists.values()))
        else:
            raise TaskFormatError([f"{path}: a JSON object with lists {sorted(lists)}; pick one with --split"])
    if not isinstance(data, list):
        raise TaskFormatError([f"{path}: a JSON dataset is a list of objects"])
    for number, item in enumerate(data, start=1):
        yield _row(path, number, split, item)


def _csv(path: Path, split: str | None) -> Iterator[Row]:
    reader = csv.DictReader(_text(path).splitlines(keepends=True))
    for number, data in enumerate(reader, start=1):
        if None in data:
            raise TaskFormatError([f"{path}:row {number}: more values than the header has columns"])
        yield _row(path, number, split, dict(data))


def _parquet(path: Path, split: str | None) -> Iterator[Row]:
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except Exception as error:  # pyarrow raises its own several kinds for a bad file
        raise TaskFormatError([f"{path}: not a readable Parquet file ({error})"]) from None
    for number, data in enumerate(table.to_pylist(), start=1):
        yield _row(path, number, split, data)


def _datasets() -> Any:
    try:
        import datasets
    except ImportError:
        raise TaskFormatError(["reading Arrow files and saved dataset folders needs the `datasets` library: "
                               "pip install 'tidal[data]'"]) from None
    return datasets


def _arrow(path: Path, split: str | None) -> Iterator[Row]:
    datasets = _datasets()
    try:
        dataset = datasets.Dataset.from_file(str(path))
    except Exception as error:
        raise TaskFormatError([f"{path}: not a readable Arrow file ({error})"]) from None
    for number, data in enumerate(dataset, start=1):
        yield _row(path, number, split, data)


def _is_saved_dataset(path: Path) -> bool:
    return (path / "dataset_dict.json").is_file() or (path / "state.json").is_file()


def _read_saved(path: Path, split: str | None) -> Iterator[Row]:
    datasets = _datasets()
    try:
        loaded = datasets.load_from_disk(str(path))
    except Exception as error:
        raise TaskFormatError([f"{path}: not a readable saved dataset ({error})"]) from None
    if isinstance(loaded, datasets.DatasetDict):
        names = list(loaded)
        if split is None and len(names) == 1:
            split = names[0]
        if split not in loaded:
            wanted = "give one with --split" if split is None else f"it has no split {split!r}"
            raise TaskFormatError([f"{path}: a dataset with splits {', '.join(names)}; {wanted}"])
        loaded = loaded[split]
    where = path / split if split and (path / split).is_dir() else path
    for number, data in enumerate(loaded, start=1):
        yield _row(where, number, split, data)
