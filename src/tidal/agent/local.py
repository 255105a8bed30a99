"""`LocalPolicy`: a local checkpoint (or the tiny model) through the EmbeddedEngine, token-in/token-out.

The episode is one running list of token ids, opened with `render.render_messages` of its messages
and tools (the rendering `tidal serve` uses). Each turn generates from the whole list and appends
exactly the sampled tokens (mask 1, sampler logprobs); the messages answering it
(`render.answer_messages`) are appended as an observation segment (mask 0) tokenised on its own:
what the chat template writes between an assistant turn and the next generation prompt, found by
rendering a sentinel conversation with and without them. Earlier turns are never re-tokenised, so
the trainer sees the model's tokens byte for byte; a template that rewrites earlier turns cannot
be used this way, and `LocalPolicy` says so when it starts.

Turns reach the engine through a `Batcher` (tidal.rollout.batcher), so concurrent episodes' turns
share engine steps, whatever their seeds: a seeded row samples from its own generator, so a
sampled turn with a seed gets the tokens it would get alone. A greedy turn carries no seed (it
draws nothing). docs/design/agent.md, "Policies", has the details.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any

from tidal.agent.protocol import Message, Turn, TurnTimeout
from tidal.agent.render import answer_messages, calls_offered, render_messages
from tidal.agent.toolcall import parse_tool_calls
from tidal.agent.window import shrink
from tidal.errors import ModelLoadError, PreemptedError
from tidal.types import Task

if TYPE_CHECKING:
    from tidal.rollout.batcher import Batcher, JobResult

SENTINEL = "\u2063tidal-sentinel\u2063"


class ObservationRenderer:
    """Turns the messages answering a turn into the template's text between an assistant turn and
    the next generation prompt."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        base = self._render([{"role": "user", "content": "u"}, {"role": "assistant", "content": SENTINEL}], False)
        if SENTINEL not in base:
            raise ModelLoadError("the chat template drops assistant messages; it cannot render an agent episode")
        self.base = base
        self.after_assistant = base[base.index(SENTINEL) + len(SENTINEL):]  # e.g. "<|im_end|>\n"
        eos = tokenizer.eos_token or ""
        self.eos_text = eos

    def _render(self, messages: list[Message], generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)

    def text(self, answers: list[Message], ended_with_eos: bool) -> str:
        """The observation text to append after a turn (with or without its eos token)."""
        messages = [{"role": "user", "content": "u"}, {"role": "assistant", "content": SENTINEL}]
        full = self._render(messages + answers, True)
        if not full.startswith(self.base):
            raise ModelLoadError(
                "the chat template rewrites earlier turns when a tool message follows (its rendering is not "
                "append-only), so an episode cannot be token-in/token-out; use a template that appends turns")
        bridge = self.after_assistant
        if ended_with_eos and self.eos_text and bridge.startswith(self.eos_text):
            bridge = bridge[len(self.eos_text):]
        return bridge + full[len(self.base):]


class LocalConversation:
    """One episode on the embedded engine (see the module docstring)."""

    def __init__(self, policy: LocalPolicy, messages: list[Message], tools: list[dict[str, Any]],
                 seed: int | None) -> None:
        from tidal.models import render_prompt

        self.policy = policy
        self.offered = [tool["function"]["name"] for tool in tools]
        self.messages = render_messages(messages, tools)  # what the template reads, tools included
        self.opening = len(self.messages)  # system and task layers: never rewritten (window.shrink)
        self.rewrites: list[dict[str, Any]] = []  # what the overflow strategy changed, at which turn
        self.partial = ""  # the text of a turn cut short by the deadline
        self.prompt_ids = render_prompt(policy.tokenizer, self.messages)
        self.token_ids: list[int] = list(self.prompt_ids)
        self.mask: list[int] = [0] * len(self.token_ids)  # 1 on generated tokens (the ones trained on)
        self.tool_mask: list[int] = [0] * len(self.token_ids)  # 1 on the tool results' observation tokens
        self.logprobs: list[float] = [0.0] * len(self.token_ids)  # sampler logprobs where mask == 1
        self.weight_versions: list[int] = []
        self.seed = seed
        self.turns = 0

    @property
    def context_tokens(self) -> int:
        return len(self.token_ids)

    def turn_params(self, max_new_tokens: int) -> Any:
        """The `SamplingParams` of the next turn: its seed follows from the episode's and the turn's
        number, so the eval's batched stream (eval/stream.py) samples exactly what `generate` would."""
        from tidal.rollout import SamplingParams

        policy = self.policy
        seed = None if self.seed is None else self.seed * 1_000_003 + self.turns
        if policy.temperature == 0:
            seed = None  # greedy draws nothing: a seed would mean nothing
        return SamplingParams(temperature=policy.temperature, top_p=policy.top_p,
                              max_new_tokens=max(1, max_new_tokens), stop=list(policy.stop), seed=seed)

    def generate(self, max_new_tokens: int, deadline: float | None = None) -> Turn:
        policy = self.policy
        params = self.turn_params(max_new_tokens)
        context = len(self.token_ids)
        started = time.perf_counter()
        try:
            result, first_token = policy.generate_timed(list(self.token_ids), params, deadline)
        except TurnTimeout as error:
            ids = error.token_ids
            self.partial = policy.tokenizer.decode(ids, skip_special_tokens=True) if ids else ""
            error.turn = Turn(self.partial, parse_tool_calls(self.partial), context, len(ids),
                              time.perf_counter() - started, "timeout")
            raise
        elapsed, cpu = time.perf_counter() - started, result.cpu_s  # the wait for the engine included
        completion = result.completions[0][0]
        self.turns += 1
        self.token_ids += completion.token_ids
        self.mask += [1] * len(completion.token_ids)
        self.tool_mask += [0] * len(completion.token_ids)
        self.logprobs += completion.logprobs
        self.weight_versions.append(completion.weight_version)
        self._ended_with_eos = bool(completion.token_ids) and completion.token_ids[-1] in policy.engine.eos_ids
        self.messages.append({"role": "assistant", "content": completion.text})
        return Turn(completion.text, parse_tool_calls(completion.text), context, len(completion.token_ids),
                    elapsed, completion.finish_reason, cpu_s=cpu, first_token_s=first_token)

    def observe(self, turn: Turn, results: list[str]) -> None:
        calls = len(turn.parsed.calls) if calls_offered(turn.parsed, self.offered) else 0
        answers = answer_messages(results, calls)
        text = self.policy.renderer.text(answers, getattr(self, "_ended_with_eos", False))
        ids = list(self.policy.tokenizer.encode(text, add_special_tokens=False))
        self.token_ids += ids
        self.mask += [0] * len(ids)
        self.tool_mask += [1] * len(ids)
        self.logprobs += [0.0] * len(ids)
        self.messages.extend(answers)

    def shrink(self, strategy: list[str] | tuple[str, ...]) -> str | None:
        """One step of the overflow strategy (window.shrink); the prompt is then re-rendered from the
        messages, so the episode is no longer token-in/token-out (the trace's `context_rewrites`
        says where: `token_ids` holds the rewritten context from then on, its turns' masks 0)."""
        from tidal.models import render_prompt

        done = shrink(self.messages, self.opening, strategy)
        if done is None:
            return None
        self.token_ids = render_prompt(self.policy.tokenizer, self.messages)
        self.mask = [0] * len(self.token_ids)
        self.tool_mask = [0] * len(self.token_ids)
        self.logprobs = [0.0] * len(self.token_ids)
        self.rewrites.append({"turn": self.turns, "change": done, "context_tokens": len(self.token_ids)})
        return done

    def trace(self) -> dict[str, Any]:
        trace = {"messages": self.messages, "prompt_ids": self.prompt_ids, "token_ids": self.token_ids,
                 "mask": self.mask, "tool_mask": self.tool_mask, "logprobs": self.logprobs, "weight_versions": self.weight_versions}
        if self.rewrites:
            trace["context_rewrites"] = self.rewrites
        if self.partial:
            trace["partial_turn"] = self.partial
        return trace


class LocalPolicy:
    """A causal LM behind a `RolloutEngine` (rollout/protocol.py): the embedded engine, which may
    be shared with an RL trainer (same weights), or the HTTP engine on a server; its turns go
    through `generate` and `eos_ids` only."""

    def __init__(self, engine: Any, tokenizer: Any, name: str = "local", temperature: float = 0.0,
                 top_p: float = 1.0, stop: list[str] | None = None, seed: int | None = 0,
                 max_batch: int = 32, gather_s: float = 0.005, cancel: Any = None) -> None:
        self.engine, self.tokenizer, self.name = engine, tokenizer, name
        self.cancel = cancel  # with `is_set()`: once set, each turn raises `PreemptedError` before it generates
        self.temperature, self.top_p, self.stop, self.seed = temperature, top_p, list(stop or []), seed
        self.max_batch = max_batch  # rows in the engine's running batch; 1: one turn at a time
        self.gather_s = gather_s  # how long an idle engine waits for more turns before its first step
        self.renderer = ObservationRenderer(tokenizer)
        for role in ("tool", "user"):  # fails now, not mid-eval, for a template that is not append-only
            self.renderer.text([{"role": role, "content": "probe"}], True)
        self._lock = threading.Lock()
        self._batcher: Batcher | None = None

    def generate(self, prompt: list[int], params: Any, deadline: float | None = None) -> JobResult:
        """One completion of `prompt`, generated in the engine call of whichever turns are waiting.
        At `deadline` (time.monotonic()) the job is cancelled (the engine aborts it at its next
        step) and `TurnTimeout` is raised, its `token_ids` the tokens sampled by then."""
        return self.generate_timed(prompt, params, deadline)[0]

    def generate_timed(self, prompt: list[int], params: Any,
                       deadline: float | None = None) -> tuple[JobResult, float | None]:
        """`generate`, and the seconds from submitting the turn to its first token (None: no token)."""
        from tidal.rollout.batcher import Batcher, Job

        if self.cancel is not None and self.cancel.is_set():
            raise PreemptedError(f"{self.name}: the episode was preempted before its turn")
        with self._lock:
            if self._batcher is None:  # started on first use; its worker is the engine's only caller
                self._batcher = Batcher(self.engine, self.max_batch, max_queue=1 << 16,
                                        gather_s=self.gather_s if self.max_batch > 1 else 0.0)
            batcher = self._batcher
        done = threading.Event()
        box: list[JobResult | BaseException] = []
        sampled: list[int] = []

        def finish(result: JobResult | BaseException) -> None:
            box.append(result)
            done.set()

        submitted = time.perf_counter()
        first: list[float] = []

        def on_token(prompt_index: int, sample: int, token: int) -> None:
            if not first:  # time to first token: the wait for a batch slot and the prefill
                first.append(time.perf_counter() - submitted)
            sampled.append(token)

        job = Job([prompt], 1, params, on_done=finish, on_token=on_token)
        batcher.submit(job)
        if not done.wait(None if deadline is None else max(0.0, deadline - time.monotonic())):
            job.cancelled = True  # the worker drops or aborts it; its result, if any, is ignored
            if not done.is_set():
                raise TurnTimeout(f"{self.name}: the turn was cut at the deadline after {len(sampled)} tokens",
                                  token_ids=sampled)
        if isinstance(box[0], BaseException):
            raise box[0]
        # An HTTP engine hands its tokens over after the whole request: no first-token time there.
        streams = type(self.engine).__name__ != "HttpEngine"
        return box[0], (first[0] if first and streams else None)

    def close(self) -> None:
        """Stop the engine's worker thread (a later turn starts a new one)."""
        with self._lock:
            batcher, self._batcher = self._batcher, None
        if batcher is not None:
            batcher.close()

    @classmethod
    def load(cls, path: str, device: str = "auto", **options: Any) -> LocalPolicy:
        """`tiny` or a local Hugging Face checkpoint folder (ModelLoadError says what is wrong)."""
        from tidal.config.schema import ModelConfig
        from tidal.models import load_model
        from tidal.rollout import EmbeddedEngine

        loaded = load_model(ModelConfig(path=path, device=device))  # type: ignore[arg-type]
        return cls(EmbeddedEngine(loaded.model, loaded.tokenizer), loaded.tokenizer, name=path, **options)

    def start(self, task: Task, messages: list[Message], tools: list[dict[str, Any]],
              seed: int = 0) -> LocalConversation:
        seed = None if self.seed is None else self.seed + _stable(f"{task.id}\x00{seed}")
        return LocalConversation(self, messages, tools, seed)


def _stable(text: str) -> int:
    """A small number from `text` that does not depend on PYTHONHASHSEED."""
    import hashlib

    return int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:4], "big")
