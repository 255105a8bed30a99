"""`ast.parse` behind one process-wide lock.

CPython 3.11 keeps the AST converter's recursion depth in per-interpreter state, not per thread,
so two threads parsing at once (the auditor's check threads, the scorer's threads) can fail with
"SystemError: AST constructor recursion depth mismatch" (python/cpython#106905; seen here in CI as
a schema check that flagged a good task). Parsing is fast; serialising it costs nothing we measure.
"""

from __future__ import annotations

import ast
import threading

_LOCK = threading.Lock()


def parse(source: str | bytes, filename: str = "<unknown>", mode: str = "exec") -> ast.AST:
    """`ast.parse(source, filename, mode)`, one thread at a time."""
    with _LOCK:
        return ast.parse(source, filename=filename, mode=mode)
