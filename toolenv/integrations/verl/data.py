"""verl's parquet rows from a toolenv env: one row per task, prompt from the env's own reset.

A row is what `verl.utils.dataset.RLHFDataset` reads and what `ToolEnvAgentLoop`
needs to replay the episode in a Ray worker:

- `prompt`: the chat messages of `env.reset(options={"task": task})[1]["messages"]`; for verl's
  `tool_agent`, which gives the model the tools through the chat template (`tools=`), the reset has
  `native_tools`, so the prompt says only how to answer rather than listing the tools a second time
- `agent_name`: the agent loop (`toolenv_agent` in examples/verl/toolenv_agent.yaml)
- `data_source`, `ability`, `reward_model.ground_truth` (a string; JSON list for several answers)
- `extra_info`: `index` (the row's position among the rows built), `split`, `env_id`, `task_id`,
  `task` (JSON), `env_kwargs` (JSON), `tools_kwargs` (each tool's `create_kwargs.task`, for verl's
  `tool_agent` with `ToolEnvBaseTool`) and, in rows for a loop that gives the model the tools
  itself (`native_tools`: verl's `tool_agent`), `tool_selection` (the env's tool names)

`tool_selection` is verl's per-row tool filter: its `tool_agent` offers a row only the configured
tools the row names. Without it, a dataset mixing envs (two files given to verl, or the rows of
two envs in one file) offered every env's tools on every row, and parquet (and verl's dataset,
concatenating files) unions `tools_kwargs`' struct fields, so a row held `None` for the other
env's tools: a call to one failed inside verl (`'NoneType' object has no attribute 'get'`, before
the tool runs, so no tool can answer it). With it, such a call gets verl's own error observation
(`Unknown function ...`, naming the row's tools) and the episode goes on. It names the env's
tools only: a tool of the verl config that no env of the dataset has is not offered on its rows.

pyarrow cannot write an empty struct, so nested values are JSON strings or left out.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from toolenv import _aio
from toolenv._outputs import written_in_place
from toolenv.env import ToolEnv
from toolenv.integrations.verl.envs import TASK_SELECTION_KEYS, make_env
from toolenv.types import Message, Task

__all__ = [
    "DEFAULT_AGENT_NAME",
    "TEMPLATE_TOOLS_AGENTS",
    "abuild_rows",
    "build_rows",
    "ground_truth",
    "prompt_messages",
    "write_parquet",
]

DEFAULT_AGENT_NAME = "toolenv_agent"
#: verl's agent loops that render the tools with the chat template (`apply_chat_template(tools=...)`).
TEMPLATE_TOOLS_AGENTS = frozenset({"tool_agent"})


def ground_truth(task: Task) -> str:
    """The gold answer as one string (several answers as a JSON list; none as "")."""
    answers = task.answers
    if not answers:
        return ""
    return answers[0] if len(answers) == 1 else json.dumps(answers, ensure_ascii=False)


def prompt_messages(messages: Iterable[Message]) -> tuple[list[dict[str, str]], list[dict[str, bytes]]]:
    """Chat dicts for the `prompt` column and the `images` column.

    verl's dataset replaces each `<image>` in a message's text with the next image of
    the row's `images` column, so images are put there in order.
    """
    out: list[dict[str, str]] = []
    images: list[dict[str, bytes]] = []
    for m in messages:
        content = "<image>" * len(m.images) + m.content
        images.extend({"bytes": im.data} for im in m.images)
        out.append({"role": m.role, "content": content})
    return out, images


SPLITS = ("all", "train", "test")


def split_tasks(tasks: list[Task], split: str | None, test_fraction: float = 0.1) -> list[Task]:
    """A deterministic train/test split by a hash of the task id (`all` or None keeps every task).

    The same id always lands in the same split, whatever the task order or the other tasks,
    so training and validation files made separately never overlap. Tasks that say what must
    stay together (`metadata["split_group"]`: Spider's paraphrases of one gold query) are split
    by that instead, so no held-out task has its twin in training. Tasks of a dataset with
    splits of its own (every task's `metadata["split"]` set, e.g. MBPP's) keep that split:
    `train` is the dataset's train split and `test` its test split.
    """
    if split is None or split == "all":
        return list(tasks)
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {', '.join(SPLITS)}")
    own = [t.metadata.get("split") for t in tasks]
    if own and all(isinstance(s, str) for s in own):
        return [t for t, s in zip(tasks, own, strict=True) if s == split]

    def is_test(task: Task) -> bool:
        key = str(task.metadata.get("split_group") or task.id)
        return int(hashlib.sha256(key.encode()).hexdigest()[:8], 16) % 10_000 < test_fraction * 10_000

    return [t for t in tasks if is_test(t) == (split == "test")]


async def abuild_rows(
    env_id: str,
    *,
    env_kwargs: Mapping[str, Any] | None = None,
    split: str | None = None,
    limit: int | None = None,
    agent_name: str = DEFAULT_AGENT_NAME,
    data_source: str | None = None,
    ability: str = "tool_use",
    native_tools: bool | None = None,
    skip_failed: bool = False,
    skipped: list[tuple[str, str]] | None = None,
) -> list[dict[str, Any]]:
    """One verl row per task of `gym.make(env_id, **env_kwargs)` in `split` (see `split_tasks`).

    `native_tools`: the agent loop shows the model the tools through the chat template, so the
    prompt holds only the parser's answer instructions (`reset(options={"native_tools": True})`);
    by default True for verl's `tool_agent` (`TEMPLATE_TOOLS_AGENTS`), False otherwise
    (`ToolEnvAgentLoop` renders the prompt without `tools=`: the env's prompt lists them).

    `skip_failed`: leave out the tasks whose reset raises (an unreadable image among thousands)
    instead of raising on the first; `skipped`, if given, gets `(task id, one-line error)` of each
    task left out. `split` and `limit` choose the tasks before any reset, so a skipped task is not
    replaced, and `index` counts the rows kept (0, 1, 2, ... with no gaps).

    Raises:
        ValueError: the env cannot be made, has no tasks, `env_kwargs` is not JSON (tools given as
            objects, not references), `limit` or `split` is invalid, or a task's reset raised
            (without `skip_failed`; with it, only when every task's did).
    """
    if limit is not None and limit < 1:
        raise ValueError(f"--limit must be at least 1, got {limit}")
    kwargs = dict(env_kwargs or {})
    stored = {k: v for k, v in kwargs.items() if k not in TASK_SELECTION_KEYS}
    try:  # each row carries them, as JSON, for a worker to rebuild its env
        stored_json = json.dumps(stored, ensure_ascii=False, sort_keys=True)
    except (TypeError, ValueError) as exc:
        raise ValueError(
            f"env_kwargs must be JSON, since every row carries them for a worker to rebuild its env: give tools as "
            f"references, 'module:Name' or a tool plugin name, not objects ({exc})"
        ) from None
    if native_tools is None:
        native_tools = agent_name in TEMPLATE_TOOLS_AGENTS
    failed = skipped if skipped is not None else []
    env = make_env(env_id, kwargs)
    try:
        tasks = split_tasks(env.tasks, split)
        tasks = tasks[:limit] if limit is not None else tasks
        if not tasks:
            raise ValueError(f"env {env_id!r} has no tasks (pass tasks in --env-kwargs?)")
        rows: list[dict[str, Any]] = []
        first_failure = len(failed)
        for task in tasks:
            try:
                _, info = await env.areset(options={"task": task, "native_tools": native_tools})
            except Exception as exc:  # said with the task's id, or skipped as asked
                reason = _one_line(exc)
                if not skip_failed:
                    raise ValueError(  # what to do first: the command line clips a long line
                        f"the reset of task {task.id!r} failed; fix or remove the task, or leave out the tasks "
                        f"whose reset fails with skip_failed=True (toolenv verl-data --skip-failed): {reason}"
                    ) from exc
                failed.append((task.id, reason))
                continue
            columns = {"data_source": data_source or env_id, "agent_name": agent_name, "ability": ability}
            place = {"index": len(rows), "split": split or "all", "env_id": env_id}
            rows.append(_row(env, task, info["messages"], columns, place, stored_json, native_tools))
        if not rows:
            task_id, reason = failed[first_failure]
            raise ValueError(
                f"the reset failed for every one of the {len(tasks)} tasks, so there is no row to write; "
                f"the first, task {task_id!r}: {reason}"
            )
        return rows
    finally:
        await env.aclose()


#: Characters of a skipped task's error kept (a reset's error may quote a page).
MAX_REASON_CHARS = 300


def _one_line(exc: BaseException) -> str:
    """`Type: message` on one line, clipped to `MAX_REASON_CHARS`."""
    from toolenv.cli import clip_line

    return clip_line(f"{type(exc).__name__}: {exc}", MAX_REASON_CHARS)


def _row(
    env: ToolEnv,
    task: Task,
    messages: list[Message],
    columns: dict[str, str],
    place: dict[str, Any],
    env_kwargs_json: str,
    native_tools: bool,
) -> dict[str, Any]:
    """The verl row of `task`, whose reset gave `messages`: `columns` are its `data_source`,
    `agent_name` and `ability`; `place` its `index`, `split` and `env_id` (first in `extra_info`);
    `native_tools`: for a loop that gives the model the tools itself, which `tool_selection` names."""
    prompt, images = prompt_messages(messages)
    task_json = task.model_dump_json()
    extra: dict[str, Any] = {**place, "task_id": task.id, "task": task_json, "env_kwargs": env_kwargs_json}
    if env.tools:
        extra["tools_kwargs"] = {t.name: {"create_kwargs": {"task": task_json}} for t in env.tools}
    if env.tools and native_tools:  # verl's tool_agent offers the row only these (see the module docstring)
        extra["tool_selection"] = [t.name for t in env.tools]
    row: dict[str, Any] = {
        **columns,
        "prompt": prompt,
        "reward_model": {"style": "rule", "ground_truth": ground_truth(task)},
        "extra_info": extra,
    }
    if images:
        row["images"] = images
    return row


def build_rows(env_id: str, **kwargs: Any) -> list[dict[str, Any]]:
    """Sync twin of `abuild_rows` (same keyword arguments, `skip_failed` and `skipped` included);
    not for use inside an event loop."""
    return _aio.run(abuild_rows(env_id, **kwargs))


def write_parquet(rows: list[dict[str, Any]], path: str | Path) -> Path:
    """Write rows as one parquet file (pyarrow); parent folders are created.

    Columns are those of every row (rows of several envs: only image rows have `images`);
    a row without one holds null there, which verl's dataset reads as absent.

    The file is written beside `path` and then renamed over it, so a write that fails or is
    killed leaves the previous file whole (pyarrow deletes the file it fails to write, and a
    killed write would leave a truncated one that verl reads as corrupt); what is not a regular
    file (a FIFO, /dev/stdout) is written into (`toolenv._outputs`).
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    if not rows:
        raise ValueError("no rows to write")
    # Not `Table.from_pylist(rows)`: it takes the columns of the first row only.
    names = list(dict.fromkeys(name for row in rows for name in row))
    table = pa.Table.from_pydict({name: [row.get(name) for row in rows] for name in names})
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    # Renamed over the file a symlink points to, not over the link. The temporary file has a
    # hidden name in the same folder (same file system, so the rename is atomic) and is made by
    # pyarrow itself, so that it gets the usual permissions, not a temp file's 0600.
    target = Path(os.path.realpath(out))
    if target.is_dir():
        raise IsADirectoryError(errno.EISDIR, "is a directory, not a parquet file", str(out))
    # Asked of `out`, not `target`: /dev/stdout into a pipe resolves to no file (`pipe:[N]`), and onto
    # `> f.parquet` to the file itself, replaced then, not written where the shell's descriptor points.
    if written_in_place(out):  # a FIFO, /dev/stdout: renamed over, it would become a file
        buffer = pa.BufferOutputStream()  # built whole first: the parquet writer seeks, a pipe cannot
        pq.write_table(table, buffer)
        with out.open("wb") as fh:
            fh.write(buffer.getvalue().to_pybytes())
        return out
    tmp = target.with_name(f".{target.name}.{uuid.uuid4().hex}.tmp")
    try:
        pq.write_table(table, tmp)
        os.replace(tmp, target)
    except BaseException as exc:
        tmp.unlink(missing_ok=True)
        if isinstance(exc, OSError) and exc.errno:  # about `out`, not the temporary file
            raise type(exc)(exc.errno, os.strerror(exc.errno), str(out)) from exc
        raise
    return out
