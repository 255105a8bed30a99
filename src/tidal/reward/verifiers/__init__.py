"""The built-in verifiers; importing this package registers them."""

from tidal.reward.verifiers import math_answer, python_tests, text  # noqa: F401
