"""tidal: RL post-training of language models on verifiable tasks, and agent evaluation."""

__version__ = "0.1.0"
