"""Training checkpoints that resume exactly, written atomically.

A checkpoint is a folder under a root (e.g. `run/checkpoints/step_000010`):

    model/            the policy as a Hugging Face checkpoint (safetensors), plus the tokenizer;
                      for a LoRA policy the adapter alone, in peft's format (trainer/lora.py)
    optimizer.pt      optimizer state        scheduler.pt  LR scheduler state
                      (or optimizer/: the state in shards, written by FSDP2 ranks through DCP)
    rng.pt            python, numpy, torch CPU and CUDA generator states
    state.json        {"step": ..., "extra": ...} (extra: the caller's JSON, e.g. a data cursor)
    complete.json     the completion marker, written last: step and the size of every file

It is written into a hidden sibling folder and renamed into place, then the root's `latest`
file (replaced atomically) names it. A folder without a valid marker is never a checkpoint, so a
crash mid-save leaves the previous checkpoint as the latest.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tidal.errors import CheckpointError
from tidal.storage.run import fsync_path
from tidal.trainer.lora import has_adapter, is_adapter_folder, load_adapter, save_adapter

MARKER = "complete.json"
LATEST = "latest"
MODEL_DIR = "model"
_TEMP_PREFIX = ".tmp-"
_OLD_PREFIX = ".old-"


# ---------------------------------------------------------------- small file helpers


def _write_text_atomic(path: Path, text: str) -> None:
    temp = path.with_name(f"{_TEMP_PREFIX}{path.name}-{uuid.uuid4().hex}")
    with open(temp, "w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temp, path)
    fsync_path(path.parent)


def _files_with_sizes(folder: Path) -> dict[str, int]:
    return {
        path.relative_to(folder).as_posix(): path.stat().st_size
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


# ---------------------------------------------------------------- RNG states


def _rng_state() -> dict[str, Any]:
    numpy_state = np.random.get_state(legacy=False)
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": {
            "bit_generator": numpy_state["bit_generator"],
            "key": [int(k) for k in numpy_state["state"]["key"]],
            "pos": int(numpy_state["state"]["pos"]),
            "has_gauss": int(numpy_state["has_gauss"]),
            "gauss": float(numpy_state["gauss"]),
        },
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    python = state["python"]
    random.setstate((python[0], tuple(python[1]), python[2]))
    n = state["numpy"]
    np.random.set_state(
        {
            "bit_generator": n["bit_generator"],
            "state": {"key": np.array(n["key"], dtype=np.uint32), "pos": n["pos"]},
            "has_gauss": n["has_gauss"],
            "gauss": n["gauss"],
        }
    )
    torch.set_rng_state(state["torch"])
    cuda = state.get("cuda") or []
    # A GPU checkpoint may be loaded on a CPU-only machine (for evaluation): skip CUDA there.
    if cuda and torch.cuda.is_available():
        count = min(len(cuda), torch.cuda.device_count())
        for index in range(count):
            torch.cuda.set_rng_state(cuda[index], index)


# ---------------------------------------------------------------- save


def save_training_state(
    folder: str | Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    scheduler: Any | None,
    step: int,
    extra: dict[str, Any] | None = None,
    save_tokenizer: Any | None = None,
    write_optimizer: Callable[[Path], None] | None = None,
) -> Path:
    """Write a checkpoint into `folder` atomically and point `folder.parent/latest` at it.

    `model` must have `save_pretrained` (a Hugging Face model) or a LoRA adapter (then only the
    adapter is saved, `lora.save_adapter`); `save_tokenizer`, when given, is
    saved next to the weights so `folder/model` loads on its own. `extra` must be JSON-able.
    `write_optimizer(temp_folder)`, when given, writes the optimizer state instead of
    `optimizer.pt` (ranked trainers: a sharded folder, trainer/parallel/state.py).
    An existing `folder` is replaced. Returns the folder.
    """
    folder = Path(folder)
    root = folder.parent
    extra = dict(extra or {})
    try:
        state_text = json.dumps({"step": int(step), "extra": extra}, indent=2, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"checkpoint extra must be JSON-serialisable (finite numbers): {exc}") from exc
    root.mkdir(parents=True, exist_ok=True)
    temp = root / f"{_TEMP_PREFIX}{folder.name}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    temp.mkdir()
    try:
        if has_adapter(model):  # the adapter alone: the frozen base is the run's starting model
            save_adapter(model, temp / MODEL_DIR)
        else:
            model.save_pretrained(temp / MODEL_DIR)  # type: ignore[operator]
        if save_tokenizer is not None:
            save_tokenizer.save_pretrained(temp / MODEL_DIR)
        if write_optimizer is not None:
            write_optimizer(temp)
        elif optimizer is not None:
            torch.save(optimizer.state_dict(), temp / "optimizer.pt")
        if scheduler is not None:
            torch.save(scheduler.state_dict(), temp / "scheduler.pt")
        torch.save(_rng_state(), temp / "rng.pt")
        (temp / "state.json").write_text(state_text, encoding="utf-8")
        files = _files_with_sizes(temp)
        for name in files:
            fsync_path(temp / name)
        marker = {"step": int(step), "files": files}
        (temp / MARKER).write_text(json.dumps(marker, indent=2), encoding="utf-8")
        fsync_path(temp / MARKER)
        fsync_path(temp)

        previous = None
        if folder.exists():
            previous = root / f"{_OLD_PREFIX}{folder.name}-{uuid.uuid4().hex[:8]}"
            os.replace(folder, previous)
        os.replace(temp, folder)
        fsync_path(root)
    except BaseException:
        shutil.rmtree(temp, ignore_errors=True)
        raise
    _write_text_atomic(root / LATEST, folder.name + "\n")
    if previous is not None:
        shutil.rmtree(previous, ignore_errors=True)
    return folder


# ---------------------------------------------------------------- inspect


def _read_marker(folder: Path) -> dict[str, Any]:
    marker = folder / MARKER
    if not marker.is_file():
        raise CheckpointError(
            f"{marker}: missing; {folder} is not a complete checkpoint (a save was interrupted, or "
            "this is a run root: use latest_checkpoint(root))"
        )
    try:
        data = json.loads(marker.read_text(encoding="utf-8"))
        int(data["step"])
        dict(data["files"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{marker}: unreadable completion marker ({exc}); the checkpoint is corrupt") from exc
    return data


def _is_complete(folder: Path) -> bool:
    try:
        _read_marker(folder)
    except CheckpointError:
        return False
    return True


def list_checkpoints(root: str | Path) -> list[Path]:
    """The complete checkpoints under `root`, oldest first (by step, then name)."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        if child.is_dir() and not child.name.startswith(".") and _is_complete(child):
            found.append((int(_read_marker(child)["step"]), child.name, child))
    return [path for _, _, path in sorted(found)]


def latest_checkpoint(root: str | Path) -> Path | None:
    """The checkpoint `root/latest` names when it is complete, else the newest complete one."""
    root = Path(root)
    pointer = root / LATEST
    if pointer.is_file():
        name = pointer.read_text(encoding="utf-8").strip()
        if name and (root / name).is_dir() and _is_complete(root / name):
            return root / name
    checkpoints = list_checkpoints(root)
    return checkpoints[-1] if checkpoints else None


def prune_checkpoints(root: str | Path, keep: int) -> list[Path]:
    """Delete all but the newest `keep` complete checkpoints (never the `latest` one), and the
    leftovers of interrupted saves by other processes. Returns the deleted folders."""
    if keep < 1:
        raise ValueError(f"keep must be >= 1, got {keep}")
    root = Path(root)
    checkpoints = list_checkpoints(root)
    protected = set(checkpoints[-keep:])
    latest = latest_checkpoint(root)
    if latest is not None:
        protected.add(latest)
    doomed = [path for path in checkpoints if path not in protected]
    own_temp = f"-{os.getpid()}-"
    if root.is_dir():
        for child in root.iterdir():
            leftover = child.name.startswith(_OLD_PREFIX) or (
                child.name.startswith(_TEMP_PREFIX) and own_temp not in child.name
            )
            if leftover and child.is_dir():
                doomed.append(child)
    for path in doomed:
        shutil.rmtree(path, ignore_errors=True)
    return doomed


# ---------------------------------------------------------------- load


def _load_file(path: Path) -> Any:
    if not path.is_file():
        raise CheckpointError(f"{path}: missing from the checkpoint")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # pickle, zip and tensor errors all mean the same: a corrupt file
        raise CheckpointError(f"{path}: cannot be read ({exc}); the checkpoint is corrupt") from exc


def read_weights(model_dir: Path) -> dict[str, torch.Tensor]:
    """The safetensors weights of a Hugging Face folder (one file or an index of shards)."""
    from safetensors.torch import load_file

    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
        except (OSError, ValueError, KeyError) as exc:
            raise CheckpointError(f"{index}: unreadable shard index ({exc})") from exc
    else:
        shards = ["model.safetensors"]
    state: dict[str, torch.Tensor] = {}
    for shard in shards:
        path = model_dir / shard
        if not path.is_file():
            raise CheckpointError(f"{path}: missing from the checkpoint")
        try:
            state.update(load_file(str(path)))
        except Exception as exc:
            raise CheckpointError(f"{path}: cannot be read ({exc}); the checkpoint is corrupt") from exc
    return state


def _load_model_weights(model_dir: Path, model: torch.nn.Module) -> None:
    """Copy the safetensors weights in `model_dir` into `model`, in place (the optimizer keeps
    pointing at the same parameters). A LoRA checkpoint holds only the adapter."""
    if is_adapter_folder(model_dir):
        load_adapter(model, model_dir)
        return
    if has_adapter(model):
        raise CheckpointError(f"{model_dir}: full model weights, but the model trains a LoRA adapter; resume a run "
                              "with the trainer.lora it was started with")
    state = read_weights(model_dir)
    own = model.state_dict()
    loaded_storage = {own[key].data_ptr() for key in state if key in own}
    # Tied weights (lm_head = embeddings) are saved once; the other name shares its storage.
    missing = [key for key in own if key not in state and own[key].data_ptr() not in loaded_storage]
    unexpected = [key for key in state if key not in own]
    if not missing and not unexpected:
        try:
            model.load_state_dict(state, strict=False)
        except RuntimeError as exc:
            raise CheckpointError(f"{model_dir}: weights do not fit the model ({exc})") from exc
        return
    # Names differ when transformers converts weights on save (e.g. fused experts): let it load
    # the folder its own way, then copy the result.
    try:
        fresh = type(model).from_pretrained(model_dir, dtype=next(model.parameters()).dtype)  # type: ignore[attr-defined]
        model.load_state_dict(fresh.state_dict())
    except Exception as exc:
        raise CheckpointError(
            f"{model_dir}: weights do not fit the model (missing {missing[:3]}, unexpected {unexpected[:3]}): {exc}"
        ) from exc


def load_training_state(
    folder: str | Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    scheduler: Any | None,
    read_weights_into: Callable[[Path], None] | None = None,
) -> tuple[int, dict[str, Any]]:
    """Restore a checkpoint into `model`, `optimizer` and `scheduler` (either may be None) and
    the RNG states. Returns (step, extra). A missing or corrupt file raises CheckpointError
    naming it. `read_weights_into(model_dir)`, when given, loads the weights instead (ranked
    trainers); the optimizer state is `optimizer.pt` or a sharded folder, loaded into any layout
    (trainer/parallel/state.py `load_optimizer`)."""
    folder = Path(folder)
    marker = _read_marker(folder)
    for name, size in marker["files"].items():
        path = folder / name
        if not path.is_file():
            raise CheckpointError(f"{path}: missing from the checkpoint")
        if path.stat().st_size != size:
            raise CheckpointError(
                f"{path}: {path.stat().st_size} bytes, the marker says {size}; truncated or corrupt"
            )
    state_path = folder / "state.json"
    try:
        state = json.loads(state_path.read_text(encoding="utf-8"))
        step, extra = int(state["step"]), dict(state["extra"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{state_path}: unreadable ({exc}); the checkpoint is corrupt") from exc

    if read_weights_into is not None:
        read_weights_into(folder / MODEL_DIR)
    else:
        _load_model_weights(folder / MODEL_DIR, model)
    if optimizer is not None:
        from tidal.trainer.parallel.state import load_optimizer

        load_optimizer(model, optimizer, folder)
    if scheduler is not None:
        scheduler.load_state_dict(_load_file(folder / "scheduler.pt"))
    rng = _load_file(folder / "rng.pt")
    try:
        _set_rng_state(rng)
    except (KeyError, TypeError, ValueError, RuntimeError) as exc:
        raise CheckpointError(f"{folder / 'rng.pt'}: invalid RNG state ({exc})") from exc
    return step, extra
