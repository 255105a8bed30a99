"""The server's Prometheus metrics, in a registry of its own (two servers in one process, as in the
tests, do not share counters). Exposed as text on `GET /metrics`."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

CONTENT_TYPE = CONTENT_TYPE_LATEST
_ROW_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class ServeMetrics:
    """Counters, gauges and histograms of one server; thread-safe (prometheus_client locks)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "tidal_serve_requests", "HTTP requests answered, by endpoint and status code", ["endpoint", "status"], registry=r
        )
        self.prompt_tokens = Counter("tidal_serve_prompt_tokens", "prompt tokens of answered requests", registry=r)
        self.completion_tokens = Counter("tidal_serve_completion_tokens", "tokens generated for answered requests", registry=r)
        self.queue_depth = Gauge("tidal_serve_queue_depth", "requests waiting for the engine", registry=r)
        self.batch_rows = Histogram(
            "tidal_serve_batch_rows", "rows (prompts x n) of the requests moved into the running batch together", buckets=_ROW_BUCKETS, registry=r
        )
        self.batch_requests = Histogram(
            "tidal_serve_batch_requests", "requests moved into the running batch together", buckets=_ROW_BUCKETS, registry=r
        )
        self.latency = Histogram(
            "tidal_serve_request_latency_seconds",
            "time from a request's arrival to its last byte, by endpoint",
            ["endpoint"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.queue_wait = Histogram(
            "tidal_serve_queue_wait_seconds", "time a request waited for the engine", buckets=_LATENCY_BUCKETS, registry=r
        )
        self.tool_call_errors = Counter(
            "tidal_serve_tool_call_parse_errors", "outputs that tried to call a tool but broke the format", registry=r
        )

    def exposition(self) -> bytes:
        """The Prometheus text format of every metric."""
        return generate_latest(self.registry)
