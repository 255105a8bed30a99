"""A policy loss registered in either form runs through `compute_loss`: the (LossInputs,
LossOptions) form, and the tensor form plugins were written in before it (positional tensors and
settings, optional inputs as keywords)."""

from __future__ import annotations

import uuid

import torch

from tidal.algos.losses import LOSS_INPUTS, LOSSES, LossInputs, LossOptions, compute_loss, loss, ppo_clip_loss


def _inputs() -> LossInputs:
    generator = torch.Generator().manual_seed(0)
    logprobs = -torch.rand(3, 5, generator=generator)
    old = logprobs + 0.1 * torch.randn(3, 5, generator=generator)
    mask = torch.ones(3, 5)
    mask[0, 3:] = 0
    return LossInputs(logprobs, old, torch.randn(3, generator=generator), mask)


def test_a_tensor_form_plugin_loss_runs_and_gets_its_inputs() -> None:
    name = f"halved_{uuid.uuid4().hex[:8]}"
    seen: dict[str, object] = {}

    @loss(name, inputs=("is_cap",))
    def halved(*args, **kwargs):  # the tensor form, as plugins wrote it
        seen.update(kwargs)
        value, metrics = ppo_clip_loss(*args)
        return value / 2, metrics

    try:
        inputs = _inputs()
        plugin = compute_loss(inputs, LossOptions(loss=name, is_cap=3.5))
        reference = compute_loss(inputs, LossOptions(loss="ppo_clip"))
        assert torch.allclose(plugin.loss, reference.loss / 2)
        assert seen == {"is_cap": 3.5}
    finally:
        LOSSES.pop(name, None)
        LOSS_INPUTS.pop(name, None)


def test_an_inputs_form_plugin_loss_is_registered_as_it_is() -> None:
    name = f"doubled_{uuid.uuid4().hex[:8]}"

    @loss(name)
    def doubled(inputs: LossInputs, options: LossOptions):
        value, metrics = LOSSES["ppo_clip"](inputs, options)
        return value * 2, metrics

    try:
        assert LOSSES[name] is doubled
        inputs = _inputs()
        assert torch.allclose(compute_loss(inputs, LossOptions(loss=name)).loss,
                              2 * compute_loss(inputs, LossOptions(loss="ppo_clip")).loss)
    finally:
        LOSSES.pop(name, None)
        LOSS_INPUTS.pop(name, None)
