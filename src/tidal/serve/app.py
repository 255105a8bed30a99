"""The HTTP application (Starlette, served by uvicorn): OpenAI's `/v1/models`, `/v1/chat/completions`
and `/v1/completions`, plus `/metrics`, `/health` and the weight reload endpoint `/v1/weights`
(serve/weights.py).

Handlers run on the event loop and only validate, tokenize and format; generation happens on the
batcher's worker thread, which hands tokens and results back with `loop.call_soon_threadsafe`.
Every error reaches the client in OpenAI's JSON error shape; an unexpected one is logged here and
answered as a plain 500, never with a traceback.
"""

from __future__ import annotations

import asyncio
import copy
import hmac
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from jinja2 import TemplateError
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from tidal.models import render_prompt
from tidal.rollout import EmbeddedEngine, SamplingParams
from tidal.rollout.batcher import Batcher, Job, JobResult, QueueFull, ShuttingDown
from tidal.serve.chat import MessageError, ParsedOutput, parse_tool_calls, render_messages, tool_names
from tidal.serve.metrics import CONTENT_TYPE, ServeMetrics
from tidal.serve.responses import (
    StreamedText,
    TokenText,
    chat_finish_reason,
    chat_logprobs,
    chat_message,
    completion_logprobs,
    new_id,
    now,
    tool_call_objects,
    usage,
)
from tidal.serve.schemas import ApiError, ChatRequest, CompletionRequest, ServeLimits, parse_request
from tidal.serve.weights import GuardedEngine, WeightUpdates, prompt_logprobs, reload_weights, require_verified
from tidal.types import Completion

logger = logging.getLogger(__name__)


@dataclass
class ServerState:
    """Everything the handlers share: the engine (used only by the batcher's thread) and the limits."""

    engine: EmbeddedEngine
    model_id: str
    limits: ServeLimits
    api_key: str | None = None
    metrics: ServeMetrics = field(default_factory=ServeMetrics)
    created: int = field(default_factory=now)
    weights: WeightUpdates = field(default_factory=WeightUpdates)  # the reload endpoint's settings and lock

    def __post_init__(self) -> None:
        # The batcher's engine calls take the reload lock: weights never change during a generation.
        guarded = GuardedEngine(self.engine, self.weights.lock)
        self.batcher = Batcher(guarded, self.limits.max_batch, self.limits.max_queue, self.metrics)  # type: ignore[arg-type]
        # The handlers' own tokenizer: a Rust tokenizer used from two threads at once can fail with
        # "Already borrowed", and the worker thread uses the engine's.
        self.tokenizer = copy.deepcopy(self.engine.tokenizer)
        self.tokens = TokenText(self.tokenizer)
        config = self.engine.model.config
        self.context_length = int(getattr(config, "max_position_embeddings", 0) or 1 << 20)

    def close(self) -> None:
        self.batcher.close()


@dataclass
class Prepared:
    """A validated request, ready for the engine."""

    kind: Literal["chat", "completion"]
    prompts: list[list[int]]
    n: int
    params: SamplingParams
    logprobs: bool
    top_logprobs: int
    stream: bool
    include_usage: bool
    tools: list[str] | None  # offered tool names: parse tool calls when set
    token_ids: bool = False  # completions: each choice's token ids (logprobs then cover a final eos too)
    tokens_as_ids: bool = False  # completions: logprobs tokens as 'token_id:<id>'
    prompt_logprobs: int | None = None  # completions: the prompt's logprobs, with this many alternatives


# ------------------------------------------------------------------------ request preparation


async def read_json(request: Request, limit: int) -> Any:
    """The request body as JSON, refusing (413) more than `limit` bytes before reading them all."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ApiError(413, f"request body of {declared} bytes exceeds the limit of {limit} bytes", code="request_too_large")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise ApiError(413, f"request body exceeds the limit of {limit} bytes", code="request_too_large")
        chunks.append(chunk)
    try:
        return json.loads(b"".join(chunks))
    except (ValueError, UnicodeDecodeError) as error:
        raise ApiError(400, f"the request body is not valid JSON ({error})", code="invalid_json") from None


def _check_model(state: ServerState, model: str) -> None:
    if model != state.model_id:
        raise ApiError(404, f"The model '{model}' does not exist; this server serves '{state.model_id}'", param="model", code="model_not_found")


def _prepare(
    state: ServerState,
    kind: Literal["chat", "completion"],
    request: ChatRequest | CompletionRequest,
    prompts: list[list[int]],
    max_tokens: int | None,
    top_logprobs: int,
    tools: list[str] | None,
) -> Prepared:
    """Apply the server's limits and build the engine's parameters; ApiError(400) naming the field."""
    limits = state.limits
    prompt_field = "messages" if kind == "chat" else "prompt"
    max_field = "max_completion_tokens" if isinstance(request, ChatRequest) and request.max_completion_tokens else "max_tokens"
    longest = max(len(p) for p in prompts)
    room = state.context_length - longest
    if longest > limits.max_prompt_tokens or room < 1:
        raise ApiError(
            400,
            f"the prompt has {longest} tokens; this server takes at most {min(limits.max_prompt_tokens, state.context_length - 1)}",
            param=prompt_field,
            code="context_length_exceeded",
        )
    if max_tokens is None:
        max_tokens = min(limits.default_max_tokens, room)
    elif max_tokens > limits.max_tokens:
        raise ApiError(400, f"{max_field}={max_tokens} exceeds this server's limit of {limits.max_tokens}", param=max_field)
    elif max_tokens > room:
        raise ApiError(
            400,
            f"prompt ({longest} tokens) + {max_field} ({max_tokens}) exceeds the context length {state.context_length}",
            param=max_field,
            code="context_length_exceeded",
        )
    if request.n > limits.max_n:
        raise ApiError(400, f"n={request.n} exceeds this server's limit of {limits.max_n}", param="n")
    if len(prompts) * request.n > limits.max_batch:
        raise ApiError(400, f"{len(prompts)} prompt(s) x n={request.n} exceeds {limits.max_batch} completions per request", param="n")
    params = SamplingParams(
        temperature=request.temperature,
        top_p=request.top_p,
        max_new_tokens=max_tokens,
        stop=request.stop_list(),
        seed=request.seed,
    )
    include_usage = bool(request.stream_options and request.stream_options.include_usage)
    if request.stream_options is not None and not request.stream:
        raise ApiError(400, "stream_options is only allowed with stream: true", param="stream_options")
    return Prepared(kind, prompts, request.n, params, top_logprobs > 0 or _wants_logprobs(request), top_logprobs, request.stream, include_usage, tools)


def _wants_logprobs(request: ChatRequest | CompletionRequest) -> bool:
    return bool(request.logprobs) if isinstance(request, ChatRequest) else request.logprobs is not None


def _chat_prepared(state: ServerState, request: ChatRequest) -> Prepared:
    tools = request.tools if request.tool_choice != "none" else None
    declared = [tool.model_dump(exclude_none=True) for tool in tools] if tools else None
    try:
        rendered = render_messages(request.messages, declared)
        prompt = render_prompt(state.tokenizer, rendered)
    except MessageError as error:
        raise ApiError(400, error.message, param=error.param) from None
    except TemplateError as error:
        raise ApiError(400, f"the chat template rejected these messages: {error}", param="messages") from None
    max_tokens = request.max_completion_tokens or request.max_tokens
    top = request.top_logprobs or 0
    return _prepare(state, "chat", request, [prompt], max_tokens, top, tool_names(declared) if declared else None)


def _completion_prepared(state: ServerState, request: CompletionRequest) -> Prepared:
    raw = request.prompt
    if isinstance(raw, str):
        texts_or_ids: list[Any] = [raw]
    elif raw and all(isinstance(item, int) for item in raw):
        texts_or_ids = [raw]
    else:
        texts_or_ids = list(raw)
    if not texts_or_ids:
        raise ApiError(400, "prompt must not be empty", param="prompt")
    if len(texts_or_ids) > state.limits.max_prompts:
        raise ApiError(400, f"{len(texts_or_ids)} prompts; this server takes at most {state.limits.max_prompts}", param="prompt")
    tokenizer = state.tokenizer
    prompts = []
    for index, item in enumerate(texts_or_ids):
        ids = tokenizer.encode(item, add_special_tokens=True) if isinstance(item, str) else list(item)
        if not ids:
            raise ApiError(400, f"prompt {index} is empty", param="prompt")
        if any(not 0 <= token < len(tokenizer) for token in ids):
            raise ApiError(400, f"prompt {index} holds token ids outside [0, {len(tokenizer)})", param="prompt")
        prompts.append(ids)
    prepared = _prepare(state, "completion", request, prompts, request.max_tokens, request.logprobs or 0, None)
    prepared.token_ids, prepared.tokens_as_ids = request.return_token_ids, request.return_tokens_as_token_ids
    prepared.prompt_logprobs = request.prompt_logprobs
    return prepared


# ------------------------------------------------------------------------ running a job


def _post(loop: asyncio.AbstractEventLoop, callback: Callable[..., None], *args: Any) -> None:
    """Run `callback(*args)` on `loop` from the worker thread; a closed loop (server gone) is ignored."""
    try:
        loop.call_soon_threadsafe(callback, *args)
    except RuntimeError:
        pass


def _submit(state: ServerState, prepared: Prepared, on_done: Callable[[Any], None], on_token: Callable[[int, int, int], None] | None) -> Job:
    job = Job(prepared.prompts, prepared.n, prepared.params, on_done=on_done, on_token=on_token, top_logprobs=prepared.top_logprobs)
    try:
        state.batcher.submit(job)
    except QueueFull as error:
        raise ApiError(503, f"the server is busy: {error}; retry later", type="server_error", code="queue_full", headers={"Retry-After": "1"}) from None
    except ShuttingDown:
        raise ApiError(503, "the server is shutting down", type="server_error", code="shutting_down") from None
    return job


def _failure(error: BaseException) -> ApiError:
    if isinstance(error, ShuttingDown):
        return ApiError(503, "the server is shutting down", type="server_error", code="shutting_down")
    return ApiError(500, "generation failed; see the server log", type="server_error")


async def _run(state: ServerState, prepared: Prepared) -> JobResult:
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()

    def resolve(result: Any) -> None:
        if not future.done():
            future.set_result(result)

    job = _submit(state, prepared, on_done=lambda result: _post(loop, resolve, result), on_token=None)
    try:
        result = await future
    finally:
        job.cancelled = True  # a no-op once done; drops the job if this handler was cancelled
    if isinstance(result, BaseException):
        raise _failure(result)
    return result


def _parsed(state: ServerState, prepared: Prepared, completion: Completion) -> ParsedOutput:
    if prepared.tools is None:
        return ParsedOutput(content=completion.text, tool_calls=[])
    parsed = parse_tool_calls(completion.text, prepared.tools)
    if parsed.error:
        state.metrics.tool_call_errors.inc()
        logger.info("unparsable tool call: %s", parsed.error)
    return parsed


def _count_tokens(state: ServerState, prepared: Prepared, result: JobResult) -> tuple[int, int]:
    prompt_tokens = sum(len(p) for p in prepared.prompts)
    completion_tokens = sum(len(c.token_ids) for group in result.completions for c in group)
    state.metrics.prompt_tokens.inc(prompt_tokens)
    state.metrics.completion_tokens.inc(completion_tokens)
    return prompt_tokens, completion_tokens


def _choices(state: ServerState, prepared: Prepared, result: JobResult) -> list[dict[str, Any]]:
    eos = state.engine.eos_ids
    choices = []
    for p, group in enumerate(result.completions):
        for s, completion in enumerate(group):
            top = result.top_logprobs[p][s] if result.top_logprobs else None
            choice: dict[str, Any] = {"index": p * prepared.n + s}
            if prepared.kind == "chat":
                parsed = _parsed(state, prepared, completion)
                choice["message"] = chat_message(parsed)
                choice["logprobs"] = chat_logprobs(completion, top, state.tokens, eos) if prepared.logprobs else None
                choice["finish_reason"] = chat_finish_reason(completion, parsed)
                if parsed.error:
                    choice["tool_call_error"] = parsed.error  # not in OpenAI's schema; clients ignore it
            else:
                choice["text"] = completion.text
                kept_eos = [] if prepared.token_ids else eos  # with token ids, the logprobs cover every id
                choice["logprobs"] = (completion_logprobs(completion, top, state.tokens, kept_eos, prepared.tokens_as_ids)
                                      if prepared.logprobs else None)
                choice["finish_reason"] = completion.finish_reason
                if prepared.token_ids:
                    choice["token_ids"], choice["prompt_token_ids"] = completion.token_ids, completion.prompt_ids
            choices.append(choice)
    return choices


def _body(state: ServerState, prepared: Prepared, response_id: str, created: int, choices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    kind = "chat.completion" if prepared.kind == "chat" else "text_completion"
    return {"id": response_id, "object": kind, "created": created, "model": state.model_id, "system_fingerprint": None, "choices": choices, **extra}


async def _answer(state: ServerState, prepared: Prepared) -> Response:
    response_id, created = new_id("chatcmpl" if prepared.kind == "chat" else "cmpl"), now()
    if prepared.stream:
        return _stream(state, prepared, response_id, created)
    result = await _run(state, prepared)
    counts = _count_tokens(state, prepared, result)
    choices = _choices(state, prepared, result)
    extra: dict[str, Any] = {"usage": usage(*counts)}
    if prepared.kind == "completion":  # which weights made it (the HTTP rollout engine tags completions with it)
        extra["weight_version"] = result.completions[0][0].weight_version
    if prepared.prompt_logprobs is not None:
        entries, version = await asyncio.to_thread(
            prompt_logprobs, state.engine, state.weights.lock, prepared.prompts, prepared.prompt_logprobs)
        if version != extra["weight_version"]:
            raise ApiError(503, "the weights were reloaded during this request; retry", type="server_error", code="weights_changed")
        for choice in choices:
            choice["prompt_logprobs"] = entries[choice["index"] // prepared.n]
    return JSONResponse(_body(state, prepared, response_id, created, choices, **extra))


# ------------------------------------------------------------------------ streaming


def _sse(payload: Any) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


def _stream(state: ServerState, prepared: Prepared, response_id: str, created: int) -> StreamingResponse:
    """Submit now (so a full queue is a plain 503) and stream chunks as tokens arrive."""
    loop = asyncio.get_running_loop()
    events: asyncio.Queue[tuple[Any, ...]] = asyncio.Queue()
    job = _submit(
        state,
        prepared,
        on_done=lambda result: _post(loop, events.put_nowait, ("done", result)),
        on_token=lambda p, s, t: _post(loop, events.put_nowait, ("token", p, s, t)),
    )
    chat = prepared.kind == "chat"
    extra = {"usage": None} if prepared.include_usage else {}
    started = time.perf_counter()

    def chunk(index: int, delta: str | dict[str, Any], finish: str | None = None, logprobs: Any = None) -> str:
        choice = {"index": index, ("delta" if chat else "text"): delta, "logprobs": logprobs, "finish_reason": finish}
        body = _body(state, prepared, response_id, created, [choice], **extra)
        body["object"] = "chat.completion.chunk" if chat else "text_completion"
        return _sse(body)

    def text_delta(text: str) -> str | dict[str, Any]:
        return {"content": text} if chat else text

    async def generate() -> AsyncIterator[str]:
        streams = {
            (p, s): StreamedText(state.tokenizer, prepared.params.stop, prepared.tools is not None)
            for p in range(len(prepared.prompts))
            for s in range(prepared.n)
        }
        try:
            if chat:
                for p, s in streams:
                    yield chunk(p * prepared.n + s, {"role": "assistant", "content": ""})
            outcome: Any = None
            while outcome is None:
                batch = [await events.get()]
                while not events.empty():
                    batch.append(events.get_nowait())
                fresh: dict[tuple[int, int], list[int]] = {}
                for event in batch:
                    if event[0] == "token":
                        fresh.setdefault((event[1], event[2]), []).append(event[3])
                    else:
                        outcome = event[1]
                for key, ids in fresh.items():
                    delta = streams[key].feed(ids)
                    if delta:
                        yield chunk(key[0] * prepared.n + key[1], text_delta(delta))
            if isinstance(outcome, BaseException):
                yield _sse(_failure(outcome).body())
                yield "data: [DONE]\n\n"
                return
            for text in _final_chunks(state, prepared, outcome, streams, chunk, text_delta):
                yield text
            if prepared.include_usage:
                counts = _count_tokens(state, prepared, outcome)
                final = _body(state, prepared, response_id, created, [], usage=usage(*counts))
                final["object"] = "chat.completion.chunk" if chat else "text_completion"
                yield _sse(final)
            else:
                _count_tokens(state, prepared, outcome)
            yield "data: [DONE]\n\n"
        finally:
            job.cancelled = True  # the client went away, or we are done: either way drop queued work
            endpoint = "/v1/chat/completions" if chat else "/v1/completions"
            state.metrics.latency.labels(endpoint).observe(time.perf_counter() - started)

    return StreamingResponse(generate(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


def _final_chunks(
    state: ServerState,
    prepared: Prepared,
    result: JobResult,
    streams: dict[tuple[int, int], StreamedText],
    chunk: Callable[..., str],
    text_delta: Callable[[str], Any],
) -> list[str]:
    """Per choice: the held-back rest of the content, the tool calls, then the finish reason (with
    the choice's logprobs, which the engine only has once the completion is done)."""
    out = []
    eos = state.engine.eos_ids
    for p, group in enumerate(result.completions):
        for s, completion in enumerate(group):
            index = p * prepared.n + s
            top = result.top_logprobs[p][s] if result.top_logprobs else None
            if prepared.kind == "chat":
                parsed = _parsed(state, prepared, completion)
                rest = streams[(p, s)].rest(parsed.content)
                if rest:
                    out.append(chunk(index, text_delta(rest)))
                if parsed.tool_calls:
                    calls = [{"index": i, **call} for i, call in enumerate(tool_call_objects(parsed))]
                    out.append(chunk(index, {"tool_calls": calls}))
                logprobs = chat_logprobs(completion, top, state.tokens, eos) if prepared.logprobs else None
                out.append(chunk(index, {}, chat_finish_reason(completion, parsed), logprobs))
            else:
                rest = streams[(p, s)].rest(completion.text)
                logprobs = completion_logprobs(completion, top, state.tokens, eos) if prepared.logprobs else None
                out.append(chunk(index, rest, completion.finish_reason, logprobs))
    return out


# ------------------------------------------------------------------------ routes


def _error(error: ApiError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status, headers=error.headers)


def _authorize(state: ServerState, request: Request) -> None:
    if state.api_key is None:
        return
    header = request.headers.get("authorization", "")
    scheme, _, key = header.partition(" ")
    if scheme.lower() != "bearer" or not key:
        raise ApiError(401, "no API key: send 'Authorization: Bearer <key>'", code="invalid_api_key")
    if not hmac.compare_digest(key.strip().encode(), state.api_key.encode()):
        raise ApiError(401, "Incorrect API key provided", code="invalid_api_key")


def create_app(state: ServerState) -> Starlette:
    """The Starlette application over `state` (whose batcher is already running)."""

    def endpoint(name: str, handler: Callable[[Request], Awaitable[Response]], auth: bool = True) -> Callable[[Request], Awaitable[Response]]:
        async def wrapped(request: Request) -> Response:
            started = time.perf_counter()
            try:
                if auth:
                    _authorize(state, request)
                response = await handler(request)
            except ApiError as error:
                response = _error(error)
            except Exception:  # the client gets a clean 500, the log the traceback
                logger.exception("unexpected error on %s", name)
                response = _error(ApiError(500, "internal server error; see the server log", type="server_error"))
            state.metrics.requests.labels(name, str(response.status_code)).inc()
            if not isinstance(response, StreamingResponse):  # a stream's latency is not known yet
                state.metrics.latency.labels(name).observe(time.perf_counter() - started)
            return response

        return wrapped

    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [_model_card(state)]})

    async def model(request: Request) -> Response:
        _check_model(state, request.path_params["model"])
        return JSONResponse(_model_card(state))

    async def chat_completions(request: Request) -> Response:
        parsed = parse_request(ChatRequest, await read_json(request, state.limits.max_body_bytes))
        _check_model(state, parsed.model)
        require_verified(state.engine)
        return await _answer(state, _chat_prepared(state, parsed))

    async def completions(request: Request) -> Response:
        parsed = parse_request(CompletionRequest, await read_json(request, state.limits.max_body_bytes))
        _check_model(state, parsed.model)
        require_verified(state.engine)
        return await _answer(state, _completion_prepared(state, parsed))

    async def weights(request: Request) -> Response:
        if request.method == "GET":
            return JSONResponse(state.weights.describe(state.engine))
        return await reload_weights(state.weights, state.engine, request)

    async def metrics(request: Request) -> Response:
        return Response(state.metrics.exposition(), media_type=CONTENT_TYPE)

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok", "queue_depth": state.batcher.depth()})

    async def http_error(request: Request, error: Exception) -> Response:
        status = error.status_code if isinstance(error, HTTPException) else 500
        message = {404: f"no route {request.url.path}", 405: f"method {request.method} not allowed on {request.url.path}"}
        state.metrics.requests.labels("other", str(status)).inc()
        return _error(ApiError(status, message.get(status, "request failed"), code="not_found" if status == 404 else None))

    routes = [
        Route("/v1/models", endpoint("/v1/models", models), methods=["GET"]),
        Route("/v1/models/{model:path}", endpoint("/v1/models/{model}", model), methods=["GET"]),
        Route("/v1/chat/completions", endpoint("/v1/chat/completions", chat_completions), methods=["POST"]),
        Route("/v1/completions", endpoint("/v1/completions", completions), methods=["POST"]),
        Route("/v1/weights", endpoint("/v1/weights", weights), methods=["GET", "POST"]),
        Route("/metrics", endpoint("/metrics", metrics, auth=False), methods=["GET"]),
        Route("/health", endpoint("/health", health, auth=False), methods=["GET"]),
    ]
    return Starlette(routes=routes, exception_handlers={HTTPException: http_error})


def _model_card(state: ServerState) -> dict[str, Any]:
    return {"id": state.model_id, "object": "model", "created": state.created, "owned_by": "tidal", "max_model_len": state.context_length}
