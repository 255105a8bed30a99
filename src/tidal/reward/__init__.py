"""reward layer."""
