"""serve layer: an OpenAI-compatible HTTP server over the embedded engine, with request batching.

See docs/design/serve.md for the endpoints, the tool-call format, batching, limits and metrics.
"""

from tidal.serve.app import ServerState, create_app
from tidal.rollout.batcher import Batcher, Job, JobResult, QueueFull
from tidal.serve.chat import ParsedOutput, ToolCall, parse_tool_calls, render_messages
from tidal.serve.schemas import ApiError, ServeLimits
from tidal.serve.server import RunningServer, ServerStartError, build_state, serve_forever

__all__ = [
    "ApiError",
    "Batcher",
    "Job",
    "JobResult",
    "ParsedOutput",
    "QueueFull",
    "RunningServer",
    "ServeLimits",
    "ServerStartError",
    "ServerState",
    "ToolCall",
    "build_state",
    "create_app",
    "parse_tool_calls",
    "render_messages",
    "serve_forever",
]
