"""The eval config's context settings as an episode's `AgentConfig`: prompt layers, compression of
long tool output (a summarising model included), and the context window.

`agent_config(settings, policy)` reads the memory file and indexes the retrieval documents once,
when the eval starts (the paths were checked at config load); `summarizer(policy, ...)` turns a
policy into a function from a tool output to its summary: a fresh single-turn conversation with no
tools, greedy, seeded 0, so the same output is summarised the same way in every episode.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tidal.agent.context import DEFAULT_SYSTEM, ContextPolicy, truncate
from tidal.agent.policy import Policy
from tidal.agent.retrieval import DocumentIndex
from tidal.agent.runner import AgentConfig
from tidal.agent.window import model_context_length
from tidal.errors import ConfigError
from tidal.eval.settings import EvalSettings
from tidal.types import Task

SUMMARY_SYSTEM = ("You summarise the output of a command for an agent that cannot see it. Keep every error "
                  "message, file name, number and result the agent needs; drop repetition. Answer with the "
                  "summary only.")


def summarizer(policy: Policy, max_tokens: int, input_chars: int) -> Callable[[str], str]:
    """A function that summarises a tool output with `policy` (see the module docstring)."""
    task = Task(id="observation-summary", domain="general", prompt="summarise", verifier={"name": "exact_match"})

    def summarize(text: str) -> str:
        shown, _ = truncate(text, input_chars)
        messages = [{"role": "system", "content": SUMMARY_SYSTEM}, {"role": "user", "content": shown}]
        return policy.start(task, messages, [], seed=0).generate(max_tokens).text.strip()

    return summarize


def memory_text(settings: EvalSettings) -> str:
    """The memory layer: the config's text, then the memory file's."""
    prompt = settings.prompt
    parts = [prompt.memory.strip()] if prompt.memory.strip() else []
    if prompt.memory_file is not None:
        try:
            parts.append(prompt.memory_file.read_text(encoding="utf-8").strip())
        except (OSError, UnicodeDecodeError) as error:
            raise ConfigError([f"prompt.memory_file: cannot read {prompt.memory_file}: {error}"]) from None
    return "\n\n".join(part for part in parts if part)


def context_policy(settings: EvalSettings, policy: Policy | None = None) -> ContextPolicy:
    """The episodes' ContextPolicy; a summariser other than `same` is loaded here (`make_policy`)."""
    prompt, observations = settings.prompt, settings.observations
    retrieval = prompt.retrieval
    summarize = None
    if observations.summarize_over_chars is not None:
        model: Any = policy
        if observations.summarizer != "same":
            from tidal.agent.policy import make_policy

            model = make_policy(observations.summarizer)
        if model is not None:
            summarize = summarizer(model, observations.summary_max_tokens, observations.summary_input_chars)
    return ContextPolicy(
        system=prompt.system if prompt.system is not None else DEFAULT_SYSTEM, memory=memory_text(settings),
        max_observation_chars=settings.budgets.max_observation_chars, head_fraction=observations.head_fraction,
        retrieval=DocumentIndex.load(retrieval.path) if retrieval else None,
        retrieval_k=retrieval.top_k if retrieval else 3, retrieval_chars=retrieval.max_chars if retrieval else 2000,
        summarizer=summarize, summarize_over_chars=observations.summarize_over_chars,
        overflow=tuple(settings.context.overflow))


def context_window(settings: EvalSettings, policy: Policy | None) -> int | None:
    """The window episodes get: the config's `context.context_length`, capped by the model's own."""
    own = model_context_length(policy) if policy is not None else None
    chosen = settings.context.context_length
    if chosen is None:
        return own
    return chosen if own is None else min(chosen, own)


def agent_config(settings: EvalSettings, policy: Policy | None = None) -> AgentConfig:
    """Budgets, context policy and window of the eval's episodes."""
    budgets = settings.budgets
    return AgentConfig(max_steps=budgets.max_steps, max_tokens=budgets.max_tokens,
                       max_new_tokens=budgets.max_new_tokens, wall_time_s=budgets.wall_time_s,
                       context=context_policy(settings, policy), context_window=context_window(settings, policy))
