"""The loss of a run is unchanged, for every algorithm option, by how the loss is assembled.

The expected values were recorded from the trainer before the loss became one call
(tidal.algos.losses.compute_loss): a tiny fp64 model, a fixed batch (seed 4) with a reference
(seed 5), micro-batches of 4 of 6 rows, one `rl_step`. `weight_sum` is lm_head's weights after it.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

from tidal.config.schema import AlgorithmConfig, TrainerConfig
from tidal.trainer.trainer import Trainer

from .tiny import build_model, random_batch

EXPECTED: list[tuple[dict[str, Any], dict[str, float]]] = [
    ({'loss': 'ppo_clip', 'aggregation': 'token', 'kl_coef': 0.1, 'entropy_coef': 0.01, 'is_cap': 1.5},
     {'loss': 0.4658574474011844, 'grad_norm': 4.113722062188504, 'skipped': 0.0, 'clip_low_frac': 0.13636363636363635, 'clip_high_frac': 0.0, 'ratio_mean': 1.0401220273475065, 'approx_kl': 0.030451942344753676, 'policy_loss': 0.5198642185610365, 'entropy': 5.691065898109227, 'kl': 0.029038878212401985, 'kl_coef': 0.1, 'weight_sum': -2.535396992252974}),
    ({'loss': 'ppo_clip', 'aggregation': 'sequence', 'kl_coef': 0.1, 'entropy_coef': 0.01, 'is_cap': 1.5},
     {'loss': 0.570723007497264, 'grad_norm': 6.808565618271983, 'skipped': 0.0, 'clip_low_frac': 0.13636363636363635, 'clip_high_frac': 0.0, 'ratio_mean': 1.0401220273475065, 'approx_kl': 0.030451942344753676, 'policy_loss': 0.6243421760663084, 'entropy': 5.691065898109227, 'kl': 0.029038878212401985, 'kl_coef': 0.1, 'weight_sum': -2.0747645998026787}),
    ({'loss': 'ppo_clip', 'aggregation': 'token_sum', 'kl_coef': 0.1, 'entropy_coef': 0.01, 'is_cap': 1.5},
     {'loss': 0.21351799672554284, 'grad_norm': 1.8854559510916065, 'skipped': 0.0, 'clip_low_frac': 0.13636363636363635, 'clip_high_frac': 0.0, 'ratio_mean': 1.0401220273475065, 'approx_kl': 0.030451942344753676, 'policy_loss': 0.23827110017380837, 'entropy': 5.691065898109227, 'kl': 0.029038878212401985, 'kl_coef': 0.1, 'weight_sum': -2.5353969922259227}),
    ({'loss': 'decoupled_ppo', 'aggregation': 'token', 'kl_coef': 0.1, 'entropy_coef': 0.01, 'is_cap': 1.5},
     {'loss': 0.4343750937921994, 'grad_norm': 4.127707172224517, 'skipped': 0.0, 'clip_low_frac': 0.0, 'clip_high_frac': 0.0, 'ratio_mean': 1.0, 'approx_kl': 0.0, 'is_weight_mean': 1.0302992512139206, 'is_truncated_frac': 0.0909090909090909, 'policy_loss': 0.4883818649520515, 'entropy': 5.691065898109227, 'kl': 0.029038878212401985, 'kl_coef': 0.1, 'weight_sum': -2.527833834911725}),
    ({'loss': 'decoupled_ppo', 'aggregation': 'sequence', 'kl_coef': 0.1, 'entropy_coef': 0.01, 'is_cap': 1.5},
     {'loss': 0.5246535081062514, 'grad_norm': 6.702497623434896, 'skipped': 0.0, 'clip_low_frac': 0.0, 'clip_high_frac': 0.0, 'ratio_mean': 1.0, 'approx_kl': 0.0, 'is_weight_mean': 1.0302992512139206, 'is_truncated_frac': 0.0909090909090909, 'policy_loss': 0.5782726766752958, 'entropy': 5.691065898109227, 'kl': 0.029038878212401985, 'kl_coef': 0.1, 'weight_sum': -1.979515133594671}),
    ({'loss': 'decoupled_ppo', 'aggregation': 'token_sum', 'kl_coef': 0.1, 'entropy_coef': 0.01, 'is_cap': 1.5},
     {'loss': 0.19908858465475804, 'grad_norm': 1.891865769555383, 'skipped': 0.0, 'clip_low_frac': 0.0, 'clip_high_frac': 0.0, 'ratio_mean': 1.0, 'approx_kl': 0.0, 'is_weight_mean': 1.0302992512139206, 'is_truncated_frac': 0.0909090909090909, 'policy_loss': 0.22384168810302357, 'entropy': 5.691065898109227, 'kl': 0.029038878212401985, 'kl_coef': 0.1, 'weight_sum': -2.527833834759635}),
    ({'loss': 'tis_pg', 'aggregation': 'token', 'kl_coef': 0.1, 'entropy_coef': 0.01, 'is_cap': 1.5},
     {'loss': -2.960703193543188, 'grad_norm': 4.127707172224517, 'skipped': 0.0, 'is_weight_mean': 1.0302992512139206, 'is_truncated_frac': 0.0909090909090909, 'policy_loss': -2.9066964223833356, 'entropy': 5.691065898109227, 'kl': 0.029038878212401985, 'kl_coef': 0.1, 'weight_sum': -2.5278338349117244}),
    ({'loss': 'tis_pg', 'aggregation': 'sequence', 'kl_coef': 0.1, 'entropy_coef': 0.01, 'is_cap': 1.5},
     {'loss': -3.6125975011414937, 'grad_norm': 6.702497623434896, 'skipped': 0.0, 'is_weight_mean': 1.0302992512139206, 'is_truncated_frac': 0.0909090909090909, 'policy_loss': -3.5589783325724493, 'entropy': 5.691065898109227, 'kl': 0.029038878212401985, 'kl_coef': 0.1, 'weight_sum': -1.9795151335946706}),
    ({'loss': 'tis_pg', 'aggregation': 'token_sum', 'kl_coef': 0.1, 'entropy_coef': 0.01, 'is_cap': 1.5},
     {'loss': -1.3569889637072945, 'grad_norm': 1.891865769555383, 'skipped': 0.0, 'is_weight_mean': 1.0302992512139206, 'is_truncated_frac': 0.0909090909090909, 'policy_loss': -1.3322358602590287, 'entropy': 5.691065898109227, 'kl': 0.029038878212401985, 'kl_coef': 0.1, 'weight_sum': -2.527833834759633}),
    ({'loss': 'gspo', 'aggregation': 'token', 'kl_coef': 0.1, 'entropy_coef': 0.01, 'is_cap': 1.5},
     {'loss': 0.4291508668855161, 'grad_norm': 3.926776005962723, 'skipped': 0.0, 'clip_low_frac': 0.0, 'clip_high_frac': 0.0, 'ratio_mean': 1.0576044692285473, 'approx_kl': 0.030451942344753676, 'policy_loss': 0.4831576380453682, 'entropy': 5.691065898109227, 'kl': 0.029038878212401985, 'kl_coef': 0.1, 'weight_sum': -2.81855121740186}),
    ({'loss': 'gspo', 'aggregation': 'sequence', 'kl_coef': 0.1, 'entropy_coef': 0.01, 'is_cap': 1.5},
     {'loss': 0.5307669396181671, 'grad_norm': 6.6154996375485196, 'skipped': 0.0, 'clip_low_frac': 0.0, 'clip_high_frac': 0.0, 'ratio_mean': 1.0576044692285473, 'approx_kl': 0.030451942344753676, 'policy_loss': 0.5843861081872114, 'entropy': 5.691065898109227, 'kl': 0.029038878212401985, 'kl_coef': 0.1, 'weight_sum': -2.29905417346702}),
    ({'loss': 'gspo', 'aggregation': 'token_sum', 'kl_coef': 0.1, 'entropy_coef': 0.01, 'is_cap': 1.5},
     {'loss': 0.1966941473225282, 'grad_norm': 1.799772343801872, 'skipped': 0.0, 'clip_low_frac': 0.0, 'clip_high_frac': 0.0, 'ratio_mean': 1.0576044692285473, 'approx_kl': 0.030451942344753676, 'policy_loss': 0.22144725077079375, 'entropy': 5.691065898109227, 'kl': 0.029038878212401985, 'kl_coef': 0.1, 'weight_sum': -2.818551217176021}),
    ({'loss': 'cispo', 'aggregation': 'token', 'kl_coef': 0.1, 'entropy_coef': 0.01, 'is_cap': 1.5},
     {'loss': -2.778422230774636, 'grad_norm': 3.9295038335323964, 'skipped': 0.0, 'clip_low_frac': 0.22727272727272724, 'clip_high_frac': 0.13636363636363635, 'ratio_mean': 1.0401220273475065, 'approx_kl': 0.030451942344753676, 'policy_loss': -2.724415459614784, 'entropy': 5.691065898109227, 'kl': 0.029038878212401985, 'kl_coef': 0.1, 'weight_sum': -2.496099494034441}),
    ({'loss': 'cispo', 'aggregation': 'sequence', 'kl_coef': 0.1, 'entropy_coef': 0.01, 'is_cap': 1.5},
     {'loss': -3.1269059957342353, 'grad_norm': 6.462940807427428, 'skipped': 0.0, 'clip_low_frac': 0.22727272727272724, 'clip_high_frac': 0.13636363636363635, 'ratio_mean': 1.0401220273475065, 'approx_kl': 0.030451942344753676, 'policy_loss': -3.073286827165191, 'entropy': 5.691065898109227, 'kl': 0.029038878212401985, 'kl_coef': 0.1, 'weight_sum': -1.8437581400252765}),
    ({'loss': 'cispo', 'aggregation': 'token_sum', 'kl_coef': 0.1, 'entropy_coef': 0.01, 'is_cap': 1.5},
     {'loss': -1.273443522438375, 'grad_norm': 1.8010225865248752, 'skipped': 0.0, 'clip_low_frac': 0.22727272727272724, 'clip_high_frac': 0.13636363636363635, 'ratio_mean': 1.0401220273475065, 'approx_kl': 0.030451942344753676, 'policy_loss': -1.2486904189901094, 'entropy': 5.691065898109227, 'kl': 0.029038878212401985, 'kl_coef': 0.1, 'weight_sum': -2.4960994941464176}),
    ({'kl_coef': 0.2, 'kl_estimator': 'k1'},
     {'loss': 0.5109986926393592, 'grad_norm': 4.321060739702615, 'skipped': 0.0, 'clip_low_frac': 0.13636363636363635, 'clip_high_frac': 0.0, 'ratio_mean': 1.0401220273475065, 'approx_kl': 0.030451942344753676, 'policy_loss': 0.5198642185610365, 'entropy': 5.691065898109227, 'kl': -0.044327629608386605, 'kl_coef': 0.2, 'weight_sum': -1.6417941128246172}),
    ({'kl_coef': 0.2, 'kl_estimator': 'k2'},
     {'loss': 0.5254664266234765, 'grad_norm': 4.149538400631245, 'skipped': 0.0, 'clip_low_frac': 0.13636363636363635, 'clip_high_frac': 0.0, 'ratio_mean': 1.0401220273475065, 'approx_kl': 0.030451942344753676, 'policy_loss': 0.5198642185610365, 'entropy': 5.691065898109227, 'kl': 0.028011040312200017, 'kl_coef': 0.2, 'weight_sum': -2.4442927348836276}),
    ({'kl_coef': 0.2, 'kl_in': 'reward', 'entropy_coef': 0.02},
     {'loss': 0.3927428994702816, 'grad_norm': 4.042368944695363, 'skipped': 0.0, 'clip_low_frac': 0.13636363636363635, 'clip_high_frac': 0.0, 'ratio_mean': 1.0401220273475065, 'approx_kl': 0.030451942344753676, 'policy_loss': 0.5065642174324663, 'entropy': 5.691065898109227, 'kl': 0.029038878212401985, 'kl_reward': -0.05399771461113949, 'kl_coef': 0.2, 'weight_sum': -2.586834698509188}),
    ({'kl_coef': 0.0, 'entropy_coef': 0.0, 'epochs': 2},
     {'loss': 0.3872656052626865, 'grad_norm': 3.0891455805409853, 'skipped': 0.0, 'clip_low_frac': 0.22727272727272724, 'clip_high_frac': 0.06818181818181818, 'ratio_mean': 0.9915226715940486, 'approx_kl': 0.030717779753612676, 'policy_loss': 0.3872656052626865, 'entropy': 5.690997368361961, 'kl': 0.037315965168736226, 'kl_coef': 0.0, 'weight_sum': -3.1292266469626595}),
    ({'loss': 'decoupled_ppo', 'epochs': 2, 'kl_coef': 0.05, 'kl_target': 0.01},
     {'loss': 0.40218807354744235, 'grad_norm': 2.7645199991986122, 'skipped': 0.0, 'clip_low_frac': 0.22727272727272724, 'clip_high_frac': 0.06818181818181818, 'ratio_mean': 0.9574649344035103, 'approx_kl': 0.019281262552215458, 'is_weight_mean': 1.0401220273475065, 'is_truncated_frac': 0.0, 'policy_loss': 0.39993561366893965, 'entropy': 5.691026777703896, 'kl': 0.04504919757005494, 'kl_coef': 0.05, 'weight_sum': -2.8232956839464283}),
]


def _step(options: dict[str, Any]) -> dict[str, float]:
    model = build_model(seed=3, dtype=torch.float64)
    batch = random_batch(model, batch=6, seed=4, noise=0.3)
    generator = torch.Generator().manual_seed(5)
    noise = torch.randn(batch.old_logprobs.shape, generator=generator, dtype=torch.float64)
    batch.ref_logprobs = (batch.old_logprobs + 0.2 * noise) * batch.completion_mask
    trainer = Trainer(copy.deepcopy(model), TrainerConfig(lr=1e-3, micro_batch_size=4, precision="fp32"),
                      AlgorithmConfig(**options), "cpu", total_steps=5, max_tokens=8)
    metrics = trainer.rl_step(batch)
    metrics["weight_sum"] = float(trainer.model.lm_head.weight.detach().sum())
    return metrics


@pytest.mark.parametrize(("options", "expected"), EXPECTED, ids=[",".join(f"{k}={v}" for k, v in o.items()) for o, _ in EXPECTED])
def test_loss_values_are_those_of_the_trainer_before_the_loss_was_one_call(
    options: dict[str, Any], expected: dict[str, float]
) -> None:
    metrics = _step(options)
    for key, value in expected.items():
        assert metrics[key] == pytest.approx(value, rel=1e-12, abs=1e-14), key
