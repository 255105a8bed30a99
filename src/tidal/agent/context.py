"""The context policy: a layered prompt, long tool output compressed, and what to do when a turn
does not fit the model's context window.

Layers, in this fixed order: **system** (how to behave; the tools' declarations and call format are
added by whoever renders the prompt, `render.render_messages`, in process or behind a server) as
the system message; then in the task's user message **memory** (standing notes a team gives every
episode, e.g. conventions of their repository), the **task** (its prompt and the files it starts
with) and **retrieval** (the `retrieval_k` documents of `retrieval` most relevant to the task's
prompt by BM25, retrieval.py), each under a `## Memory` / `## Task` / `## Retrieved documents`
marker. A prompt with only the task layer has no markers. Then come the **tool results**, one
message per call as the episode goes.

A tool result longer than `max_observation_chars` keeps its head (`head_fraction` of the room) and
tail around `[... N characters truncated ...]`, so the model sees both the start of a log and the
error at its end. With a `summarizer` (a model, harness.py), a result longer than
`summarize_over_chars` is replaced by `[summary of a N-character tool output]` and the model's
summary (the step's call record says `summarized`); a summariser that fails falls back to the cut.
Earlier turns are rewritten only by the `overflow` strategy (window.py), never by default.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tidal.agent.protocol import TurnTimeout
from tidal.errors import TidalError
from tidal.types import Task

logger = logging.getLogger(__name__)

DEFAULT_SYSTEM = (
    "You are an agent working in a Linux workspace (your current folder). Use the tools to inspect "
    "and change files and to run commands, one step at a time, and call submit when the task is done."
)


@dataclass
class ContextPolicy:
    """How an episode's prompt is laid out and how much of each tool result the model reads."""

    system: str = DEFAULT_SYSTEM
    memory: str = ""
    max_observation_chars: int = 8000
    max_listed_files: int = 50
    head_fraction: float = 2 / 3  # of the kept characters, the share taken from the start
    retrieval: Any = None  # a retrieval.DocumentIndex, or None
    retrieval_k: int = 3
    retrieval_chars: int = 2000  # of each retrieved document
    summarizer: Callable[[str], str] | None = None  # a tool output -> its summary (a model)
    summarize_over_chars: int | None = None  # summarise outputs longer than this (with a summarizer)
    overflow: tuple[str, ...] = field(default_factory=tuple)  # window.shrink steps, in order

    def messages(self, task: Task) -> list[dict[str, str]]:
        """The opening messages: the system layer, then memory, task and retrieval layers in the
        task's user message. Every policy gets these same messages; the tools travel beside them
        (`Policy.start`)."""
        system = self.system
        task_messages = task.messages()
        # A task's own system messages join the system layer; its other messages follow in order.
        system_parts = [m["content"] for m in task_messages if m["role"] == "system"]
        rest = [m for m in task_messages if m["role"] != "system"]
        if system_parts:
            system += "\n\n" + "\n\n".join(system_parts)
        files = ""
        if task.files:
            names = sorted(task.files)
            listed = ", ".join(names[: self.max_listed_files])
            more = f" and {len(names) - self.max_listed_files} more" if len(names) > self.max_listed_files else ""
            files = f"Files in the workspace: {listed}{more}."
        last_user = rest[-1]["content"] if rest and rest[-1]["role"] == "user" else ""
        body = "\n\n".join(part for part in (last_user, files) if part)
        retrieved = self._retrieved(task.prompt or last_user)
        if self.memory or retrieved:
            sections = [f"## Memory\n{self.memory}"] if self.memory else []
            sections.append(f"## Task\n{body}")
            if retrieved:
                sections.append(f"## Retrieved documents\n{retrieved}")
            body = "\n\n".join(sections)
        if rest and rest[-1]["role"] == "user":
            rest[-1] = {"role": "user", "content": body}
        elif body:
            rest.append({"role": "user", "content": body})
        return [{"role": "system", "content": system}, *rest]

    def _retrieved(self, query: str) -> str:
        if self.retrieval is None:
            return ""
        found = self.retrieval.search(query, self.retrieval_k)
        return "\n\n".join(f"### [{i + 1}] {d.name}\n{truncate(d.text, self.retrieval_chars, self.head_fraction)[0]}"
                            for i, d in enumerate(found))

    def observation(self, text: str) -> tuple[str, bool]:
        """`text` cut to `max_observation_chars` (head and tail kept), and whether it was cut."""
        return truncate(text, self.max_observation_chars, self.head_fraction)

    def compress(self, text: str) -> tuple[str, bool, bool]:
        """What the model reads of a tool output: (text, cut, summarised); see the module docstring."""
        over = self.summarize_over_chars
        if self.summarizer is not None and over is not None and len(text) > over:
            try:
                summary = self.summarizer(text)
            except (TidalError, TurnTimeout) as error:  # another model call: its failure is not the episode's
                logger.warning("summarising a %d-character tool output failed (%s); cutting it instead",
                               len(text), error)
            else:
                shown, cut = self.observation(f"[summary of a {len(text)}-character tool output]\n{summary}")
                return shown, cut, True
        shown, cut = self.observation(text)
        return shown, cut, False


def truncate(text: str, limit: int, head_fraction: float = 2 / 3) -> tuple[str, bool]:
    """Keep the first and last parts of `text` around a marker saying how many characters went."""
    if len(text) <= limit:
        return text, False
    marker = "\n[... {} characters truncated ...]\n"
    room = max(0, limit - len(marker.format(len(text))))
    head = int(room * head_fraction)
    tail = room - head
    cut = len(text) - head - tail
    return text[:head] + marker.format(cut) + (text[len(text) - tail:] if tail else ""), True
