"""What a model's tokens cost: the eval config's prices, then a built-in table of common API models,
else unknown — never a silent 0.

Resolution, first match wins:
1. `prices` in the eval config (and `--price-in`/`--price-out`, which the CLI adds there under the
   full model spec), by the longest key that prefixes the model spec (settings.py);
2. the built-in table below, by the API model name: the part of `openai:<name>@<url>` between the
   colon and the `@`, after any router prefix (`anthropic/claude-...` -> `claude-...`). A name
   matches a key exactly or as the key plus a date or `-latest` suffix (`gpt-4o-2024-08-06`), never
   as a mere prefix: `o3-pro` is not `o3`;
3. unknown: the record's `cost` is None and the report says "unknown". A local checkpoint path has
   no list price; give it `cpu_hour` in the config (or `--price-in`/`--price-out` per token).

The table holds list prices in USD per million tokens (input, output) for standard, non-cached,
non-batch requests at the smallest context tier. Each entry names its source page and the date its
price was taken; providers change prices, so a figure that matters belongs in the config.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tidal.eval.settings import EvalSettings, Price

# name -> (input, output) USD per 1M tokens. Source and the date each figure was read, per entry.
BUILTIN: dict[str, tuple[float, float]] = {
    "gpt-4o": (2.50, 10.00),  # openai.com/api/pricing, 2024-10
    "gpt-4o-mini": (0.15, 0.60),  # openai.com/api/pricing, 2024-10
    "gpt-4.1": (2.00, 8.00),  # openai.com/api/pricing, 2025-04
    "gpt-4.1-mini": (0.40, 1.60),  # openai.com/api/pricing, 2025-04
    "gpt-4.1-nano": (0.10, 0.40),  # openai.com/api/pricing, 2025-04
    "o3-mini": (1.10, 4.40),  # openai.com/api/pricing, 2025-02
    "o4-mini": (1.10, 4.40),  # openai.com/api/pricing, 2025-04
    "o3": (2.00, 8.00),  # openai.com/api/pricing, 2025-06 (after the June price cut)
    "gpt-3.5-turbo": (0.50, 1.50),  # openai.com/api/pricing, 2024-01
    "claude-3-5-haiku": (0.80, 4.00),  # anthropic.com/pricing, 2024-11
    "claude-3-5-sonnet": (3.00, 15.00),  # anthropic.com/pricing, 2024-10
    "claude-3-7-sonnet": (3.00, 15.00),  # anthropic.com/pricing, 2025-02
    "claude-sonnet-4": (3.00, 15.00),  # anthropic.com/pricing, 2025-05
    "claude-opus-4": (15.00, 75.00),  # anthropic.com/pricing, 2025-05
    "gemini-1.5-flash": (0.075, 0.30),  # ai.google.dev/pricing, 2024-10 (prompts up to 128k)
    "gemini-2.0-flash": (0.10, 0.40),  # ai.google.dev/pricing, 2025-02
    "gemini-2.5-flash": (0.30, 2.50),  # ai.google.dev/pricing, 2025-06
    "gemini-2.5-pro": (1.25, 10.00),  # ai.google.dev/pricing, 2025-06 (prompts up to 200k)
    "deepseek-chat": (0.27, 1.10),  # api-docs.deepseek.com/quick_start/pricing, 2025-02 (standard hours)
    "deepseek-reasoner": (0.55, 2.19),  # api-docs.deepseek.com/quick_start/pricing, 2025-02 (standard hours)
    "mistral-large": (2.00, 6.00),  # mistral.ai/pricing, 2024-11
}
_SUFFIX = re.compile(r"-(\d{4}-\d{2}-\d{2}|\d{8}|\d{4}|latest)$")


@dataclass(frozen=True)
class ResolvedPrice:
    """A price and where it came from (`config: <key>` or `built-in: <name>`)."""

    price: Price
    source: str


def api_name(model: str) -> str | None:
    """The API model name of an `openai:<name>@<url>` spec, without a router prefix; None otherwise."""
    if not model.startswith("openai:"):
        return None
    name = model[len("openai:"):].split("@", 1)[0]
    return name.rsplit("/", 1)[-1] or None


def builtin_price(name: str) -> tuple[str, tuple[float, float]] | None:
    """The built-in entry for an API model name: exact, or the key plus a date / `-latest` suffix."""
    if name in BUILTIN:
        return name, BUILTIN[name]
    base = _SUFFIX.sub("", name)
    return (base, BUILTIN[base]) if base != name and base in BUILTIN else None


def resolve_price(model: str, settings: EvalSettings) -> ResolvedPrice | None:
    """The price of `model` (see the module docstring), or None when unknown."""
    keys = [key for key in settings.prices if model.startswith(key)]
    if keys:
        key = max(keys, key=len)
        return ResolvedPrice(settings.prices[key], f"config: {key}")
    name = api_name(model)
    found = builtin_price(name) if name else None
    if found is None:
        return None
    key, (input_price, output_price) = found
    return ResolvedPrice(Price(input_per_mtok=input_price, output_per_mtok=output_price), f"built-in: {key}")


def cost_of(resolved: ResolvedPrice | None, tokens_in: float, tokens_out: float, cpu_s: float) -> float | None:
    """The cost of one episode or answer; None when the price is unknown."""
    if resolved is None:
        return None
    price = resolved.price
    return ((tokens_in * price.input_per_mtok + tokens_out * price.output_per_mtok) / 1e6
            + cpu_s / 3600 * price.cpu_hour)


def with_flag_prices(settings: EvalSettings, model: str, price_in: float | None,
                     price_out: float | None) -> EvalSettings:
    """`--price-in`/`--price-out` (per 1M tokens) as a config price under the full model spec, which
    outranks every shorter key. Either flag alone leaves the other side at 0."""
    if price_in is None and price_out is None:
        return settings
    price = Price(input_per_mtok=price_in or 0.0, output_per_mtok=price_out or 0.0)
    return settings.model_copy(update={"prices": {**settings.prices, model: price}})
