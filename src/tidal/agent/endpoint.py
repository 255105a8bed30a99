"""`EndpointPolicy`: any OpenAI-compatible chat-completions endpoint, over plain HTTP (urllib).

The spec is `openai:<model>@<base_url>`, e.g. `openai:tiny@http://127.0.0.1:8000/v1` for
`tidal serve`; the key comes from the environment variable `api_key_env` (OPENAI_API_KEY by
default), sent as a bearer token when set. Tools go in the request's `tools` field and the reply's
`tool_calls` are the calls (`arguments` parsed strictly); a reply without `tool_calls` is parsed
with the local text format, so a raw-text server is scored as a local model is.

Failures are typed (tidal.errors): 401/403 `EndpointAuthError` and 404 `EndpointConfigError` end
the evaluation; an unreachable host, a timeout, 429 or 5xx, and a 200 whose body is not a chat
completion (the server is broken, not the model) are `EndpointUnavailableError` after
`request_retries` quick retries (the harness retries the episode, then reports an infra error);
400/413/422 is `EndpointRequestError`, the conversation refused (e.g. over its context window): an
agent error. docs/design/agent.md, "Endpoints".
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from typing import Any

from tidal.agent.http_errors import http_error
from tidal.agent.protocol import Message, Turn, TurnTimeout
from tidal.agent.render import answer_messages
from tidal.agent.toolcall import (
    MAX_CALL_CHARS,
    CallValidity,
    ParsedTurn,
    ToolCall,
    parse_call_body,
    parse_tool_calls,
)
from tidal.agent.window import shrink
from tidal.errors import (
    EndpointConfigError,
    EndpointUnavailableError,
)
from tidal.types import Task

MAX_RESPONSE_BYTES = 8 << 20


def parse_spec(spec: str) -> tuple[str, str]:
    """`openai:<model>@<base_url>` as (model, base_url); EndpointConfigError when malformed."""
    body = spec.removeprefix("openai:")
    at = body.rfind("@http")
    if not spec.startswith("openai:") or at <= 0:
        raise EndpointConfigError(f"model spec {spec!r}: write openai:<model>@<base_url>, "
                                  "e.g. openai:gpt-4o-mini@https://api.openai.com/v1")
    return body[:at], body[at + 1:].rstrip("/")


class EndpointClient:
    """POSTs chat completions; maps every failure to a typed EndpointError."""

    def __init__(self, base_url: str, api_key: str | None, timeout_s: float = 120.0,
                 request_retries: int = 2, retry_delay_s: float = 1.0) -> None:
        self.base_url, self.api_key, self.timeout_s = base_url, api_key, timeout_s
        self.request_retries, self.retry_delay_s = request_retries, retry_delay_s

    def chat(self, body: dict[str, Any], deadline: float | None = None) -> dict[str, Any]:
        """One chat completion, retried on unavailability. With `deadline` (time.monotonic()) each
        request's timeout is cut to what is left, and no retry starts after it: `TurnTimeout`."""
        for attempt in range(self.request_retries + 1):
            timeout = self.timeout_s if deadline is None else min(self.timeout_s, deadline - time.monotonic())
            if timeout <= 0:
                raise TurnTimeout(f"{self.base_url}: the episode's wall time ran out before the reply")
            try:
                return self._post("/chat/completions", body, timeout)
            except EndpointUnavailableError:
                if deadline is not None and time.monotonic() >= deadline:
                    raise TurnTimeout(f"{self.base_url}: no reply before the episode's wall time ran out") from None
                if attempt == self.request_retries:
                    raise
                time.sleep(self.retry_delay_s * (2 ** attempt))
        raise AssertionError("unreachable")

    def _post(self, path: str, body: dict[str, Any], timeout_s: float | None = None) -> dict[str, Any]:
        url = self.base_url + path
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        request = urllib.request.Request(url, json.dumps(body).encode("utf-8"), headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=timeout_s or self.timeout_s) as response:
                data = response.read(MAX_RESPONSE_BYTES + 1)
        except urllib.error.HTTPError as error:
            raise http_error(url, error) from None
        except (urllib.error.URLError, TimeoutError, ConnectionError, OSError) as error:
            reason = getattr(error, "reason", error)
            raise EndpointUnavailableError(f"{url}: cannot reach the endpoint ({reason}); is the server up "
                                           f"and the base URL right?", url) from None
        if len(data) > MAX_RESPONSE_BYTES:
            raise EndpointUnavailableError(f"{url}: response over {MAX_RESPONSE_BYTES >> 20} MiB", url)
        try:
            parsed = json.loads(data)
        except ValueError:
            raise EndpointUnavailableError(f"{url}: the response is not JSON: {data[:200]!r}", url) from None
        if not isinstance(parsed, dict):
            raise EndpointUnavailableError(f"{url}: the response is not a JSON object", url)
        return parsed


def parse_reply(reply: dict[str, Any], url: str) -> tuple[str, ParsedTurn, list[str], str, dict[str, Any]]:
    """(text, parsed turn, call ids, finish reason, usage) of a chat-completion reply."""
    choices = reply.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise EndpointUnavailableError(f"{url}: the reply has no choices: {str(reply)[:200]}", url)
    message = choices[0].get("message")
    if not isinstance(message, dict):
        raise EndpointUnavailableError(f"{url}: the reply's choice has no message", url)
    content = message.get("content") or ""
    content = content if isinstance(content, str) else json.dumps(content)
    finish = str(choices[0].get("finish_reason") or "stop")
    usage = reply.get("usage") if isinstance(reply.get("usage"), dict) else {}
    raw_calls = message.get("tool_calls") or []
    if not raw_calls:
        return content, parse_tool_calls(content), [], finish, usage
    ids: list[str] = []
    calls: list[ToolCall] = []
    error = ""
    if not isinstance(raw_calls, list):
        return content, ParsedTurn(content, [], CallValidity.PARSE_ERROR, "tool_calls is not a list"), [], finish, usage
    for index, raw in enumerate(raw_calls):
        function = raw.get("function") if isinstance(raw, dict) else None
        call_id = str(raw.get("id") or f"call_{index}") if isinstance(raw, dict) else f"call_{index}"
        ids.append(call_id)
        if not isinstance(function, dict) or not isinstance(function.get("arguments", "{}"), (str, dict)):
            error = error or f"tool call {index} has no function with a name and arguments"
            continue
        call = _structured_call(function.get("name"), function.get("arguments", "{}"))
        if isinstance(call, str):
            error = error or f"tool call {index}: {call}"
            continue
        call.id = call_id
        calls.append(call)
    text = content + "".join(f"\n[tool_call {c.name} {json.dumps(c.arguments)}]" for c in calls)
    if error:
        return text, ParsedTurn(content, [], CallValidity.PARSE_ERROR, error), ids, finish, usage
    return text, ParsedTurn(content, calls), ids, finish, usage


def _structured_call(name: Any, arguments: str | dict[str, Any]) -> ToolCall | str:
    """An OpenAI tool call (its arguments a JSON string, or an object from lenient servers)."""
    if isinstance(arguments, str):
        if len(arguments) > MAX_CALL_CHARS:
            return f"the arguments are {len(arguments)} characters, over the {MAX_CALL_CHARS} limit"
        try:
            arguments = json.loads(arguments or "{}")
        except RecursionError:
            return "the arguments are nested too deeply"
        except ValueError as error:
            return f"the arguments are not valid JSON: {error}"
    try:
        return parse_call_body(json.dumps({"name": name, "arguments": arguments}))
    except (TypeError, ValueError, RecursionError) as error:
        return f"the call cannot be read: {error}"


class EndpointConversation:
    """One episode as an OpenAI-style message list."""

    def __init__(self, policy: EndpointPolicy, messages: list[Message], tools: list[dict[str, Any]], seed: int) -> None:
        self.policy, self.messages, self.tools, self.seed = policy, list(messages), tools, seed
        self.opening = len(self.messages)  # system and task layers: never rewritten (window.shrink)
        self.rewrites: list[dict[str, Any]] = []
        self.prompt_tokens = 0  # the endpoint's count for the last turn

    @property
    def context_tokens(self) -> int:
        return self.prompt_tokens

    def generate(self, max_new_tokens: int, deadline: float | None = None) -> Turn:
        policy = self.policy
        body: dict[str, Any] = {"model": policy.model, "messages": self.messages,
                                "max_tokens": max(1, max_new_tokens), "temperature": policy.temperature,
                                "seed": self.seed}
        if self.tools:  # a single-turn task offers none, and APIs refuse an empty list
            body["tools"] = self.tools
        started = time.perf_counter()
        first_token_s = None
        if policy.stream:  # streamed only to time the first token (agent/streaming.py)
            from tidal.agent.streaming import stream_chat

            reply, first_token_s = stream_chat(policy.client, body, deadline)
        else:
            reply = policy.client.chat(body, deadline)
        elapsed = time.perf_counter() - started
        text, parsed, ids, finish, usage = parse_reply(reply, policy.client.base_url)
        message = reply["choices"][0]["message"]
        assistant: Message = {"role": "assistant", "content": message.get("content") or ""}
        if ids:
            assistant["tool_calls"] = [c for c in message.get("tool_calls", []) if isinstance(c, dict)]
        self.messages.append(assistant)
        tokens_in = _count(usage.get("prompt_tokens"))
        tokens_out = _count(usage.get("completion_tokens")) or len(text) // 4
        self.prompt_tokens = tokens_in + tokens_out
        return Turn(text, parsed, tokens_in, tokens_out, elapsed, finish, call_ids=ids, first_token_s=first_token_s)

    def observe(self, turn: Turn, results: list[str]) -> None:
        # Every tool_call id must be answered (an invalid turn answers each with the error); a
        # turn without tool_calls is answered by a user message.
        self.messages.extend(answer_messages(results, len(turn.call_ids), turn.call_ids))

    def shrink(self, strategy: list[str] | tuple[str, ...]) -> str | None:
        """One step of the overflow strategy (window.shrink), after the server refused the request
        for its length; the runner then sends the shorter conversation."""
        done = shrink(self.messages, self.opening, strategy)
        if done is not None:
            self.rewrites.append({"turn": len([m for m in self.messages if m.get("role") == "assistant"]),
                                  "change": done})
        return done

    def trace(self) -> dict[str, Any]:
        return {"messages": self.messages, **({"context_rewrites": self.rewrites} if self.rewrites else {})}


def _count(value: Any) -> int:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0 else 0


class EndpointPolicy:
    """A model behind an OpenAI-compatible endpoint; the tools go in the request's `tools` field."""

    def __init__(self, model: str, base_url: str, api_key_env: str = "OPENAI_API_KEY", temperature: float = 0.0,
                 timeout_s: float = 120.0, request_retries: int = 2, retry_delay_s: float = 1.0,
                 stream: bool = False) -> None:
        self.model, self.name, self.temperature = model, f"openai:{model}@{base_url}", temperature
        self.stream = stream  # stream replies to measure time to first token
        self.client = EndpointClient(base_url, os.environ.get(api_key_env) or None, timeout_s,
                                     request_retries, retry_delay_s)

    @classmethod
    def from_spec(cls, spec: str, **options: Any) -> EndpointPolicy:
        model, base_url = parse_spec(spec)
        return cls(model, base_url, **options)

    def start(self, task: Task, messages: list[Message], tools: list[dict[str, Any]],
              seed: int = 0) -> EndpointConversation:
        return EndpointConversation(self, messages, tools, seed)
