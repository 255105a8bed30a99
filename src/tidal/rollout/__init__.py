"""rollout layer: inference engines behind one protocol, with versioned weight updates."""

from tidal.rollout.engine import EmbeddedEngine, Request, SamplingParams
from tidal.rollout.protocol import RolloutEngine

__all__ = ["EmbeddedEngine", "Request", "RolloutEngine", "SamplingParams"]
