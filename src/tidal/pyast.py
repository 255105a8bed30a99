"""`ast.parse` behind one process-wide lock.

CPython 3.11 keeps the AST converter's recursion depth in per-interpreter state, not per thread,
so two threads parsing at once (the auditor's check threads, the scorer's threads) can fail with
"SystemError: AST constructor recursion depth mismatch" (python/cpython#106905; seen here in CI as
a schema check that flagged a good task). Parsing is fast; serialising it costs nothing we measure.

What the compiler warns about the source ("invalid decimal literal", "invalid escape sequence")
is the source's business: the source is mostly a model's answer or a task's tests, and its
warnings went to the run's console (seen in the scorer's output during RL). They are not shown.
"""

from __future__ import annotations

import ast
import threading
import warnings

_LOCK = threading.Lock()


def parse(source: str | bytes, filename: str = "<unknown>", mode: str = "exec") -> ast.AST:
    """`ast.parse(source, filename, mode)`, one thread at a time, without the compiler's warnings."""
    with _LOCK, warnings.catch_warnings():
        warnings.simplefilter("ignore", SyntaxWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        return ast.parse(source, filename=filename, mode=mode)
