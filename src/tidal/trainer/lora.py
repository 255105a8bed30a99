"""LoRA through peft: the adapter that trains instead of the full weights (`trainer.lora`).

`apply_lora` injects peft's LoRA layers into the Hugging Face model in place
(`peft.inject_adapter_in_model`): the model stays the same object, a `PreTrainedModel`, so the
engine that shares it with the trainer, `split_model` (the LM head is never adapted: all-linear
leaves it out, and naming it while it is tied to the embeddings is refused) and checkpointing see
one model. Only the adapter's parameters require grad; the base weights stay frozen, bit for bit.

What the rest of tidal reads from an adapted model:
- the KL reference is the base model, the adapter switched off (`adapter_disabled`): no copy;
- rollout gets either the merged weights in the plain model's layout (`merged_state_dict`,
  base + scale * B @ A, computed without touching the trained model; the worker holds a
  `plain_copy`) or the adapter's tensors alone (`adapter_state_dict`; the worker holds a copy with
  the same adapter layers on the same frozen base);
- a checkpoint holds the adapter in peft's own format (`save_adapter`, `load_adapter`:
  adapter_model.safetensors and adapter_config.json, loadable by `peft.PeftModel.from_pretrained`
  on the base), and the exported policy is the merged model saved as a plain Hugging Face folder
  (`plain_copy`), which transformers loads without peft;
- a weight-space merge (`merge.weight` < 1) scales the adapter's update (`AdapterMerge`), which
  is exactly anchor + weight * (trained - anchor) since the base never moves.
"""

from __future__ import annotations

import contextlib
import copy
import json
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import Tensor

from tidal.config.scale import LoraConfig
from tidal.errors import CheckpointError

ADAPTER = "default"  # the one adapter's name inside peft's layers
ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"
PEFT_PREFIX = "base_model.model."  # what a PeftModel's saved adapter names start with


def _tuner_layer_type() -> type:
    from peft.tuners.lora import LoraLayer

    return LoraLayer


def lora_layers(model: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """The modules of `model` that carry a LoRA adapter, by their qualified names."""
    layer_type = _tuner_layer_type()
    return {name: module for name, module in model.named_modules() if isinstance(module, layer_type)}


def has_adapter(model: object) -> bool:
    """Whether `model` carries LoRA layers (without importing peft when it cannot). Anything but a
    module (e.g. the checkpoint's policy-and-critic pair) carries none."""
    if not isinstance(model, torch.nn.Module):
        return False
    if not any(".lora_" in name for name, _ in model.named_parameters()):
        return False
    return bool(lora_layers(model))


def linear_layers(model: torch.nn.Module) -> dict[str, tuple[int, int]]:
    """(in, out) features of every linear layer of `model` but its LM head, by qualified name:
    `nn.Linear`s and GPT-2's `Conv1D`s (a linear layer with its weight transposed). What
    all-linear adapts. An MoE's experts are not among them: transformers 5 keeps each layer's
    experts as one stacked parameter, not as linear layers."""
    from transformers.pytorch_utils import Conv1D

    get_head = getattr(model, "get_output_embeddings", None)
    head = get_head() if callable(get_head) else None
    layers = {}
    for name, module in model.named_modules():
        if module is head:
            continue
        if isinstance(module, torch.nn.Linear):
            layers[name] = (module.in_features, module.out_features)
        elif isinstance(module, Conv1D):
            layers[name] = (module.nx, module.nf)
    return layers


def _head_name(model: torch.nn.Module) -> str | None:
    get_head = getattr(model, "get_output_embeddings", None)
    head = get_head() if get_head is not None else None
    return next((name for name, module in model.named_modules() if module is head), None) if head is not None else None


def apply_lora(model: torch.nn.Module, cfg: LoraConfig, seed: int | None = None) -> torch.nn.Module:
    """Inject a LoRA adapter per `cfg` into `model` in place, freeze everything else, and return
    `model`. `seed`, when given, draws the adapter's initial A matrices from it (B starts at 0, so
    the adapted model starts as the base) without touching the global generator: a resumed run
    gets the same adapter as an uninterrupted one. Raises ValueError when no module matches `cfg.target_modules`, when the targets name
    the LM head while it is tied to the input embeddings, when they reach an MoE's stacked expert or
    router parameters, or when `model` already has an adapter."""
    import peft
    from peft.tuners.lora import ParamWrapper

    if has_adapter(model):
        raise ValueError(f"{type(model).__name__} already carries a LoRA adapter; apply trainer.lora once")
    # all-linear by name: given the word, peft (on transformers 5) also wraps an MoE's stacked expert
    # parameters and its routers, which the merged weights (`merged_state_dict`) cannot express.
    targets: str | list[str] = sorted(linear_layers(model)) if cfg.target_modules == "all-linear" else list(cfg.target_modules)
    head = _head_name(model)
    tied = bool(getattr(getattr(model, "config", None), "tie_word_embeddings", False))
    if head is not None and tied and isinstance(targets, list):
        named = [t for t in targets if head == t or head.endswith(f".{t}")]
        if named:
            raise ValueError(f"trainer.lora.target_modules {named} names the LM head ({head}), which is tied to the "
                             "input embeddings: an adapter there would untie them. Leave it out (all-linear does)")
    config = peft.LoraConfig(r=cfg.r, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout, target_modules=targets,
                             bias="none")
    try:
        with torch.random.fork_rng(devices=[]):
            if seed is not None:
                torch.manual_seed(seed)
            peft.inject_adapter_in_model(config, model, adapter_name=ADAPTER)
    except ValueError as error:
        raise ValueError(f"trainer.lora.target_modules={cfg.target_modules!r}: {error}") from error
    layers = lora_layers(model)
    if not layers:
        raise ValueError(f"trainer.lora.target_modules={cfg.target_modules!r} matched no module of {type(model).__name__}")
    # peft wraps a stacked parameter (an MoE layer's experts, its router) in a ParamWrapper
    parameters = sorted(name for name, layer in layers.items() if isinstance(layer, ParamWrapper))
    if parameters:
        raise ValueError(
            f"trainer.lora.target_modules={cfg.target_modules!r} reach {', '.join(parameters[:3])}: MoE experts or "
            "routers, which transformers 5 keeps as stacked parameters, not linear layers; tidal's LoRA adapts linear "
            "layers only (all-linear takes every one but the LM head), so leave these names out")
    prefixes = _adapter_prefixes(layers)
    for name, parameter in model.named_parameters():
        parameter.requires_grad_(name.startswith(prefixes))
    return model


def _adapter_prefixes(layers: dict[str, torch.nn.Module]) -> tuple[str, ...]:
    """`name.lora_A.` and the like: where each layer's adapter tensors live in the state dict."""
    return tuple(f"{name}.{part}." for name, layer in layers.items() for part in layer.adapter_layer_names)


@contextlib.contextmanager
def adapter_disabled(model: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """Within the block `model` computes as its base model (every adapter switched off); the
    adapters, and their requires_grad, are back after it."""
    layers = list(lora_layers(model).values())
    if not layers:
        raise ValueError(f"{type(model).__name__} has no LoRA adapter to disable")
    for layer in layers:
        layer.enable_adapters(False)
    try:
        yield model
    finally:
        for layer in layers:
            layer.enable_adapters(True)


def adapter_state_dict(model: torch.nn.Module) -> dict[str, Tensor]:
    """The adapter's tensors under `model`'s own state-dict names (`...q_proj.lora_A.default.weight`),
    detached but not copied."""
    prefixes = _adapter_prefixes(lora_layers(model))
    return {key: tensor for key, tensor in model.state_dict().items() if key.startswith(prefixes)}


def merged_state_dict(model: torch.nn.Module) -> dict[str, Tensor]:
    """The weights of the merged model (base + scale * B @ A per adapted layer) under the plain
    model's names (`...q_proj.weight`), computed in float32 and returned in each weight's dtype;
    `model` is not modified (unchanged tensors are the model's own, detached)."""
    layers = lora_layers(model)
    prefixes = _adapter_prefixes(layers)
    renames = {f"{name}.base_layer.": f"{name}." for name in layers}
    deltas: dict[str, Tensor] = {}
    with torch.no_grad():
        for name, layer in layers.items():
            if layer.merged:
                raise ValueError(f"{name}: the adapter is merged into the base layer already; unmerge it first")
            if ADAPTER in layer.lora_A and not layer.disable_adapters:
                deltas[f"{name}.base_layer.weight"] = layer.get_delta_weight(ADAPTER)
    merged: dict[str, Tensor] = {}
    for key, tensor in model.state_dict().items():
        if key.startswith(prefixes):
            continue
        delta = deltas.get(key)
        if delta is not None:
            tensor = (tensor.float() + delta.float()).to(tensor.dtype)
        plain = next((key.replace(old, new, 1) for old, new in renames.items() if key.startswith(old)), key)
        merged[plain] = tensor
    return merged


def plain_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of `model` without adapter layers, holding the merged weights: the plain model's
    architecture and layout (what a merged publication is loaded into, and what is exported)."""
    merged = merged_state_dict(model)
    plain = copy.deepcopy(model)
    for name in lora_layers(plain):
        parent_name, _, child = name.rpartition(".")
        parent = plain.get_submodule(parent_name) if parent_name else plain
        setattr(parent, child, getattr(parent, child).get_base_layer())
    if hasattr(plain, "peft_config"):
        del plain.peft_config
    with torch.no_grad():
        plain.load_state_dict(merged, strict=True)
    return plain


def rollout_copy(model: torch.nn.Module, publish: str) -> torch.nn.Module:
    """The model a rollout worker starts from: for `publish` merged a `plain_copy`, for adapter a
    copy with the adapter layers (the publications then carry the adapter's tensors alone)."""
    if publish not in ("merged", "adapter"):
        raise ValueError(f"trainer.lora.publish={publish!r}: known are merged, adapter")
    return plain_copy(model) if publish == "merged" else copy.deepcopy(model)


# ---------------------------------------------------------------- checkpoints


def save_adapter(model: torch.nn.Module, folder: Path) -> None:
    """Write the adapter into `folder` in peft's format (the weights without the adapter's name,
    and its config), as `peft.PeftModel.save_pretrained` would."""
    from peft import get_peft_model_state_dict
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    state = get_peft_model_state_dict(model, adapter_name=ADAPTER)
    # Under PeftModel's names (it wraps the model twice: PeftModel.base_model.model).
    save_file({PEFT_PREFIX + key: tensor.detach().contiguous().cpu() for key, tensor in state.items()},
              str(folder / ADAPTER_WEIGHTS), metadata={"format": "pt"})
    model.peft_config[ADAPTER].save_pretrained(str(folder))  # type: ignore[index, union-attr]


def is_adapter_folder(folder: Path) -> bool:
    return (folder / ADAPTER_WEIGHTS).is_file()


def read_adapter(model: torch.nn.Module, folder: Path) -> dict[str, Tensor]:
    """The adapter saved in `folder` (`save_adapter`) under `model`'s own state-dict names (those of
    `adapter_state_dict`), checked to fit `model`'s adapter. CheckpointError when it does not."""
    from safetensors.torch import load_file

    path = folder / ADAPTER_WEIGHTS
    if not has_adapter(model):
        raise CheckpointError(f"{path}: a LoRA adapter checkpoint, but the model has no adapter (set trainer.lora.enabled)")
    try:
        state = {key.removeprefix(PEFT_PREFIX): tensor for key, tensor in load_file(str(path)).items()}
        saved = json.loads((folder / ADAPTER_CONFIG).read_text(encoding="utf-8"))
    except Exception as error:  # safetensors, JSON and OS errors all mean the same: unreadable
        raise CheckpointError(f"{folder}: unreadable adapter checkpoint ({error})") from error
    own = model.peft_config[ADAPTER]  # type: ignore[index, union-attr]
    if (saved.get("r"), saved.get("lora_alpha")) != (own.r, own.lora_alpha):
        raise CheckpointError(f"{folder}: adapter of r={saved.get('r')}, alpha={saved.get('lora_alpha')}; the model's "
                              f"is r={own.r}, alpha={own.lora_alpha} (trainer.lora changed since the checkpoint?)")
    # peft saves each tensor under its name without the adapter's (`lora_A.default.weight` -> `lora_A.weight`).
    names = {key.replace(f".{ADAPTER}", "", 1): key for key in adapter_state_dict(model)}
    missing, unexpected = sorted(set(names) - set(state)), sorted(set(state) - set(names))
    if missing or unexpected:
        raise CheckpointError(f"{path}: the adapter does not fit the model (missing {missing[:3]}, "
                              f"unexpected {unexpected[:3]}; trainer.lora.target_modules changed?)")
    return {names[key]: tensor for key, tensor in state.items()}


def load_adapter(model: torch.nn.Module, folder: Path) -> None:
    """Copy the adapter saved in `folder` into `model`'s adapter, in place (the optimizer keeps
    pointing at the same parameters). CheckpointError when it does not fit."""
    weights = read_adapter(model, folder)
    own = model.state_dict()
    try:
        with torch.no_grad():
            for key, tensor in weights.items():
                own[key].copy_(tensor)
    except RuntimeError as error:
        raise CheckpointError(f"{folder / ADAPTER_WEIGHTS}: the adapter does not fit the model ({error})") from error


class AdapterMerge:
    """`merge.weight` for an adapted model: the merged policy anchor + weight * (trained - anchor)
    is the base plus `weight` times the adapter's update, so `view` scales each layer's LoRA
    scaling for a block instead of holding a copy of the anchor."""

    def __init__(self, weight: float) -> None:
        if not 0 < weight <= 1:
            raise ValueError(f"merge weight {weight}: must be in (0, 1]")
        self.weight = weight

    @property
    def active(self) -> bool:
        return self.weight < 1

    @contextlib.contextmanager
    def view(self, model: torch.nn.Module) -> Iterator[torch.nn.Module]:
        layers = list(lora_layers(model).values())
        saved = [layer.scaling[ADAPTER] for layer in layers]
        for layer in layers:
            layer.scaling[ADAPTER] = layer.scaling[ADAPTER] * self.weight
        try:
            yield model
        finally:
            for layer, scaling in zip(layers, saved):
                layer.scaling[ADAPTER] = scaling
