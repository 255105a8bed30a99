"""rollout layer: inference engines behind one protocol, with versioned weight updates."""

from tidal.rollout.engine import EmbeddedEngine, SamplingParams
from tidal.rollout.protocol import RolloutEngine

__all__ = ["EmbeddedEngine", "RolloutEngine", "SamplingParams"]
