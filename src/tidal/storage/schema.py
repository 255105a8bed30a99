"""The trajectory store's Arrow schemas (version 2) and the conversions to and from its rows.

Two kinds of segment share one store (docs/design/store.md):

- `trajectories`: one row per trajectory, flat columns so DuckDB can filter and aggregate without
  unpacking JSON; lists for token ids, logprobs and the per-token masks, maps for reward components
  and timings. The verifier's free-form `info` is the one JSON text column, since its keys differ
  per verifier.
- `ledger`: the exactly-once ledger, one row per trained id (`event = 'trained'`) or one row per
  resume (`event = 'rollback'`, `id` null), appended, never rewritten.

Every row carries the `attempt` (one per opening of the store for writing) and the `sequence` of its
segment within that attempt, so a reader can order segments and take the latest version of an id.

Versioning: the schema version is written in each segment's footer (`tidal.schema_version`). A
reader upgrades older versions through `UPGRADES` and refuses newer ones. Version 2 added
`loss_mask` and `tool_mask`; version-1 rows read them as null (not recorded).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable
from typing import Any

import pyarrow as pa

from tidal.storage.run import dumps
from tidal.types import Episode

SCHEMA_VERSION = 2
TRAJECTORIES = "trajectories"
LEDGER = "ledger"

_MESSAGE = pa.struct([("role", pa.string()), ("content", pa.string())])

# Columns the store fills in itself when it writes a segment; callers never set them.
STORE_COLUMNS = ("run", "attempt", "sequence", "written_at")

TRAJECTORY_SCHEMA = pa.schema(
    [
        pa.field("id", pa.string(), nullable=False),  # stable: <run>/step-<step>/g<group>/s<sample>
        pa.field("run", pa.string(), nullable=False),
        pa.field("step", pa.int64(), nullable=False),  # the RL step (sampling step) that made it
        pa.field("attempt", pa.int32(), nullable=False),
        pa.field("sequence", pa.int64(), nullable=False),
        pa.field("task_id", pa.string(), nullable=False),
        pa.field("domain", pa.string(), nullable=False),
        pa.field("group_id", pa.string(), nullable=False),
        pa.field("prompt_messages", pa.list_(_MESSAGE)),  # the chat prompt the policy saw
        pa.field("prompt_ids", pa.list_(pa.int32())),  # (P,)
        pa.field("token_ids", pa.list_(pa.int32())),  # (T,) generated tokens
        pa.field("logprobs", pa.list_(pa.float64())),  # (T,) sampler logprobs, kept exactly
        # (T,) 1 on the tokens the model generated, which are the ones trained; 0 on the rest (a
        # multi-turn episode's tool results, a context rewritten by its overflow strategy). Null
        # only in rows of schema version 1, which did not record it.
        pa.field("loss_mask", pa.list_(pa.int8())),
        # (T,) 1 on the tokens of tool results (each observation appended after a model turn, the
        # chat template's framing of it included); all 0 in single-turn rows. Null in version 1.
        pa.field("tool_mask", pa.list_(pa.int8())),
        pa.field("text", pa.string()),
        pa.field("finish_reason", pa.string()),
        pa.field("weight_version", pa.int64(), nullable=False),
        pa.field("reward", pa.float64()),  # null when not scored
        pa.field("outcome", pa.string()),  # Outcome value, null when not scored
        pa.field("reward_components", pa.map_(pa.string(), pa.float64())),
        pa.field("score_detail", pa.string()),
        pa.field("score_info", pa.string()),  # JSON text: verifier-specific extras
        pa.field("keep", pa.bool_(), nullable=False),  # the quality gate's decision
        pa.field("drop_reason", pa.string()),
        pa.field("advantage", pa.float64()),
        pa.field("timings", pa.map_(pa.string(), pa.float64())),  # seconds
        pa.field("written_at", pa.timestamp("us", tz="UTC"), nullable=False),
    ]
)

LEDGER_SCHEMA = pa.schema(
    [
        pa.field("event", pa.string(), nullable=False),  # 'trained' | 'rollback'
        pa.field("id", pa.string()),  # the trained trajectory; null on 'rollback'
        pa.field("step", pa.int64(), nullable=False),  # trainer update that used it / resumed-from step
        pa.field("run", pa.string(), nullable=False),
        pa.field("attempt", pa.int32(), nullable=False),
        pa.field("sequence", pa.int64(), nullable=False),
        pa.field("written_at", pa.timestamp("us", tz="UTC"), nullable=False),
    ]
)

SCHEMAS = {TRAJECTORIES: TRAJECTORY_SCHEMA, LEDGER: LEDGER_SCHEMA}



def _add_masks(table: pa.Table) -> pa.Table:
    """Version 1 -> 2: the mask columns, null (version 1 did not record them)."""
    if "token_ids" not in table.column_names:
        return table  # a ledger segment: unchanged from version 1
    for name in ("loss_mask", "tool_mask"):
        table = table.append_column(TRAJECTORY_SCHEMA.field(name), pa.nulls(table.num_rows, pa.list_(pa.int8())))
    return table


# schema version -> function turning a table of that version into one of the next version.
UPGRADES: dict[int, Callable[[pa.Table], pa.Table]] = {1: _add_masks}


def upgrade(table: pa.Table, version: int, kind: str) -> pa.Table:
    """`table` (written with schema `version`) in the current schema; ValueError if it cannot be."""
    if version > SCHEMA_VERSION:
        raise ValueError(f"schema version {version} is newer than this tidal's {SCHEMA_VERSION}; upgrade tidal")
    while version < SCHEMA_VERSION:
        if version not in UPGRADES:
            raise ValueError(f"no upgrade from schema version {version}")
        table = UPGRADES[version](table)
        version += 1
    return table.select(SCHEMAS[kind].names)


def episode_row(
    episode: Episode,
    step: int,
    messages: list[dict[str, str]] | None = None,
    timings: dict[str, float] | None = None,
) -> dict[str, Any]:
    """The store row of one episode sampled at RL step `step`.

    `messages` is the task's chat prompt (the episode only holds its token ids); `timings` are
    step-level timings (e.g. the batch's `generate_s`), merged under the episode's own.
    """
    completion, score = episode.completion, episode.score
    return {
        "id": episode.id,
        "step": step,
        "task_id": episode.task_id,
        "domain": episode.domain,
        "group_id": episode.group_id,
        "prompt_messages": [{"role": m["role"], "content": m["content"]} for m in messages or []],
        "prompt_ids": list(completion.prompt_ids),
        "token_ids": list(completion.token_ids),
        "logprobs": [float(x) for x in completion.logprobs],
        "loss_mask": _mask(episode, "loss_mask", 1),
        "tool_mask": _mask(episode, "tool_mask", 0),
        "text": completion.text,
        "finish_reason": completion.finish_reason,
        "weight_version": completion.weight_version,
        "reward": None if score is None else float(score.value),
        "outcome": None if score is None else score.outcome.value,
        "reward_components": _components(episode),
        "score_detail": "" if score is None else score.detail,
        "score_info": "{}" if score is None else dumps(score.info),
        "keep": bool(episode.keep),
        "drop_reason": episode.drop_reason,
        "advantage": float(episode.advantage),
        "timings": {**(timings or {}), **{k: float(v) for k, v in episode.timings.items()}},
    }


def _mask(episode: Episode, name: str, default: int) -> list[int]:
    """The completion's per-token mask `name` as stored: written out in full even where the
    completion leaves it None (every token `default`), so a reader needs no convention."""
    mask, length = getattr(episode.completion, name), len(episode.completion.token_ids)
    if mask is None:
        return [default] * length
    if len(mask) != length:
        raise ValueError(f"episode {episode.id}: its {name} has {len(mask)} entries for {length} tokens")
    return [int(bool(m)) for m in mask]


def _components(episode: Episode) -> dict[str, float]:
    """The score's components, plus `train_reward` when the loop trained on another reward than
    the score's value (a composed or normalised one)."""
    if episode.score is None:
        return {}
    components = {k: float(v) for k, v in episode.score.components.items()}
    if episode.reward is not None and math.isfinite(episode.reward):
        components["train_reward"] = float(episode.reward)
    return components


def record_from_row(row: dict[str, Any]) -> dict[str, Any]:
    """A store row in the shape of `Episode.to_record()` (what JSONL step files held), plus the
    store's own fields (`step`, `prompt_messages`, `attempt`, ...)."""
    record = dict(row)
    components = _as_dict(record.pop("reward_components"))
    detail, info_text = record.pop("score_detail"), record.pop("score_info")
    reward, outcome = record.pop("reward"), record.pop("outcome")
    record["timings"] = _as_dict(record["timings"])
    record["score"] = None
    if outcome is not None:
        record["score"] = {
            "reward": reward,
            "outcome": outcome,
            "components": components,
            "detail": detail or "",
            "info": json.loads(info_text) if info_text else {},
        }
    if record.get("written_at") is not None and hasattr(record["written_at"], "isoformat"):
        record["written_at"] = record["written_at"].isoformat()
    return record


def _as_dict(value: Any) -> dict[str, float]:
    """Arrow maps come back from `to_pylist` as lists of (key, value) pairs."""
    if value is None:
        return {}
    return dict(value) if not isinstance(value, dict) else value


def table_from_rows(kind: str, rows: Iterable[dict[str, Any]]) -> pa.Table:
    """Rows as a table of `kind`'s schema; a row that does not fit raises ValueError naming its id."""
    schema = SCHEMAS[kind]
    rows = list(rows)
    try:
        return pa.Table.from_pylist(rows, schema=schema)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError) as error:
        for row in rows:  # find the row to name it
            try:
                pa.Table.from_pylist([row], schema=schema)
            except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError) as row_error:
                raise ValueError(f"{kind} row {row.get('id')!r} does not fit the schema: {row_error}") from None
        raise ValueError(f"{kind} rows do not fit the schema: {error}") from None
