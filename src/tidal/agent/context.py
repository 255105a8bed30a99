"""The context policy: a layered prompt, and long tool output cut with a marker.

Layers, in order: **system** (how to behave; the tools' declarations and call format are added by
whoever renders the prompt, `render.render_messages`, in process or behind a server), **task** (the task's prompt and the files it starts with),
**memory** (standing notes a team gives every episode, e.g. conventions of their repository) and
then the **tool results**, one message per call as the episode goes. A tool result longer than
`max_observation_chars` keeps its head and tail and says how much was cut, so the model sees both
the start of a log and the error at its end. Earlier turns are never rewritten: a local model's
episode is token-in/token-out, and summarising would change tokens it has already read.
"""

from __future__ import annotations

from dataclasses import dataclass

from tidal.types import Task

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

    def messages(self, task: Task) -> list[dict[str, str]]:
        """The opening messages: system layer, then the task (and memory) layer. Every policy gets
        these same messages; the tools travel beside them (`Policy.start`)."""
        system = self.system
        task_messages = task.messages()
        # A task's own system messages join the system layer; its other messages follow in order.
        system_parts = [m["content"] for m in task_messages if m["role"] == "system"]
        rest = [m for m in task_messages if m["role"] != "system"]
        if system_parts:
            system += "\n\n" + "\n\n".join(system_parts)
        extra = []
        if task.files:
            names = sorted(task.files)
            listed = ", ".join(names[: self.max_listed_files])
            more = f" and {len(names) - self.max_listed_files} more" if len(names) > self.max_listed_files else ""
            extra.append(f"Files in the workspace: {listed}{more}.")
        if self.memory:
            extra.append(f"Notes:\n{self.memory}")
        if extra and rest and rest[-1]["role"] == "user":
            rest[-1] = {"role": "user", "content": rest[-1]["content"] + "\n\n" + "\n\n".join(extra)}
        elif extra:
            rest.append({"role": "user", "content": "\n\n".join(extra)})
        return [{"role": "system", "content": system}, *rest]

    def observation(self, text: str) -> tuple[str, bool]:
        """`text` cut to `max_observation_chars` (head and tail kept), and whether it was cut."""
        return truncate(text, self.max_observation_chars)


def truncate(text: str, limit: int) -> tuple[str, bool]:
    """Keep the first and last parts of `text` around a marker saying how many characters went."""
    if len(text) <= limit:
        return text, False
    marker = "\n[... {} characters truncated ...]\n"
    room = max(0, limit - len(marker.format(len(text))))
    head = room * 2 // 3
    tail = room - head
    cut = len(text) - head - tail
    return text[:head] + marker.format(cut) + (text[len(text) - tail:] if tail else ""), True
