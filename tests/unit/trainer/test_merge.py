"""Weight-space merging (trainer/merge.py): the merged weights, the temporary view, bad input."""

import pytest
import torch

from tests.unit.trainer.tiny import build_model
from tidal.errors import CheckpointError
from tidal.trainer.merge import Merge


def _step_away(model: torch.nn.Module, seed: int = 1) -> None:
    """Move every weight as training would, by a random amount."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.1)


def test_merged_weights_are_the_anchor_plus_a_share_of_the_update() -> None:
    model = build_model()
    start = {k: v.clone() for k, v in model.state_dict().items()}
    merge = Merge(model, 0.25)
    _step_away(model)
    trained = {k: v.clone() for k, v in model.state_dict().items()}
    merged = merge.merged_state(model)
    for name, tensor in merged.items():
        assert torch.allclose(tensor, start[name] + 0.25 * (trained[name] - start[name]), atol=1e-6), name
    # Not a no-op: the merged weights differ from both ends.
    name = "model.layers.0.mlp.up_proj.weight"
    assert not torch.allclose(merged[name], trained[name]) and not torch.allclose(merged[name], start[name])


def test_view_holds_merged_weights_inside_and_restores_the_trained_ones_after() -> None:
    model = build_model()
    merge = Merge(model, 0.5)
    _step_away(model)
    trained = {k: v.clone() for k, v in model.state_dict().items()}
    parameters = list(model.parameters())  # the optimizer's references must stay valid
    inputs = torch.tensor([[1, 2, 3, 4]])
    want = merge.merged_state(model)
    with torch.no_grad():
        expected = model(inputs).logits
        with merge.view(model) as viewed:
            assert viewed is model
            merged_logits = model(inputs).logits
            assert all(torch.equal(v, want[k]) for k, v in model.state_dict().items())
        after = model(inputs).logits
    assert not torch.allclose(merged_logits, expected)
    assert torch.equal(after, expected)
    assert all(torch.equal(v, trained[k]) for k, v in model.state_dict().items())
    assert all(a is b for a, b in zip(parameters, model.parameters()))


def test_view_restores_the_trained_weights_when_the_block_raises() -> None:
    model = build_model()
    merge = Merge(model, 0.5)
    _step_away(model)
    trained = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(RuntimeError, match="eval failed"), merge.view(model):
        raise RuntimeError("eval failed")
    assert all(torch.equal(v, trained[k]) for k, v in model.state_dict().items())


def test_weight_one_is_no_merge() -> None:
    model = build_model()
    merge = Merge(model, 1.0)
    _step_away(model)
    trained = {k: v.clone() for k, v in model.state_dict().items()}
    assert not merge.active
    with merge.view(model):
        assert all(torch.equal(v, trained[k]) for k, v in model.state_dict().items())


def test_bf16_update_is_merged_in_float32() -> None:
    model = build_model(dtype=torch.bfloat16)
    merge = Merge(model, 0.5)
    _step_away(model)
    merged = merge.merged_state(model)
    name = "model.layers.0.mlp.up_proj.weight"
    exact = (merge.anchor[name].float() + 0.5 * (model.state_dict()[name].float() - merge.anchor[name].float()))
    assert merged[name].dtype == torch.bfloat16
    assert torch.equal(merged[name], exact.to(torch.bfloat16))


def test_bad_weight_and_a_different_architecture_are_clear_errors() -> None:
    model = build_model()
    with pytest.raises(ValueError, match="merge weight 0: must be in"):
        Merge(model, 0)
    with pytest.raises(ValueError, match="must be in"):
        Merge(model, 1.5)
    merge = Merge(model, 0.5)
    other = build_model(tie=True)
    merge.anchor["lm_head.weight"] = merge.anchor["lm_head.weight"][:10]
    with pytest.raises(CheckpointError, match="lm_head.weight has shape"):
        merge.merged_state(model)
    merge.anchor["not.a.weight"] = torch.zeros(1)
    with pytest.raises(CheckpointError, match="lacks anchor weights"):
        merge.merged_state(other)
