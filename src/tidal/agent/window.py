"""The context window: one rule for every road to a model, and what to do when a turn does not fit.

A turn fits when its prompt leaves room in the model's context window for the tokens it may
generate: `prompt < window and prompt + max_new_tokens <= window`. That is the rule `tidal serve`
applies to every request (serve/app.py refuses anything else with 400 `context_length_exceeded`),
so the runner applies it before a local turn and reads the server's refusal of a served one: the
same checkpoint on the same tasks ends the same way in process and behind the server.

When a turn does not fit, the configured `overflow` strategy frees room one step at a time, oldest
first, then the turn is tried again:

- `elide_observations`: the oldest tool result (or error message) still shown in full is replaced
  by `[earlier tool output elided: N characters]`;
- `drop_turns`: the oldest model turn is dropped with the messages that answered it.

The opening messages (system and task layers) are never touched. When no step is left, the
episode ends `context_exceeded`. An empty strategy (the default) ends it at once, which keeps a
local episode token-in/token-out (any rewrite re-renders the prompt, so RL never rewrites).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

OverflowStep = Literal["elide_observations", "drop_turns"]
OVERFLOW_STEPS: tuple[str, ...] = ("elide_observations", "drop_turns")
ELIDED = "[earlier tool output elided: {} characters]"


def fits(prompt_tokens: int, max_new_tokens: int, window: int | None) -> bool:
    """Whether a turn of `max_new_tokens` on a prompt of `prompt_tokens` fits `window` (None: unknown)."""
    return window is None or (prompt_tokens < window and prompt_tokens + max_new_tokens <= window)


def model_context_length(model: Any) -> int | None:
    """The context window of a local model, or of a policy or engine holding one: its config's
    `max_position_embeddings`, as `tidal serve` reads it; None when unknown (an endpoint)."""
    for name in ("engine", "model"):
        while hasattr(model, name) and not hasattr(model, "config"):
            model = getattr(model, name)
    value = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    return int(value) if isinstance(value, int) and value > 0 else None


def _is_observation(message: dict[str, Any]) -> bool:
    """After the opening messages, a tool result or the user message answering a turn (its error)."""
    return message.get("role") in ("tool", "user")


def shrink(messages: list[dict[str, Any]], opening: int, strategy: Sequence[str]) -> str | None:
    """Apply the first step of `strategy` that can still free room to `messages[opening:]`, in
    place; what it did, or None when nothing is left to free."""
    for step in strategy:
        if step == "elide_observations":
            for index in range(opening, len(messages)):
                message, content = messages[index], str(messages[index].get("content") or "")
                marker = ELIDED.format(len(content))
                if (_is_observation(message)
                        and not content.startswith("[earlier tool output elided") and len(content) > len(marker)):
                    messages[index] = {**message, "content": marker}
                    return f"elided the tool output of message {index} ({len(content)} characters)"
        elif step == "drop_turns":
            first = next((i for i in range(opening, len(messages)) if messages[i].get("role") == "assistant"), None)
            if first is None:
                continue
            end = first + 1
            while end < len(messages) and messages[end].get("role") != "assistant":
                end += 1
            del messages[first:end]
            return f"dropped {end - first} message(s) of the oldest turn"
        else:
            raise ValueError(f"unknown overflow step {step!r}; the steps are {', '.join(OVERFLOW_STEPS)}")
    return None
