"""The built-in verifiers; importing this package registers them."""

from tidal.reward.verifiers import (  # noqa: F401
    compile,
    efficiency,
    judge,
    math_answer,
    program_io,
    python_tests,
    reward_model,
    static,
    text,
)
