"""domains layer: multi-domain joint training (per-domain reward normalisation, adaptive domain weights, task curriculum)."""

from tidal.domains.adaptive import (
    AdaptiveDomainWeights,
    AdaptiveWeightsConfig,
    WeightChange,
)
from tidal.domains.curriculum import (
    Curriculum,
    CurriculumConfig,
    SuspectTask,
    oversample_factor,
)
from tidal.domains.normalize import NORMALISERS, NormaliserConfig, RewardNormaliser

__all__ = [
    "NORMALISERS",
    "AdaptiveDomainWeights",
    "AdaptiveWeightsConfig",
    "Curriculum",
    "CurriculumConfig",
    "NormaliserConfig",
    "RewardNormaliser",
    "SuspectTask",
    "WeightChange",
    "oversample_factor",
]
