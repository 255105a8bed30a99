"""Checkpoint state of ranked trainers: the optimizer sharded through torch.distributed.checkpoint
(DCP), and weights and optimizer state loaded into any layout, so a run resumes onto another world
size or strategy (2 ranks -> 1, 1 -> 2, DDP <-> FSDP2).

A checkpoint of an FSDP2 run holds the consolidated weights (`model/`, a Hugging Face folder, as in
one process) and `optimizer/`, a DCP folder each rank wrote its shards into; one of a single process
or of DDP holds `optimizer.pt` (the full state). Either loads into either: DCP reshards its folder
onto the optimizer at hand (one process needs no process group), and a full `optimizer.pt` is
keyed by parameter name and distributed onto the shards.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from tidal.errors import CheckpointError

OPTIMIZER_DCP = "optimizer"  # the sharded optimizer's folder in a checkpoint
OPTIMIZER_FILE = "optimizer.pt"


def _is_sharded(model: torch.nn.Module) -> bool:
    return any(type(p).__name__ == "DTensor" for p in model.parameters())


def save_sharded_optimizer(model: torch.nn.Module, optimizer: torch.optim.Optimizer, folder: Path) -> None:
    """Every rank writes its optimizer shards into `folder/optimizer` (a collective)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    fresh = not optimizer.state
    state = get_optimizer_state_dict(model, optimizer)
    if fresh:
        # DCP fills an empty state by an optimizer step at lr 0, which counts as Adam's step 1 and
        # so changes the bias correction of every later step: saved as step 0 (the same as no state
        # on resume), and the live optimizer put back as it was.
        for entry in state.get("state", {}).values():
            step = entry.get("step")
            if isinstance(step, torch.Tensor):
                entry["step"] = torch.zeros_like(step)
            elif step is not None:
                entry["step"] = 0
    dcp.save({"optimizer": state}, checkpoint_id=str(folder / OPTIMIZER_DCP))
    if fresh:
        optimizer.state.clear()


def load_optimizer(model: torch.nn.Module, optimizer: torch.optim.Optimizer, folder: Path) -> None:
    """The checkpoint's optimizer state, sharded (DCP) or full (optimizer.pt), into `optimizer` of
    `model` whatever its layout (with ranks: a collective)."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_optimizer_state_dict,
    )

    if (folder / OPTIMIZER_DCP).is_dir():
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        state = {"optimizer": get_optimizer_state_dict(model, optimizer)}
        try:
            dcp.load(state, checkpoint_id=str(folder / OPTIMIZER_DCP), no_dist=not torch.distributed.is_initialized())
        except Exception as error:  # DCP raises its own CheckpointException and plain errors alike
            raise CheckpointError(f"{folder / OPTIMIZER_DCP}: cannot be loaded into this optimizer ({error})") from error
        set_optimizer_state_dict(model, optimizer, state["optimizer"])
        return
    path = folder / OPTIMIZER_FILE
    if not path.is_file():
        raise CheckpointError(f"{folder}: has neither {OPTIMIZER_FILE} nor {OPTIMIZER_DCP}/ (the optimizer state)")
    try:
        full = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:
        raise CheckpointError(f"{path}: cannot be read ({error}); the checkpoint is corrupt") from error
    if not _is_sharded(model):
        try:
            optimizer.load_state_dict(full)
        except (ValueError, KeyError, RuntimeError) as error:
            raise CheckpointError(f"{path}: does not fit this optimizer ({error})") from error
        return
    set_optimizer_state_dict(model, optimizer, by_name(full, model),
                             options=StateDictOptions(full_state_dict=True))


def by_name(state: dict[str, Any], model: torch.nn.Module) -> dict[str, Any]:
    """A torch optimizer's state_dict (parameters by index) keyed by parameter name instead: the
    optimizer was built over the model's trainable parameters in order (as the trainer builds it)."""
    names = [name for name, p in model.named_parameters() if p.requires_grad]
    indices = [i for group in state["param_groups"] for i in group["params"]]
    if len(indices) != len(names):
        raise CheckpointError(f"the optimizer state has {len(indices)} parameters, the model {len(names)} trainable ones")
    name_of = dict(zip(sorted(indices), names))
    return {
        "state": {name_of[int(i)]: value for i, value in state["state"].items()},
        "param_groups": [{**group, "params": [name_of[i] for i in group["params"]]} for group in state["param_groups"]],
    }


def load_weights(model: torch.nn.Module, weights: dict[str, torch.Tensor], partial: bool = False) -> None:
    """Full `weights` (names as saved: tied weights once) into `model`, sharded or not; with
    `partial`, only those tensors (a LoRA adapter's), each of which the model must have."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_model_state_dict,
    )

    own = set(model.state_dict())
    weights = dict(weights)
    for name, source in tied_names(model).items():
        if name not in weights and source in weights:
            weights[name] = weights[source]
    missing, unexpected = [] if partial else sorted(own - set(weights)), sorted(set(weights) - own)
    if missing or unexpected:
        raise CheckpointError(f"the weights do not fit the model (missing {missing[:3]}, unexpected {unexpected[:3]})")
    set_model_state_dict(model, weights, options=StateDictOptions(full_state_dict=True, strict=not partial))


def tied_names(model: torch.nn.Module) -> dict[str, str]:
    """{output embedding name: input embedding name} when a Hugging Face model ties them."""
    config = getattr(model, "config", None)
    if not getattr(config, "tie_word_embeddings", False):
        return {}
    output, inputs = model.get_output_embeddings(), model.get_input_embeddings()  # type: ignore[operator]
    names = {id(module): name for name, module in model.named_modules()}
    if output is None or inputs is None or id(output) not in names or id(inputs) not in names:
        return {}
    return {f"{names[id(output)]}.weight": f"{names[id(inputs)]}.weight"}


def full_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The whole model's weights on rank 0 (on the CPU), gathered from the shards (a collective;
    other ranks get an empty dict)."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
    )

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
