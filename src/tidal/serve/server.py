"""Load a model for serving and run the HTTP server: in the foreground (`tidal serve`) or on a
background thread (`RunningServer`, for tests and benchmarks)."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import uvicorn

from tidal.config.schema import ModelConfig
from tidal.errors import TidalError
from tidal.models import load_model
from tidal.rollout import EmbeddedEngine
from tidal.serve.app import ServerState, create_app
from tidal.serve.schemas import ServeLimits
from tidal.serve.weights import WeightUpdates


def build_state(
    model: str,
    limits: ServeLimits | None = None,
    api_key: str | None = None,
    device: str = "auto",
    seed: int = 0,
    model_id: str | None = None,
    allow_weight_updates: bool = False,
    weights_dir: str | Path | None = None,
) -> ServerState:
    """Load `model` ('tiny': the built-in model, freshly initialised from `seed`; else a local
    Hugging Face folder) and start its batcher. The served model id is 'tiny' or the folder's name.
    `allow_weight_updates` opens POST /v1/weights (uploads, and paths under `weights_dir`)."""
    limits = limits or ServeLimits()
    loaded = load_model(ModelConfig(path=model, device=device, seed=seed))  # type: ignore[arg-type]
    loaded.model.eval()
    engine = EmbeddedEngine(loaded.model, loaded.tokenizer, max_batch_rows=limits.max_batch)
    name = model_id or ("tiny" if model == "tiny" else Path(model).expanduser().resolve().name)
    updates = WeightUpdates(allowed=allow_weight_updates, weights_dir=Path(weights_dir) if weights_dir else None)
    return ServerState(engine=engine, model_id=name, limits=limits, api_key=api_key, weights=updates)


def _config(state: ServerState, max_connections: int, log_level: str, **kwargs: object) -> uvicorn.Config:
    # limit_concurrency is a last-resort bound on open connections (uvicorn answers 503 beyond it);
    # the batcher's queue is the real bound on waiting work.
    return uvicorn.Config(
        create_app(state),
        lifespan="off",
        log_level=log_level,
        limit_concurrency=max_connections,
        timeout_graceful_shutdown=5,
        **kwargs,  # type: ignore[arg-type]
    )


def serve_forever(state: ServerState, host: str, port: int, max_connections: int = 1024, log_level: str = "info") -> None:
    """Serve until interrupted (Ctrl-C / SIGTERM), then stop the batcher."""
    try:
        uvicorn.Server(_config(state, max_connections, log_level, host=host, port=port)).run()
    finally:
        state.close()


class ServerStartError(TidalError):
    """The server thread did not come up (the port is taken, or the app failed to start)."""


class RunningServer:
    """A server on a background thread, on `port` (0 = a free one). Use as a context manager;
    `base_url` is what an OpenAI client takes (`http://host:port/v1`)."""

    def __init__(self, state: ServerState, host: str = "127.0.0.1", port: int = 0, max_connections: int = 1024) -> None:
        self.state = state
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._socket = socket.socket(family, socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self._socket.bind((host, port))
        except OSError as error:
            self._socket.close()
            raise ServerStartError(f"cannot listen on {host}:{port} ({error}); pick another --port") from None
        self.host, self.port = host, self._socket.getsockname()[1]
        self._server = uvicorn.Server(_config(state, max_connections, "warning"))
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._socket]}, daemon=True)

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def base_url(self) -> str:
        return self.url + "/v1"

    def start(self, timeout: float = 30.0) -> RunningServer:
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise ServerStartError(f"the server on {self.url} did not start within {timeout:.0f} s")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        """Stop accepting, finish open responses (briefly), stop the batcher."""
        self._server.should_exit = True
        if self._thread.is_alive():
            self._thread.join(30)
        self._socket.close()
        self.state.close()

    def __enter__(self) -> RunningServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
