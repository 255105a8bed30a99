"""What the planner reads (trainer/plan.py): a model's shape and a step's workload. Apart from
plan.py so that the step time (trainer/step_time.py) reads them without importing the planner."""

from __future__ import annotations

import dataclasses

from tidal.trainer.memory import Dims


@dataclasses.dataclass(frozen=True)
class ModelShape:
    """What the planner reads from a model (`shape_of`), built on the meta device or loaded."""

    dims: Dims
    kv_heads: int
    head_dim: int
    parameters: int  # distinct parameters (tied ones once)
    matmul_parameters: int  # weights of the linear layers and the LM head: FLOPs per token / 2
    root_parameters: int  # the parameters outside the decoder layers (embeddings, final norm, head)
    largest_layer: int  # parameters of the largest decoder layer
    linears: tuple[tuple[str, int, int], ...]  # (name, in, out) of every linear layer but the LM head
    widest_linear: tuple[int, int] | None
    chunked_head: bool  # the trainer computes the LM head in chunks (trainer/logprobs.py)
    attention: str  # the config's _attn_implementation


@dataclasses.dataclass(frozen=True)
class Workload:
    """What one step processes, from the config and its tasks (pipeline/planning.py)."""

    prompt_tokens: int  # the longest prompt, rendered with the chat template
    sequence_tokens: int  # a training row: the longest prompt + max_new_tokens (agent tasks: agent_max_tokens)
    generation_rows: int  # rows of one RL engine batch (module docstring, the KV cache)
    eval_rows: int = 0  # rows of one evaluation engine batch
    warm_start_tokens: int = 0  # the warm start's longest prompt + reference; 0 when it is off
    sandboxed_share: float = 0.0  # of the train tasks drawn (by domain weight), those scored in a sandbox
    mean_prompt_tokens: int = 0  # the step time's expected prompt and completion (0: the longest);
    expected_completion_tokens: int = 0  # the completion: the train tasks' references, + eos
