"""Import a GGUF checkpoint into a plain Hugging Face folder, and describe a model folder.

`transformers` reads a GGUF file (with the `gguf` and `accelerate` packages), dequantising every
tensor to float32, and builds the tokenizer from the file's metadata. A model loaded that way
refuses `save_pretrained`, so the import builds a plain model from the same config (without the
GGUF `quantization_config`), copies the state dict into it and saves that: safetensors weights,
config.json, a generation config (bos/eos/pad from the tokenizer), and the tokenizer with its chat
template. The result is an ordinary folder that `transformers` and vLLM load without tidal.

Every import is checked before it is kept: the written folder is reloaded with plain
`transformers` (`local_files_only`, no tidal code path), and its token ids and logits on a few
prompts (rendered through the chat template when there is one) are compared with the GGUF-loaded
model's. The largest absolute logit difference is returned and recorded in `tidal_import.json`
inside the folder; above the tolerance the import fails with `ImportCheckError`. Everything is
written to a temporary folder beside the target and renamed into place only after the check, so a
failed import leaves nothing behind and the presence of `tidal_import.json` marks a finished one.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import os
import shutil
import struct
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import transformers
from safetensors import SafetensorError, safe_open
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    GenerationConfig,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)
from transformers.initialization import no_init_weights

from tidal.errors import ModelLoadError

IMPORT_RECORD = "tidal_import.json"
GGUF_MAGIC = b"GGUF"
# The copy is exact (same float32 tensors, same code), so any real difference is a wrong config
# (rope, tied embeddings, head layout): those show up as differences of order 1, not 1e-3.
DEFAULT_TOLERANCE = 1e-3
CHECK_PROMPTS: tuple[tuple[dict[str, str], ...], ...] = (
    ({"role": "user", "content": "What is 12 + 7? Answer with a number."},),
    (
        {"role": "system", "content": "You are a careful assistant."},
        {"role": "user", "content": "Write a Python function that reverses a string."},
    ),
    ({"role": "user", "content": "Name the capital of France, then explain why in one sentence."},),
)
_DTYPE_NAMES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16", "I64": "int64",
                "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool"}


class ModelImportError(ModelLoadError):
    """A GGUF file that cannot be imported (missing, not a GGUF, an architecture transformers
    cannot read), or a target folder the import may not write."""


class ImportCheckError(ModelImportError):
    """The written folder does not reproduce the GGUF-loaded model (token ids or logits differ)."""

    def __init__(self, message: str, max_diff: float = math.nan, tolerance: float = DEFAULT_TOLERANCE) -> None:
        self.max_diff, self.tolerance = max_diff, tolerance
        super().__init__(message)


@dataclass(frozen=True)
class ImportResult:
    """What an import wrote and how well the written folder reproduces the GGUF-loaded model."""

    folder: Path
    source: Path
    source_sha256: str
    max_logit_diff: float  # max |logit difference| over every prompt, position and vocabulary id
    tolerance: float
    prompts: int
    seconds: float
    extra: dict[str, Any] = field(default_factory=dict)  # caller's provenance, e.g. the package

    def record(self) -> dict[str, Any]:
        """The JSON form written to `tidal_import.json`."""
        record = asdict(self)
        record.update(folder=str(self.folder), source=str(self.source), transformers=transformers.__version__)
        return record


def import_gguf(
    source: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    force: bool = False,
    tolerance: float = DEFAULT_TOLERANCE,
    extra: dict[str, Any] | None = None,
) -> ImportResult:
    """Import the GGUF file `source` into the Hugging Face folder `out`, checked, atomically.

    An existing non-empty `out` is refused unless `force`, in which case it is replaced only once
    the new folder passed its check. `extra` is added to the folder's `tidal_import.json`.
    Raises `ModelImportError` for bad input and `ImportCheckError` when the check fails.
    """
    started = time.monotonic()
    path = check_gguf_file(source)
    target = _check_target(Path(out).expanduser().resolve(), force)
    digest = sha256_of(path)
    model, tokenizer = load_gguf(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    staging.chmod(0o755)  # mkdtemp makes it private; the folder is a model others may read
    try:
        write_folder(model, tokenizer, staging)
        try:
            max_diff = check_import(model, tokenizer, staging, tolerance)
        except ImportCheckError as error:
            raise ImportCheckError(f"{error}; {target} was left as it was", error.max_diff, tolerance) from None
        result = ImportResult(
            folder=target, source=path, source_sha256=digest, max_logit_diff=max_diff, tolerance=tolerance,
            prompts=len(CHECK_PROMPTS), seconds=round(time.monotonic() - started, 2), extra=dict(extra or {}),
        )
        (staging / IMPORT_RECORD).write_text(json.dumps(result.record(), indent=2) + "\n", encoding="utf-8")
        _move_into_place(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return result


def check_gguf_file(source: str | os.PathLike[str]) -> Path:
    """The absolute path of `source` after checking it is a readable file that starts like a GGUF."""
    path = Path(source).expanduser().resolve()
    if not path.exists():
        raise ModelImportError(f"{path} does not exist; give the path of a .gguf file")
    if not path.is_file():
        raise ModelImportError(f"{path} is not a file; give the path of a .gguf file, not a folder")
    with path.open("rb") as handle:
        magic = handle.read(len(GGUF_MAGIC))
    if magic != GGUF_MAGIC:
        raise ModelImportError(
            f"{path} is not a GGUF file (it starts with {magic!r}, a GGUF with {GGUF_MAGIC!r}); "
            "a Hugging Face folder needs no import: set model.path to it directly"
        )
    return path


def load_gguf(path: Path) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The GGUF file's model (dequantised to float32, eval mode) and tokenizer, through transformers."""
    try:
        tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(
            path.parent, gguf_file=path.name, dtype=torch.float32, local_files_only=True
        )
    except ImportError as error:
        raise ModelImportError(
            f"{path}: reading GGUF needs the gguf and accelerate packages ({error}); pip install gguf accelerate"
        ) from error
    # struct.error and IndexError: a file cut short; the others: what transformers raises for an
    # architecture or tokenizer it does not read.
    except (ValueError, OSError, KeyError, IndexError, TypeError, RuntimeError, NotImplementedError, struct.error) as error:
        from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

        raise ModelImportError(
            f"{path}: transformers {transformers.__version__} cannot load this GGUF as a causal LM "
            f"({type(error).__name__}: {error}); it reads these architectures: "
            f"{', '.join(sorted(GGUF_SUPPORTED_ARCHITECTURES))}. A truncated download also ends here: "
            "check the file's size and checksum"
        ) from error
    return model.eval(), tokenizer


def write_folder(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, folder: Path) -> None:
    """Save `model` (GGUF-loaded) and `tokenizer` into `folder` as a plain Hugging Face checkpoint."""
    config = copy.deepcopy(model.config)
    if hasattr(config, "quantization_config"):
        # Kept, it would make transformers treat the safetensors folder as a GGUF on every load.
        del config.quantization_config
    config.architectures = [type(model).__name__]
    config.dtype = torch.float32
    with no_init_weights():  # random init of every weight, only to overwrite it, costs seconds
        plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.tie_weights()
    plain.load_state_dict(model.state_dict(), strict=True)
    plain.generation_config = _generation_config(tokenizer, config)
    plain.save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)


def _generation_config(tokenizer: PreTrainedTokenizerBase, config: PretrainedConfig) -> GenerationConfig:
    """bos/eos/pad ids from the tokenizer (the config's where the tokenizer has none); pad falls
    back to eos, as generation needs one."""
    bos = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else getattr(config, "bos_token_id", None)
    eos = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else getattr(config, "eos_token_id", None)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    return GenerationConfig(bos_token_id=bos, eos_token_id=eos, pad_token_id=pad)


def check_import(
    reference: PreTrainedModel,
    reference_tokenizer: PreTrainedTokenizerBase,
    folder: Path,
    tolerance: float = DEFAULT_TOLERANCE,
) -> float:
    """Reload `folder` with plain transformers and compare it with `reference` on `CHECK_PROMPTS`.

    The reloaded tokenizer must have the same chat template and give the same ids; the largest
    absolute logit difference is returned, and one above `tolerance` (or NaN) raises
    `ImportCheckError`.
    """
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True, dtype=torch.float32).eval()
    except (OSError, ValueError, KeyError, TypeError, RuntimeError, SafetensorError) as error:
        raise ImportCheckError(f"{folder}: the written folder does not load with plain transformers ({error})") from error
    if tokenizer.chat_template != reference_tokenizer.chat_template:
        raise ImportCheckError(f"{folder}: the saved tokenizer's chat template differs from the GGUF file's")
    limit = getattr(reference.config.get_text_config(), "max_position_embeddings", None) or 1_000_000
    # The chat template writes any bos token itself; a plain prompt gets the tokenizer's own.
    add_special = not reference_tokenizer.chat_template
    worst = 0.0
    for index, text in enumerate(_prompt_texts(reference_tokenizer)):
        ids = list(reference_tokenizer.encode(text, add_special_tokens=add_special))[:limit]
        reloaded_ids = list(tokenizer.encode(text, add_special_tokens=add_special))[:limit]
        if ids != reloaded_ids:
            first = next((i for i, (a, b) in enumerate(zip(ids, reloaded_ids)) if a != b), min(len(ids), len(reloaded_ids)))
            raise ImportCheckError(
                f"{folder}: the saved tokenizer encodes check prompt {index} differently from the GGUF "
                f"tokenizer ({len(reloaded_ids)} ids against {len(ids)}, the first difference at position {first})"
            )
        with torch.inference_mode():
            batch = torch.tensor([ids])
            expected = reference(batch).logits.float()  # (1, T, V)
            actual = model(batch).logits.float()  # (1, T, V)
        diff = float((expected - actual).abs().max())
        worst = diff if math.isnan(diff) else max(worst, diff)
        if not worst <= tolerance:
            raise ImportCheckError(
                f"{folder}: the written folder does not reproduce the GGUF model: max |logit difference| "
                f"{worst:.3g} > tolerance {tolerance:g} on check prompt {index}",
                worst,
                tolerance,
            )
    return worst


def _prompt_texts(tokenizer: PreTrainedTokenizerBase) -> list[str]:
    """The check prompts as text: through the chat template, or the messages' contents joined."""
    if tokenizer.chat_template:
        return [
            tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=True)
            for messages in CHECK_PROMPTS
        ]
    return ["\n".join(message["content"] for message in messages) for messages in CHECK_PROMPTS]


def _check_target(target: Path, force: bool) -> Path:
    if target.is_file() or target.is_symlink():
        raise ModelImportError(f"--out {target} is a file; give a folder path (new, empty, or replaced with --force)")
    if target.is_dir() and any(target.iterdir()) and not force:
        raise ModelImportError(f"--out {target} exists and is not empty; choose another folder or pass --force to replace it")
    return target


def _move_into_place(staging: Path, target: Path) -> None:
    """Rename `staging` to `target`; an existing `target` is moved aside first (a folder cannot be
    replaced in one rename) and removed after."""
    if not target.exists():
        os.replace(staging, target)
        return
    retired = target.parent / f".{target.name}.old-{uuid.uuid4().hex[:8]}"
    os.replace(target, retired)
    os.replace(staging, target)
    shutil.rmtree(retired, ignore_errors=True)


def sha256_of(path: Path) -> str:
    """Hex sha256 of a file, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def read_import_record(folder: Path) -> dict[str, Any] | None:
    """The folder's `tidal_import.json`, or None when it has none (or an unreadable one)."""
    try:
        record = json.loads((folder / IMPORT_RECORD).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def model_info(folder: str | os.PathLike[str]) -> dict[str, Any]:
    """What a Hugging Face model folder holds, read from config.json, the safetensors headers (no
    weights are loaded) and the tokenizer: architecture, parameters, context length, dtype, sizes,
    tied embeddings, chat template, special tokens, and the import record when tidal imported it."""
    path = Path(folder).expanduser().resolve()
    if not (path / "config.json").is_file():
        raise ModelLoadError(f"{path} has no config.json, so it is not a Hugging Face model folder")
    try:
        config = AutoConfig.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError, KeyError) as error:
        raise ModelLoadError(f"{path / 'config.json'}: not a config this transformers version reads ({error})") from error
    text = config.get_text_config()
    weights = _weights_summary(path)
    return {
        "folder": str(path),
        "architecture": ", ".join(getattr(config, "architectures", None) or []) or None,
        "model_type": config.model_type,
        "parameters": weights["parameters"],
        "context_length": getattr(text, "max_position_embeddings", None),
        "dtype": weights["dtype"],
        "vocab_size": getattr(text, "vocab_size", None),
        "hidden_size": getattr(text, "hidden_size", None),
        "num_layers": getattr(text, "num_hidden_layers", None),
        "num_attention_heads": getattr(text, "num_attention_heads", None),
        "num_key_value_heads": getattr(text, "num_key_value_heads", None),
        "tied_embeddings": bool(getattr(config, "tie_word_embeddings", False)),
        "weight_files": weights["files"],
        "weight_bytes": weights["bytes"],
        **_tokenizer_summary(path),
        "import": read_import_record(path),
    }


def _weights_summary(folder: Path) -> dict[str, Any]:
    """Parameter count and dtype from the safetensors headers; tied tensors are stored, and so
    counted, once. Folders with only pytorch_model*.bin report no count (reading one means
    loading it)."""
    files = sorted(folder.glob("*.safetensors"))
    others = sorted(folder.glob("pytorch_model*.bin"))
    summary: dict[str, Any] = {
        "files": [p.name for p in files or others],
        "bytes": sum(p.stat().st_size for p in files or others),
        "parameters": None,
        "dtype": None,
    }
    if not files:
        return summary
    count, dtypes = 0, set()
    for file in files:
        try:
            with safe_open(str(file), framework="pt") as handle:
                for key in handle.keys():
                    tensor = handle.get_slice(key)
                    count += math.prod(tensor.get_shape())
                    dtypes.add(_DTYPE_NAMES.get(tensor.get_dtype(), tensor.get_dtype().lower()))
        except (OSError, SafetensorError) as error:
            raise ModelLoadError(f"{file}: not a readable safetensors file ({error}); it may be truncated") from error
    summary.update(parameters=count, dtype=", ".join(sorted(dtypes)) or None)
    return summary


def _tokenizer_summary(folder: Path) -> dict[str, Any]:
    """Chat template presence and the bos/eos/pad/unk tokens with their ids."""
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ModelLoadError(f"{folder}: cannot load the tokenizer ({error}); is tokenizer.json there?") from error
    special = {}
    for role in ("bos", "eos", "pad", "unk"):
        token = getattr(tokenizer, f"{role}_token", None)
        special[role] = None if token is None else {"token": str(token), "id": getattr(tokenizer, f"{role}_token_id")}
    return {
        "tokenizer_size": len(tokenizer),
        "chat_template": bool(getattr(tokenizer, "chat_template", None)),
        "special_tokens": special,
    }
