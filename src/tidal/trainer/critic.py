"""The value model of PPO (`algorithm.advantage: gae`): the policy's backbone with a scalar head.

Differs from InstructGPT's value model only in where it starts: a copy of the *current* policy's
transformer (not of the reward model, which a verifier-scored run does not have), whose head is
zero-initialised so the first baseline is 0 for every token. It has its own AdamW optimizer and
constant learning rate (`algorithm.critic_lr`); the trainer drives its updates (`Trainer.rl_step`)
and saves it next to the policy in each checkpoint (`CRITIC_FILE`). It doubles the memory of the
weights and optimizer state, as PPO's critic does.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from tidal.errors import CheckpointError
from tidal.trainer.logprobs import autocast_context, trim_padding
from tidal.trainer.optim import adamw

CRITIC_FILE = "critic.pt"


class ValueModel(torch.nn.Module):
    """values (B, T) of right-padded token ids: values[:, t] = V(tokens before t), so that it
    lines up with the logprob of token t; 0 at position 0 and on padding."""

    def __init__(self, policy: torch.nn.Module) -> None:
        super().__init__()
        # A Hugging Face causal LM keeps its transformer (without the LM head) as `base_model`;
        # a model without one is copied whole and read through its last hidden states.
        backbone = getattr(policy, "base_model", policy)
        self.whole_model = backbone is policy
        self.backbone = copy.deepcopy(backbone)
        self.backbone.requires_grad_(True)
        width = policy.get_input_embeddings().embedding_dim  # type: ignore[operator]
        parameter = next(self.backbone.parameters())
        dtype = torch.promote_types(parameter.dtype, torch.float32)
        self.head = torch.nn.Linear(width, 1, dtype=dtype, device=parameter.device)
        torch.nn.init.zeros_(self.head.weight)
        torch.nn.init.zeros_(self.head.bias)

    def forward(self, input_ids: Tensor, attention_mask: Tensor, autocast_dtype: torch.dtype | None = None) -> Tensor:
        with autocast_context(input_ids.device, autocast_dtype):
            if self.whole_model:
                out = self.backbone(
                    input_ids=input_ids, attention_mask=attention_mask, use_cache=False, output_hidden_states=True
                )
                hidden = out.hidden_states[-1]  # (B, T, H)
            else:
                hidden = self.backbone(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state
        scores = self.head(hidden.to(self.head.weight.dtype)).squeeze(-1)  # (B, T), in fp32 or wider
        values = torch.cat([torch.zeros_like(scores[:, :1]), scores[:, :-1]], dim=1)  # (B, T)
        return torch.where(attention_mask.bool(), values, torch.zeros_like(values))


class Critic:
    """A value model, its optimizer, and the count of RL steps it has trained on (the critic
    warmup, `algorithm.critic_warmup_steps`, is counted in those)."""

    def __init__(
        self,
        policy: torch.nn.Module,
        lr: float,
        betas: tuple[float, float] = (0.9, 0.99),
        weight_decay: float = 0.0,
        device: torch.device | str = "cpu",
    ) -> None:
        self.model = ValueModel(policy).to(device)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = adamw(self.params, lr=lr, betas=betas, weight_decay=weight_decay)
        self.steps = 0

    def values(
        self, input_ids: Tensor, attention_mask: Tensor, micro_batch_size: int, autocast_dtype: torch.dtype | None = None
    ) -> Tensor:
        """The value model's values (B, T) of a batch, without gradient, `micro_batch_size` rows at a time."""
        self.model.eval()
        out = torch.zeros(input_ids.shape, dtype=self.model.head.weight.dtype, device=input_ids.device)  # (B, T)
        with torch.no_grad():
            for start in range(0, input_ids.shape[0], micro_batch_size):
                rows = slice(start, start + micro_batch_size)
                ids, attn, length = trim_padding(input_ids[rows], attention_mask[rows])
                out[rows, :length] = self.model(ids, attn, autocast_dtype)
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(), "steps": self.steps}

    def save(self, path: str | Path) -> None:
        """Write the value model, optimizer and step count to `path` (a checkpoint's temporary
        folder: the checkpoint's own rename makes it atomic)."""
        torch.save(self.state_dict(), path)

    def load(self, path: str | Path) -> None:
        """Restore what `save` wrote; a missing or unreadable file raises CheckpointError."""
        path = Path(path)
        if not path.is_file():
            raise CheckpointError(
                f"{path}: missing; this checkpoint has no value model (was it saved by a run with another "
                "algorithm.advantage than gae?)"
            )
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
            self.model.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
            self.steps = int(state["steps"])
        except Exception as exc:  # pickle, zip, key and shape errors all mean the same: it does not fit
            raise CheckpointError(f"{path}: cannot be restored into this value model ({exc})") from exc


class PolicyWithCritic:
    """What `Trainer.save` hands `save_training_state` as the model: `save_pretrained(directory)`
    saves the policy there and the critic to `directory.parent / CRITIC_FILE`, i.e. into the
    checkpoint's temporary folder before its completion marker is written. So critic.pt is
    listed (with its size) in the marker and appears with the rest in one rename, without
    changing the checkpoint module; tests/unit/trainer checks that it stays so."""

    def __init__(self, policy: torch.nn.Module, critic: Critic) -> None:
        self.policy = policy
        self.critic = critic

    def save_pretrained(self, directory: str | Path) -> None:
        self.policy.save_pretrained(directory)  # type: ignore[operator]
        self.critic.save(Path(directory).parent / CRITIC_FILE)
