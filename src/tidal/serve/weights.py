"""`tidal serve`'s weight reload endpoint and prompt logprobs: what an RL trainer driving the
server through the HTTP engine (rollout/http_engine.py) needs besides generation.

- `POST /v1/weights` loads a publication: JSON `{"version", "checksum", "path"}` (a safetensors
  file, or a folder of them, under the server's `--weights-dir`) or the safetensors bytes as the
  body (`Content-Type: application/octet-stream`, `?version=V&checksum=C`). The server copies
  the tensors into its model, hashes what its model now holds for those names
  (`rollout.checksum.state_checksum`) and answers `{"object": "weights", "version", "checksum",
  "tensors"}`; on a mismatch it answers 409 `checksum_mismatch` and serves nothing (503
  `weights_unverified`) until a reload succeeds. Off unless the server was started with
  `--allow-weight-updates` (403).
- `GET /v1/weights`: `{"object": "weights", "version", "checksum"}` (checksum null before any reload).
- `prompt_logprobs` (vLLM's field) on /v1/completions: per prompt position, the logprob of the
  prompt token given the ones before it (raw logits, temperature 1; the first position is null),
  with its rank and the `k` most likely alternatives.

Reloads and generation never overlap: the batcher's engine is wrapped in `GuardedEngine`, whose
`generate` holds the same lock a reload takes. (The batcher's extra `top_logprobs` forward runs
after `generate` returns, outside the lock; a reload landing in between would change those
alternatives, never the sampled tokens or their logprobs.)
"""

from __future__ import annotations

import asyncio
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from tidal.rollout.protocol import UNLOADED
from tidal.serve.schemas import ApiError

CHECKSUM = re.compile(r"^[0-9a-f]{64}$")


class GuardedEngine:
    """The engine as the batcher sees it: `generate` under `lock`, everything else passed through."""

    def __init__(self, engine: Any, lock: threading.Lock) -> None:
        self._engine, self._lock = engine, lock

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            return self._engine.generate(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)


@dataclass
class WeightUpdates:
    """The server's side of weight publication: whether reloads are allowed, from where, and the
    checksum of the last verified reload."""

    allowed: bool = False
    weights_dir: Path | None = None  # JSON reloads read paths under it only; None: JSON reloads refused
    max_upload_bytes: int = 16 << 30
    lock: threading.Lock = field(default_factory=threading.Lock)
    checksum: str | None = None

    def describe(self, engine: Any) -> dict[str, Any]:
        return {"object": "weights", "version": engine.weight_version, "checksum": self.checksum}


async def reload_weights(updates: WeightUpdates, engine: Any, request: Request) -> Response:
    """The POST /v1/weights handler (see the module docstring)."""
    if not updates.allowed:
        raise ApiError(403, "weight updates are off on this server; start it with --allow-weight-updates",
                       type="permission_error", code="weight_updates_disabled")
    if request.headers.get("content-type", "").startswith("application/octet-stream"):
        version, checksum = _version(request.query_params.get("version")), _checksum(request.query_params.get("checksum"))
        blob = await _body(request, updates.max_upload_bytes)
        tensors = _parse(lambda: _load_bytes(blob), "the uploaded body")
    else:
        body = await _json(request)
        version, checksum = _version(body.get("version")), _checksum(body.get("checksum"))
        path = _allowed_path(updates, body.get("path"))
        tensors = _parse(lambda: _load_path(path), str(path))
    loaded = await asyncio.to_thread(_install, updates, engine, tensors, version, checksum)
    if loaded != checksum:
        raise ApiError(409, f"weight version {version}: checksum mismatch (loaded {loaded[:12]}, published {checksum[:12]}); "
                       "this server serves nothing until a reload succeeds", code="checksum_mismatch", param="checksum")
    return JSONResponse({**updates.describe(engine), "tensors": len(tensors)})


def _install(updates: WeightUpdates, engine: Any, tensors: dict[str, torch.Tensor], version: int, checksum: str) -> str:
    """Copy `tensors` into the model (no generation meanwhile), hash what the model now holds and,
    when that is `checksum`, make `version` current (before any generation sees the new weights)."""
    with updates.lock:
        updates.checksum = None
        try:  # UNLOADED (generation refused) until the checksum is confirmed
            loaded = engine.load_verified(tensors, version, checksum)
        except ValueError as error:  # unknown names or shapes: nothing (or part) was copied
            engine.weight_version = UNLOADED
            raise ApiError(400, f"weight version {version}: {error}", code="invalid_weights") from None
        if loaded == checksum:
            updates.checksum = loaded
        return loaded


def require_verified(engine: Any) -> None:
    """Refuse to generate after a reload that failed its checksum (or while one runs)."""
    if engine.weight_version == UNLOADED:
        raise ApiError(503, "the server holds no verified weights (the last reload failed its checksum, or one is "
                       "running); reload them", type="server_error", code="weights_unverified")


@torch.inference_mode()
def prompt_logprobs(engine: Any, lock: threading.Lock, prompts: list[list[int]], top: int) -> tuple[list[list[Any]], int]:
    """vLLM-shaped prompt logprobs of each prompt, and the weight version they were computed with."""
    model, device = engine.model, engine.device
    out = []
    with lock:
        version = engine.weight_version
        was_training = model.training
        model.eval()
        try:
            for ids in prompts:
                logits = model(input_ids=torch.tensor([ids], device=device)).logits[0, :-1].float()  # (T-1, V)
                logp = torch.log_softmax(logits, dim=-1)
                targets = torch.tensor(ids[1:], device=device)
                chosen = logp.gather(1, targets[:, None]).squeeze(1)  # (T-1,)
                ranks = (logp > chosen[:, None]).sum(dim=-1) + 1
                best = logp.topk(top, dim=-1) if top else None
                entries: list[Any] = [None]
                for t, token in enumerate(ids[1:]):
                    entry = {str(token): _entry(engine, token, float(chosen[t]), int(ranks[t]))}
                    if best is not None:
                        for rank, (value, alt) in enumerate(zip(best.values[t].tolist(), best.indices[t].tolist()), 1):
                            entry.setdefault(str(alt), _entry(engine, alt, value, rank))
                    entries.append(entry)
                out.append(entries)
        finally:
            model.train(was_training)
    return out, version


def _entry(engine: Any, token: int, logprob: float, rank: int) -> dict[str, Any]:
    return {"logprob": logprob, "rank": rank, "decoded_token": engine.tokenizer.decode([token])}


def _version(value: Any) -> int:
    if isinstance(value, str) and value.isdigit():
        value = int(value)
    if type(value) is not int or value < 0:
        raise ApiError(400, f"version must be an integer >= 0, got {value!r}", param="version")
    return value


def _checksum(value: Any) -> str:
    if not isinstance(value, str) or not CHECKSUM.match(value):
        raise ApiError(400, "checksum must be the SHA-256 hex digest (64 lowercase hex digits) of the state", param="checksum")
    return value


def _allowed_path(updates: WeightUpdates, value: Any) -> Path:
    if not isinstance(value, str) or not value:
        raise ApiError(400, "path must name a safetensors file or folder (or upload the bytes as "
                       "application/octet-stream)", param="path")
    if updates.weights_dir is None:
        raise ApiError(403, "reloads from a path are off: start the server with --weights-dir DIR (or upload the "
                       "bytes)", type="permission_error", code="weights_dir_unset", param="path")
    root, path = updates.weights_dir.resolve(), Path(value).resolve()
    if path != root and root not in path.parents:
        raise ApiError(403, f"{value} is outside this server's --weights-dir", type="permission_error", param="path")
    if not path.exists():
        raise ApiError(400, f"{value} does not exist on the server", param="path", code="not_found")
    return path


def _load_path(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    files = sorted(path.glob("*.safetensors")) if path.is_dir() else [path]
    if not files:
        raise ValueError("no *.safetensors files in the folder")
    state: dict[str, torch.Tensor] = {}
    for file in files:
        state.update(load_file(str(file)))
    return state


def _load_bytes(blob: bytes) -> dict[str, torch.Tensor]:
    from safetensors.torch import load

    return load(blob)


def _parse(load: Any, what: str) -> dict[str, torch.Tensor]:
    try:
        state = load()
    except Exception as error:  # safetensors raises its own errors for a corrupt file  # noqa: BLE001
        raise ApiError(400, f"{what} is not a readable safetensors state ({error})", code="invalid_weights") from None
    if not state:
        raise ApiError(400, f"{what} holds no tensors", code="invalid_weights")
    return state


async def _body(request: Request, limit: int) -> bytes:
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise ApiError(413, f"the upload exceeds {limit} bytes", code="request_too_large")
        chunks.append(chunk)
    return b"".join(chunks)


async def _json(request: Request) -> dict[str, Any]:
    import json

    try:
        body = json.loads(await _body(request, 1 << 20))
    except (ValueError, UnicodeDecodeError):
        raise ApiError(400, "the request body is not valid JSON", code="invalid_json") from None
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    return body
