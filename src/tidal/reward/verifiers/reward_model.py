"""`reward_model`: a local Hugging Face model scores the answer, in batches.

Two kinds (`kind`, or `auto` from the folder's `architectures`):
- `classifier`: an `AutoModelForSequenceClassification` (a reward model's score head). One label:
  the reward is sigmoid(logit); several: the softmax probability of label `label` (default the last).
- `rubric`: a causal LM is asked whether the answer meets `rubric`; the reward is
  P(yes) / (P(yes) + P(no)) of its next token (the first token of `yes` / `no`, with and without
  a leading space, summed; a first token both share is left out).

A model is loaded once per process and device (`load`, cached and locked), so every scoring
thread and every step share it; `device` picks it (auto: the first GPU, else the CPU). The
batch form scores a task's answers `batch_size` at a time, right-padded, reading each one's
last real token, so a batch scores exactly what one-by-one scoring does. The chat template's
special tokens are removed from the answer first, so an answer cannot close its own turn.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from tidal.gate.judge_hack import JUDGE_HACK, MODEL_JUDGED, judge_hack_reasons
from tidal.reward.base import ScoringContext, check_answer, task_problem, verifier
from tidal.reward.model_args import (
    ModelArgsError,
    RewardModelArgs,
    parse_reward_model_args,
)
from tidal.types import Outcome, Score, Task

RUBRIC_PROMPT = ("Rubric: {rubric}\n\nQuestion: {prompt}\n\nAnswer: {answer}\n\n"
                 "Does the answer meet the rubric? Reply yes or no.")


@dataclass
class LoadedScorer:
    model: Any
    tokenizer: Any
    kind: str  # classifier | rubric
    device: Any
    yes_ids: list[int]
    no_ids: list[int]


_LOADED: dict[tuple[str, str, str], LoadedScorer] = {}
_LOAD_LOCK = threading.Lock()


class RewardModelError(Exception):
    """A reward model folder that cannot be loaded as asked."""


def _device(name: str) -> Any:
    import torch

    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise RewardModelError(f"device {name!r}: no CUDA device is visible; use auto or cpu")
    return device


def _first_ids(tokenizer: Any, word: str) -> list[int]:
    ids = {tokenizer.encode(form, add_special_tokens=False)[0] for form in (word, " " + word) if
           tokenizer.encode(form, add_special_tokens=False)}
    return sorted(ids)


def load(args: RewardModelArgs) -> LoadedScorer:
    """The model of `args.path` on `args.device`, loaded on first use and shared by the process."""
    key = (args.path, args.device, args.kind)
    with _LOAD_LOCK:
        if key in _LOADED:
            return _LOADED[key]
        from transformers import (
            AutoConfig,
            AutoModelForCausalLM,
            AutoModelForSequenceClassification,
            AutoTokenizer,
        )

        device = _device(args.device)
        try:
            config = AutoConfig.from_pretrained(args.path, local_files_only=True)
            kind = args.kind
            if kind == "auto":
                names = " ".join(getattr(config, "architectures", None) or [])
                kind = "classifier" if "SequenceClassification" in names else "rubric"
            tokenizer = AutoTokenizer.from_pretrained(args.path, local_files_only=True)
            loader = AutoModelForSequenceClassification if kind == "classifier" else AutoModelForCausalLM
            model = loader.from_pretrained(args.path, local_files_only=True).to(device).eval()
        except (OSError, ValueError, KeyError, RuntimeError) as error:
            raise RewardModelError(f"cannot load {args.path} as a {args.kind} reward model: {error}") from None
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        if getattr(model.config, "pad_token_id", None) is None:
            model.config.pad_token_id = tokenizer.pad_token_id
        yes_ids, no_ids = (_first_ids(tokenizer, args.yes), _first_ids(tokenizer, args.no)) if kind == "rubric" else ([], [])
        shared = set(yes_ids) & set(no_ids)  # a byte tokenizer starts " yes" and " no" alike
        yes_ids, no_ids = [i for i in yes_ids if i not in shared], [i for i in no_ids if i not in shared]
        if kind == "rubric" and (not yes_ids or not no_ids):
            raise RewardModelError(f"`yes` {args.yes!r} and `no` {args.no!r} must start with different tokens")
        _LOADED[key] = LoadedScorer(model, tokenizer, kind, device, yes_ids, no_ids)
        return _LOADED[key]


def _clean(tokenizer: Any, text: str) -> str:
    for token in getattr(tokenizer, "all_special_tokens", []):
        if token:
            text = text.replace(token, "")
    return text


def _input_text(loaded: LoadedScorer, args: RewardModelArgs, task: Task, answer: str) -> str:
    from tidal.reward.verifiers.judge import prompt_text

    tokenizer = loaded.tokenizer
    prompt, answer = _clean(tokenizer, prompt_text(task)), _clean(tokenizer, answer)
    if loaded.kind == "rubric":
        messages = [{"role": "user", "content": RUBRIC_PROMPT.format(rubric=args.rubric, prompt=prompt, answer=answer)}]
        generation = True
    else:
        messages = [{"role": "user", "content": prompt}, {"role": "assistant", "content": answer}]
        generation = False
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation)
    return "\n\n".join(m["content"] for m in messages) + ("\n" if generation else "")


def model_rewards(loaded: LoadedScorer, texts: list[str], args: RewardModelArgs) -> list[float]:
    """The reward of each rendered input text, `args.batch_size` at a time."""
    import torch

    tokenizer, rewards = loaded.tokenizer, []
    for start in range(0, len(texts), args.batch_size):
        rows = [tokenizer.encode(t, add_special_tokens=False)[-args.max_length:] for t in texts[start:start + args.batch_size]]
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, row in enumerate(rows):
            ids[i, :len(row)] = torch.tensor(row)
            mask[i, :len(row)] = 1
        last = torch.tensor([len(r) - 1 for r in rows])
        with torch.no_grad():
            ids, mask = ids.to(loaded.device), mask.to(loaded.device)
            if loaded.kind == "classifier":
                logits = _classifier_logits(loaded.model, ids, mask, last)
                if logits.shape[-1] == 1:
                    values = torch.sigmoid(logits[:, 0])
                else:
                    values = torch.softmax(logits, dim=-1)[:, args.label]
            else:
                logits = loaded.model(input_ids=ids, attention_mask=mask).logits
                probs = torch.softmax(logits[torch.arange(len(rows)), last.to(logits.device)].float(), dim=-1)
                yes = probs[:, loaded.yes_ids].sum(-1)
                no = probs[:, loaded.no_ids].sum(-1)
                values = yes / (yes + no).clamp_min(1e-12)
        rewards.extend(float(v) for v in values.cpu())
    return rewards


def _classifier_logits(model: Any, ids: Any, mask: Any, last: Any) -> Any:
    """Logits at each row's last real token: a decoder reward model's `score` head applied there
    (what its own forward does, without relying on the pad id); other heads through `forward`."""
    import torch

    if hasattr(model, "score") and hasattr(model, model.base_model_prefix):
        hidden = getattr(model, model.base_model_prefix)(input_ids=ids, attention_mask=mask).last_hidden_state
        return model.score(hidden[torch.arange(len(last)), last.to(hidden.device)]).float()
    return model(input_ids=ids, attention_mask=mask).logits.float()


def score_batch(task: Task, answers: list[str], ctx: ScoringContext) -> list[Score]:
    """Scores of `answers` to `task`, one model call per `batch_size` answers."""
    scores: list[Score | None] = [check_answer(answer) for answer in answers]
    try:
        args = parse_reward_model_args(task.verifier.args)
    except ModelArgsError as error:
        return [s if s is not None else task_problem(task, "; ".join(error.problems)) for s in scores]
    for index, answer in enumerate(answers):
        hacks = judge_hack_reasons(answer) if scores[index] is None else []
        if hacks:
            scores[index] = Score(0.0, Outcome.FAILED, {"reward_model": 0.0},
                                  f"the answer addresses the grader ({', '.join(hacks)})", {JUDGE_HACK: hacks, MODEL_JUDGED: True})
    todo = [i for i, s in enumerate(scores) if s is None]
    if todo:
        try:
            loaded = load(args)
            if loaded.kind == "rubric" and not args.rubric:
                raise RewardModelError(f"{args.path} is a causal LM: give a `rubric` to score against")
            values = model_rewards(loaded, [_input_text(loaded, args, task, answers[i]) for i in todo], args)
        except RewardModelError as error:
            return [s if s is not None else task_problem(task, str(error)) for s in scores]
        for index, value in zip(todo, values):
            outcome = Outcome.PASSED if value >= args.pass_at else Outcome.FAILED
            scores[index] = Score(value, outcome, {"reward_model": value}, f"reward model {loaded.kind}: {value:.4f}",
                                  {MODEL_JUDGED: True})
    return scores  # type: ignore[return-value]


@verifier("reward_model", batch=score_batch)
def reward_model(task: Task, answer: str, ctx: ScoringContext) -> Score:
    """A local Hugging Face reward model (`path`: a score head, or a causal LM with a `rubric`)
    scores the answer in [0, 1], batched; loaded once per process on `device`."""
    return score_batch(task, [answer], ctx)[0]
