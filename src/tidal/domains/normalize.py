"""Per-domain reward normalisation for multi-domain training. Normalisers are picked by name from `NORMALISERS`.

Domains score on different scales: unit tests in [0, 1], a reward model in [-5, 5], a style
score. Each sample's reward goes through its domain's normaliser before advantages are computed,
so that no domain takes over the policy gradient just because its rewards are larger. One
`RewardNormaliser` holds the state of every domain. Its `state_dict` is plain JSON, so it can go
into a checkpoint.

Rules that every normaliser follows:
- The statistics are updated with the batch first. The batch is then normalised with the updated
  statistics. A domain's first batch is therefore normalised against itself and is never divided
  by a zero std.
- A non-finite reward (NaN or ±inf, meaning an unscored sample) is left out of every statistic
  and comes back as NaN. The caller drops it with `math.isnan`, like any invalid sample.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, field_validator

from tidal.errors import CheckpointError, UnknownNameError

NAN = float("nan")
STATE_VERSION = 1


class NormaliserConfig(BaseModel):
    """How one domain's rewards are normalised. Each field applies only to the kinds named in its description."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    kind: Literal["none", "running", "per_reward", "rank"] = Field(
        "none",
        description="none = identity; running = (r - mean) / (std + eps) over the domain's rewards so far; "
        "per_reward = weighted sum of sub-rewards, each normalised like `running`; rank = percentile "
        "among the last `window` rewards, in (-0.5, 0.5)",
    )
    momentum: float | None = Field(
        None,
        gt=0,
        lt=1,
        description="running, per_reward: unset = exact mean/std of every reward seen (Welford); set = "
        "exponential moving average, the share of the old statistics kept per reward (0.999 = slow)",
    )
    eps: float = Field(1e-6, gt=0, le=1, description="running, per_reward: added to the std before dividing")
    clip: float | None = Field(
        None, gt=0, description="running, per_reward: clip each normalised value to [-clip, clip] (unset = no clip)"
    )
    min_count: int = Field(
        8,
        ge=1,
        le=1 << 30,
        description="running, per_reward: while fewer rewards than this have been seen (this batch "
        "included), only subtract the mean and do not divide by the std, which is still too noisy",
    )
    window: int = Field(2048, ge=1, le=1 << 24, description="rank: how many recent rewards the percentile uses")
    component_weights: dict[str, float] = Field(
        default_factory=dict,
        description="per_reward: sub-reward name -> weight in the sum. Weights passed to `normalise` "
        "replace these",
    )

    @field_validator("component_weights")
    @classmethod
    def _finite_weights(cls, weights: dict[str, float]) -> dict[str, float]:
        for name, weight in weights.items():
            if not math.isfinite(weight):
                raise ValueError(f"component weight {name!r} is {weight}; give a finite number")
        return weights


@dataclass
class RunningStats:
    """Mean and population std of a stream of rewards. Uses Welford's algorithm, or an EMA when `momentum` is set.

    The EMA version is updated once per reward, not once per batch. It therefore forgets at the
    same rate whatever batch sizes a domain happens to be sampled in. Its first reward sets the
    mean directly, so the mean does not start biased towards 0.
    """

    momentum: float | None = None
    count: int = 0
    mean: float = 0.0
    var: float = 0.0  # population variance (divide by n), as in the GRPO advantage

    def update(self, value: float) -> None:
        """Add one finite reward."""
        if self.momentum is None:
            self.count += 1
            delta = value - self.mean
            self.mean += delta / self.count
            # Welford with var = m2 / n: m2' = m2 + delta * (x - mean').
            self.var += (delta * (value - self.mean) - self.var) / self.count
            return
        if self.count == 0:
            self.mean, self.var = value, 0.0
        else:
            rate = 1.0 - self.momentum
            delta = value - self.mean
            self.mean += rate * delta
            self.var = (1.0 - rate) * (self.var + rate * delta * delta)
        self.count += 1

    @property
    def std(self) -> float:
        return math.sqrt(max(self.var, 0.0))

    def scale(self, value: float, config: NormaliserConfig) -> float:
        """Normalise one finite reward with the current statistics (only centre it below `min_count`), then clip."""
        centred = value - self.mean
        out = centred if self.count < config.min_count else centred / (self.std + config.eps)
        if config.clip is not None:
            out = min(max(out, -config.clip), config.clip)
        return out

    def to_json(self) -> dict[str, float]:
        return {"count": self.count, "mean": self.mean, "var": self.var}

    @classmethod
    def from_json(cls, state: Mapping[str, Any], momentum: float | None) -> RunningStats:
        return cls(momentum=momentum, count=int(state["count"]), mean=float(state["mean"]), var=float(state["var"]))


class DomainNormaliser(Protocol):
    """The state and the rule of one domain's normaliser."""

    def __init__(self, domain: str, config: NormaliserConfig) -> None: ...

    def normalise(
        self,
        rewards: list[float],
        components: Sequence[Mapping[str, float]] | None,
        weights: Mapping[str, float] | None,
    ) -> list[float]: ...

    def stats(self) -> dict[str, float]: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None: ...


class IdentityNormaliser:
    """`none`: returns the reward unchanged. Non-finite rewards still come back as NaN."""

    def __init__(self, domain: str, config: NormaliserConfig) -> None:
        self.domain = domain

    def normalise(
        self,
        rewards: list[float],
        components: Sequence[Mapping[str, float]] | None,
        weights: Mapping[str, float] | None,
    ) -> list[float]:
        return [r if math.isfinite(r) else NAN for r in rewards]

    def stats(self) -> dict[str, float]:
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        pass


class RunningNormaliser:
    """`running`: (r - mean) / (std + eps), using the domain's running statistics after this batch is added."""

    def __init__(self, domain: str, config: NormaliserConfig) -> None:
        self.domain, self.config = domain, config
        self.running = RunningStats(momentum=config.momentum)

    def normalise(
        self,
        rewards: list[float],
        components: Sequence[Mapping[str, float]] | None,
        weights: Mapping[str, float] | None,
    ) -> list[float]:
        for r in rewards:
            if math.isfinite(r):
                self.running.update(r)
        return [self.running.scale(r, self.config) if math.isfinite(r) else NAN for r in rewards]

    def stats(self) -> dict[str, float]:
        prefix = f"norm/{self.domain}"
        return {f"{prefix}/mean": self.running.mean, f"{prefix}/std": self.running.std, f"{prefix}/count": self.running.count}

    def state_dict(self) -> dict[str, Any]:
        return self.running.to_json()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.running = RunningStats.from_json(state, self.config.momentum)


class PerRewardNormaliser:
    """`per_reward`: sum over k of w_k * z_k, where z_k is sub-reward k normalised by its own running statistics.

    This is a weighted reward sum like in RLHF reward mixing, but each term is normalised first.
    A style score on [0, 100] then cannot drown out a test pass rate on [0, 1]. The weights are
    used as given: they are not rescaled to sum to 1.

    A sample whose reward or any weighted component is non-finite gives NaN and updates no
    statistic. Components that have no weight are ignored; verifiers may report them for
    diagnostics. A weighted component that a sample lacks is a ValueError. It is not silently
    treated as 0, because a 0 would move that component's mean.
    """

    def __init__(self, domain: str, config: NormaliserConfig) -> None:
        self.domain, self.config = domain, config
        self.running: dict[str, RunningStats] = {}

    def _weights(self, weights: Mapping[str, float] | None) -> dict[str, float]:
        chosen = dict(weights) if weights is not None else dict(self.config.component_weights)
        if not chosen:
            raise ValueError(
                f"domain {self.domain!r} uses the per_reward normaliser but has no component weights; "
                "set `component_weights` in its normaliser config or pass `weights`"
            )
        for name, weight in chosen.items():
            if not math.isfinite(weight):
                raise ValueError(f"domain {self.domain!r}: weight of component {name!r} is {weight}; give a finite number")
        return chosen

    def normalise(
        self,
        rewards: list[float],
        components: Sequence[Mapping[str, float]] | None,
        weights: Mapping[str, float] | None,
    ) -> list[float]:
        if components is None:
            raise ValueError(f"domain {self.domain!r} uses the per_reward normaliser; pass each sample's `components`")
        if len(components) != len(rewards):
            raise ValueError(
                f"domain {self.domain!r}: {len(rewards)} rewards but {len(components)} component mappings; "
                "give one mapping per sample"
            )
        chosen = self._weights(weights)
        for index, sample in enumerate(components):
            for name in chosen:
                if name not in sample:
                    raise ValueError(
                        f"domain {self.domain!r}, sample {index}: component {name!r} is missing "
                        f"(it has {sorted(sample)}); every sample must report every weighted component"
                    )
        valid = [
            math.isfinite(r) and all(math.isfinite(sample[name]) for name in chosen)
            for r, sample in zip(rewards, components)
        ]
        for name in chosen:
            stats = self.running.setdefault(name, RunningStats(momentum=self.config.momentum))
            for ok, sample in zip(valid, components):
                if ok:
                    stats.update(sample[name])
        out: list[float] = []
        for ok, sample in zip(valid, components):
            if not ok:
                out.append(NAN)
                continue
            out.append(sum(w * self.running[name].scale(sample[name], self.config) for name, w in chosen.items()))
        return out

    def stats(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for name, stats in sorted(self.running.items()):
            prefix = f"norm/{self.domain}/{name}"
            out.update({f"{prefix}/mean": stats.mean, f"{prefix}/std": stats.std, f"{prefix}/count": stats.count})
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"components": {name: stats.to_json() for name, stats in self.running.items()}}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.running = {
            name: RunningStats.from_json(stats, self.config.momentum) for name, stats in state["components"].items()
        }


class RankNormaliser:
    """`rank`: the reward's mid-rank percentile among the last `window` finite rewards, minus 0.5.

    The percentile of r is (number below r + half the number equal to r) / window size. The batch
    is added to the window first, so a reward always counts itself and the result lies strictly
    inside (-0.5, 0.5). A batch of identical rewards gives 0 for every sample. Centring on 0
    means a domain's typical sample gets zero advantage. The output depends only on order, so
    outliers and reward scale have no effect.
    """

    def __init__(self, domain: str, config: NormaliserConfig) -> None:
        self.domain = domain
        self.recent: deque[float] = deque(maxlen=config.window)

    def normalise(
        self,
        rewards: list[float],
        components: Sequence[Mapping[str, float]] | None,
        weights: Mapping[str, float] | None,
    ) -> list[float]:
        self.recent.extend(r for r in rewards if math.isfinite(r))
        ordered = sorted(self.recent)
        size = len(ordered)
        out: list[float] = []
        for r in rewards:
            if not math.isfinite(r):
                out.append(NAN)
                continue
            below = bisect.bisect_left(ordered, r)
            equal = bisect.bisect_right(ordered, r) - below
            out.append((below + 0.5 * equal) / size - 0.5)
        return out

    def stats(self) -> dict[str, float]:
        return {f"norm/{self.domain}/window": len(self.recent)}

    def state_dict(self) -> dict[str, Any]:
        return {"recent": list(self.recent)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.recent.clear()
        self.recent.extend(float(r) for r in state["recent"])


NORMALISERS: dict[str, type[DomainNormaliser]] = {
    "none": IdentityNormaliser,
    "running": RunningNormaliser,
    "per_reward": PerRewardNormaliser,
    "rank": RankNormaliser,
}


class RewardNormaliser:
    """Normalises each domain's rewards with the normaliser named in its config, and owns every domain's state."""

    def __init__(self, configs: Mapping[str, NormaliserConfig]) -> None:
        self.configs = dict(configs)
        self.domains: dict[str, DomainNormaliser] = {
            domain: NORMALISERS[config.kind](domain, config) for domain, config in self.configs.items()
        }

    def normalise(
        self,
        domain: str,
        rewards: Sequence[float],
        components: Sequence[Mapping[str, float]] | None = None,
        weights: Mapping[str, float] | None = None,
    ) -> list[float]:
        """Update `domain`'s statistics with this batch, then return the batch normalised, one value per reward.

        `components` (per_reward only) holds one mapping of sub-reward name to value per sample.
        `weights` replaces the config's `component_weights` for this call. Non-finite rewards come
        back as NaN.
        """
        if domain not in self.domains:
            raise UnknownNameError("domain", domain, list(self.domains))
        return self.domains[domain].normalise([float(r) for r in rewards], components, weights)

    def stats(self) -> dict[str, float]:
        """Flat metrics for logging, e.g. `norm/code/mean`, `norm/code/std`, `norm/chat/window`."""
        out: dict[str, float] = {}
        for normaliser in self.domains.values():
            out.update(normaliser.stats())
        return out

    def state_dict(self) -> dict[str, Any]:
        """Every domain's state as plain JSON-serialisable data (lists, dicts, numbers, strings)."""
        return {
            "version": STATE_VERSION,
            "domains": {
                domain: {"kind": self.configs[domain].kind, "state": normaliser.state_dict()}
                for domain, normaliser in self.domains.items()
            },
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore from `state_dict()` output. Raises CheckpointError if the domains or their kinds differ from the config."""
        if state.get("version") != STATE_VERSION:
            raise CheckpointError(
                f"reward normaliser state has version {state.get('version')!r}, expected {STATE_VERSION}"
            )
        saved = state["domains"]
        if set(saved) != set(self.domains):
            raise CheckpointError(
                f"reward normaliser state covers domains {sorted(saved)} but the config has {sorted(self.domains)}; "
                "resume with the same domains, or start the normaliser afresh"
            )
        for domain, entry in saved.items():
            kind = self.configs[domain].kind
            if entry["kind"] != kind:
                raise CheckpointError(
                    f"reward normaliser state of domain {domain!r} is of kind {entry['kind']!r} but the config "
                    f"says {kind!r}; resume with the same normaliser kind"
                )
        for domain, entry in saved.items():
            self.domains[domain].load_state_dict(entry["state"])
