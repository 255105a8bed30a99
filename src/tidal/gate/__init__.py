"""gate layer: the quality gate on each scored sample before it may train."""

from tidal.gate.gate import DROP_REASONS, gate_episodes, gate_single, repetition_fraction

__all__ = ["DROP_REASONS", "gate_episodes", "gate_single", "repetition_fraction"]
