"""OpenAI response bodies from engine completions: chat and text completions, logprobs, and the
incremental text of a streamed choice."""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from transformers import PreTrainedTokenizerBase

from tidal.serve.chat import ParsedOutput, stop_holdback, tool_call_holdback
from tidal.types import Completion


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def now() -> int:
    return int(time.time())


@lru_cache(maxsize=1)
def _unicode_to_byte() -> dict[str, int]:
    """The inverse of GPT-2's byte-to-unicode table that byte-level BPE vocabularies are written in."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("\u00a1"), ord("\u00ac") + 1), *range(ord("\u00ae"), 256)]
    table, shifted = {}, 0
    for byte in range(256):
        if byte in printable:
            table[chr(byte)] = byte
        else:
            table[chr(256 + shifted)] = byte
            shifted += 1
    return table


class TokenText:
    """The text and bytes of single tokens, for logprobs (a token may be part of a UTF-8 character)."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self.tokenizer = tokenizer
        backend = getattr(tokenizer, "backend_tokenizer", None)
        decoder = getattr(backend, "decoder", None)
        self.byte_level = type(decoder).__name__ == "ByteLevel"
        self.special = set(tokenizer.all_special_ids)
        self._cache: dict[int, bytes] = {}

    def bytes(self, token_id: int) -> bytes:
        cached = self._cache.get(token_id)
        if cached is not None:
            return cached
        piece = self.tokenizer.convert_ids_to_tokens(token_id)
        table = _unicode_to_byte()
        if self.byte_level and token_id not in self.special and piece and all(ch in table for ch in piece):
            raw = bytes(table[ch] for ch in piece)
        else:
            raw = self.tokenizer.decode([token_id]).encode("utf-8")
        self._cache[token_id] = raw
        return raw

    def text(self, token_id: int) -> str:
        return self.bytes(token_id).decode("utf-8", errors="replace")


def kept_tokens(completion: Completion, eos_ids: list[int]) -> tuple[list[int], list[float]]:
    """The completion's tokens and logprobs without a final eos token (not part of the answer)."""
    ids, logprobs = completion.token_ids, completion.logprobs
    if completion.finish_reason == "stop" and ids and ids[-1] in eos_ids:
        return ids[:-1], logprobs[:-1]
    return ids, logprobs


def chat_logprobs(
    completion: Completion, top: list[list[tuple[int, float]]] | None, tokens: TokenText, eos_ids: list[int]
) -> dict[str, Any]:
    """`choice.logprobs` of a chat completion: one entry per token with its top alternatives."""
    ids, logprobs = kept_tokens(completion, eos_ids)
    content = []
    for position, (token_id, logprob) in enumerate(zip(ids, logprobs)):
        alternatives = top[position] if top else []
        content.append(
            {
                "token": tokens.text(token_id),
                "logprob": logprob,
                "bytes": list(tokens.bytes(token_id)),
                "top_logprobs": [
                    {"token": tokens.text(alt), "logprob": value, "bytes": list(tokens.bytes(alt))} for alt, value in alternatives
                ],
            }
        )
    return {"content": content, "refusal": None}


def completion_logprobs(
    completion: Completion, top: list[list[tuple[int, float]]] | None, tokens: TokenText, eos_ids: list[int],
    as_ids: bool = False,
) -> dict[str, Any]:
    """`choice.logprobs` of a legacy text completion: parallel lists of tokens and logprobs (with
    `as_ids`, each token written 'token_id:<id>', vLLM's `return_tokens_as_token_ids`)."""
    ids, logprobs = kept_tokens(completion, eos_ids)
    texts = [f"token_id:{token_id}" if as_ids else tokens.text(token_id) for token_id in ids]
    offsets, offset = [], 0
    for text in texts:
        offsets.append(offset)
        offset += len(text)
    return {
        "tokens": texts,
        "token_logprobs": logprobs,
        "top_logprobs": [{tokens.text(alt): value for alt, value in top[i]} for i in range(len(ids))] if top else None,
        "text_offset": offsets,
    }


def tool_call_objects(parsed: ParsedOutput) -> list[dict[str, Any]]:
    return [
        {
            "id": f"call_{uuid.uuid4().hex[:24]}",
            "type": "function",
            "function": {"name": call.name, "arguments": json.dumps(call.arguments, ensure_ascii=False)},
        }
        for call in parsed.tool_calls
    ]


def chat_finish_reason(completion: Completion, parsed: ParsedOutput) -> str:
    return "tool_calls" if parsed.tool_calls else completion.finish_reason


def chat_message(parsed: ParsedOutput) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": parsed.content, "refusal": None}
    if parsed.tool_calls:
        message["tool_calls"] = tool_call_objects(parsed)
    return message


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens, "total_tokens": prompt_tokens + completion_tokens}


@dataclass
class StreamedText:
    """The text of one streamed choice so far, and how much of it is safe to send.

    Holds back a trailing partial UTF-8 character, a suffix that may begin a stop string, and (with
    tools) anything from `<tool_call>` on, so that what was sent is always a prefix of the final
    content computed from the whole completion.
    """

    tokenizer: PreTrainedTokenizerBase
    stop: list[str]
    tools: bool
    ids: list[int] = field(default_factory=list)
    sent: str = ""
    frozen: bool = False  # a stop string or tool call was reached: nothing more until the end

    def feed(self, token_ids: list[int]) -> str:
        """Add tokens; the new text that may be sent now ("" when none)."""
        self.ids.extend(token_ids)
        if self.frozen:
            return ""
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True).rstrip("\ufffd")
        limit = len(text)
        if self.stop:
            limit, stopped = stop_holdback(text, self.stop)
            self.frozen = stopped
        if self.tools:
            self.frozen = self.frozen or "<tool_call>" in text[:limit]
            limit = tool_call_holdback(text[:limit])
        if limit <= len(self.sent) or not text.startswith(self.sent):
            return ""
        delta = text[len(self.sent) : limit]
        self.sent = text[:limit]
        return delta

    def rest(self, final: str | None) -> str:
        """What remains to send of the final content (empty if it no longer extends what was sent)."""
        final = final or ""
        return final[len(self.sent) :] if final.startswith(self.sent) else ""
