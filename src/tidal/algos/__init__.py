"""algos layer."""
