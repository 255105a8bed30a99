"""gate layer."""
