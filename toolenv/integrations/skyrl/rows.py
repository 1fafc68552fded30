"""SkyRL dataset rows from a toolenv env, and the env and task a row names.

SkyRL-train's `PromptDataset` reads rows with a `prompt` (chat messages) and an
`env_class` (a skyrl-gym id), and hands every other column to the env as its `extras`
dict. The rows are verl's (`toolenv.integrations.verl.build_rows`, the same prompt,
task and env kwargs) in SkyRL's columns:

- `prompt`: the env's own first messages for the task (system prompt with the tool
  instructions, then the question), so the model learns the format the env parses;
- `env_class`: the skyrl-gym id (the env id itself, registered by `register()`);
- `reward_spec`: `{"method": "rule", "ground_truth": ...}`, SkyRL's convention (the env
  scores with its own reward; the ground truth is there for SkyRL's tooling and logs);
- `extra_info`: `index`, `split`, `env_id`, `task_id`, `task` (JSON), `env_kwargs` (JSON);
- `data_source`: the env id unless given.

Nested values are JSON strings so the rows write to parquet as they are. This module
does not import skyrl_gym (nor verl): rows can be built where SkyRL is not installed.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from toolenv import _aio
from toolenv.integrations.trl.environment import _row_task
from toolenv.integrations.verl.data import abuild_rows
from toolenv.integrations.verl.envs import plain

__all__ = ["DEFAULT_ENV_CLASS", "adataset_rows", "dataset_rows", "env_spec_from_extras", "task_options"]

#: The skyrl-gym id of the generic class, whose rows name their env in `extra_info.env_id`.
DEFAULT_ENV_CLASS = "toolenv"


def json_object(value: Any, what: str) -> dict[str, Any]:
    """A mapping, or a JSON object's text, as a plain dict; None or "" as {}.

    Raises:
        ValueError: the value is invalid JSON or not an object.
    """
    value = plain(value)
    if value is None or value == "":
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{what} is not valid JSON: {exc.msg}") from None
    if not isinstance(value, dict):
        raise ValueError(f"{what} must be a JSON object, got {type(value).__name__}")
    return value


def _fields(extras: Mapping[str, Any] | None) -> dict[str, Any]:
    """The row's columns with `extra_info` merged over them; None means absent (HF datasets fill
    missing struct keys with None)."""
    row = plain(dict(extras or {}))
    info = row.get("extra_info")
    merged = {k: v for k, v in row.items() if v is not None}
    if isinstance(info, dict):
        merged.update({k: v for k, v in info.items() if v is not None})
    return merged


def env_spec_from_extras(extras: Mapping[str, Any] | None) -> tuple[str | None, dict[str, Any]]:
    """`(env_id, env_kwargs)` a row names (`extra_info.env_id`/`env_kwargs`), env_id None when it names none.

    Raises:
        ValueError: `env_kwargs` is not a JSON object.
    """
    fields = _fields(extras)
    env_id = fields.get("env_id")
    return (str(env_id) if env_id else None), json_object(fields.get("env_kwargs"), "extra_info.env_kwargs")


def task_options(extras: Mapping[str, Any] | None) -> dict[str, Any]:
    """`ToolEnv.reset` options for the task a row names.

    In order: `task` (a Task, its JSON or a dict), `task_id`, `task_index` (into the env's
    tasks), or Task-shaped columns (`question`, `context`, ...). Their answer is
    `reward_spec.ground_truth` when the row has one, as SkyRL's own envs score against it
    (its GSM8K rows keep the worked solution in `extra_info.answer`; its Search-R1 rows give
    `{"target": [...]}`), else the row's `answer`. Each is read from `extra_info` first,
    then from the row's top level.

    Raises:
        ValueError: the row names no task, or its task is invalid.
    """
    fields = _fields(extras)
    if fields.get("task") not in (None, ""):
        return {"task": _row_task({"task": fields["task"]})}
    if fields.get("task_id") not in (None, ""):
        return {"task_id": str(fields["task_id"])}
    if fields.get("task_index") is not None:
        return {"task_index": int(fields["task_index"])}
    if fields.get("question"):
        gold = _ground_truth(fields.get("reward_spec"))
        if gold is not None:
            fields["answer"] = gold
        return {"task": _row_task({k: v for k, v in fields.items() if k != "task_id"})}
    raise ValueError(
        "this SkyRL row names no task: give its extra_info a 'task' (JSON, as "
        "toolenv.integrations.skyrl.dataset_rows writes), a 'task_id', a 'task_index' or a 'question'"
    )


def _ground_truth(spec: Any) -> str | list[str] | None:
    """`reward_spec.ground_truth` as a Task answer: text, a list of texts (Search-R1's
    `{"target": [...]}` unwrapped), numbers as text; None when the row gives none."""
    gold = spec.get("ground_truth") if isinstance(spec, dict) else None
    if isinstance(gold, dict):
        gold = gold.get("target")
    if isinstance(gold, (list, tuple)):
        return [str(g) for g in gold if g is not None] or None
    return None if gold is None or gold == "" else str(gold)


def _skyrl_row(row: dict[str, Any], env_class: str) -> dict[str, Any]:
    """A verl row (`build_rows`) in SkyRL's columns."""
    if "images" in row:
        raise ValueError(
            f"task {row['extra_info']['task_id']!r} has images in its prompt; SkyRL's text envs carry text only"
        )
    extra = {k: v for k, v in row["extra_info"].items() if k != "tools_kwargs"}  # for verl's own tool loop
    return {
        "prompt": [m for m in row["prompt"] if m["content"]],  # no empty system message
        "env_class": env_class,
        "reward_spec": {"method": "rule", "ground_truth": row["reward_model"]["ground_truth"]},
        "extra_info": extra,
        "data_source": row["data_source"],
    }


async def adataset_rows(
    env_id: str,
    *,
    n: int | None = None,
    split: str | None = None,
    env_class: str | None = None,
    env_kwargs: Mapping[str, Any] | None = None,
    data_source: str | None = None,
) -> list[dict[str, Any]]:
    """One SkyRL-train row per task of `gym.make(env_id, **env_kwargs)`, for parquet or `datasets`.

    Args:
        env_id: a registered toolenv env id (the worker makes the env again from it).
        n: keep the first `n` tasks (after `split`).
        split: `"train"`, `"test"` or `"all"`/None: a stable split by task id (as `toolenv verl-data`).
        env_class: the rows' skyrl-gym id: default `env_id` (registered by `register()`); pass
            `"toolenv"` for the generic class, which reads the env from `extra_info.env_id`.
        env_kwargs: passed to `gym.make`, and stored in every row (JSON, without `tasks` and
            `limit`: a row carries its own task) so the worker builds the same env.
        data_source: the `data_source` column (default `env_id`), which SkyRL groups metrics by.

    Raises:
        ValueError: the env cannot be made or has no tasks, `n` is below 1, or a task's prompt
            has images (SkyRL's text envs carry text prompts only).
    """
    if n is not None and n < 1:
        raise ValueError(f"n must be at least 1, got {n}")
    rows = await abuild_rows(env_id, env_kwargs=env_kwargs, split=split, limit=n, data_source=data_source)
    return [_skyrl_row(row, env_class or env_id) for row in rows]


def dataset_rows(
    env_id: str,
    *,
    n: int | None = None,
    split: str | None = None,
    env_class: str | None = None,
    env_kwargs: Mapping[str, Any] | None = None,
    data_source: str | None = None,
) -> list[dict[str, Any]]:
    """Sync twin of `adataset_rows` (same arguments, spelt out so that a wrong one is refused
    by this name); inside a running event loop, await that."""
    return _aio.run(
        adataset_rows(env_id, n=n, split=split, env_class=env_class, env_kwargs=env_kwargs, data_source=data_source)
    )
