"""sandbox layer: run a command in a fresh private workspace under limits, behind one protocol.

`get_backend("bwrap")` (default, bubblewrap namespaces; also runs batches of `python -m` jobs in
one sandbox) or `get_backend("unsafe_local")` (no isolation, development only). See
docs/design/sandbox.md.
"""

from tidal.sandbox.base import (
    BatchBackend,
    BatchJob,
    SandboxBackend,
    SandboxResult,
    SandboxStatus,
    SessionBackend,
    get_backend,
    known_backends,
    register_backend,
)
from tidal.sandbox.batch import ZygoteBackend
from tidal.sandbox.bwrap import BwrapBackend
from tidal.sandbox.local import UnsafeLocalBackend
from tidal.sandbox.pool import SandboxPool
from tidal.sandbox.session import SandboxSession, Snapshot, open_session

__all__ = [
    "BatchBackend",
    "BatchJob",
    "BwrapBackend",
    "SandboxBackend",
    "SandboxPool",
    "SandboxResult",
    "SandboxSession",
    "SandboxStatus",
    "SessionBackend",
    "Snapshot",
    "UnsafeLocalBackend",
    "ZygoteBackend",
    "get_backend",
    "known_backends",
    "open_session",
    "register_backend",
]
