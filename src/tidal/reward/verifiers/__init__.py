"""The built-in verifiers; importing this package registers them."""

from tidal.reward.verifiers import (  # noqa: F401
    compile,
    efficiency,
    math_answer,
    program_io,
    python_tests,
    static,
    text,
)
