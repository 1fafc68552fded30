"""Env factories `toolenv/Spider-v0` and `toolenv/Chinook-v0`, and their oracles.

Multi-turn: the model may run queries (`<sql>…</sql>` with the default `tags`
parser, or a `sql` tool call with `hermes`), then answers with
`<answer>SQL</answer>`, scored by execution match. Importing this module
registers the `execution_match` reward.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from sqlglot.dialects.dialect import Dialect

from toolenv import Task, ToolEnv, load_tasks
from toolenv.parsers import answer_markup_of
from toolenv.result_cache import shared_cache
from toolenv.rewards import Reward
from toolenv_sql.datasets import chinook_tasks, spider_tasks
from toolenv_sql.errors import SQLError
from toolenv_sql.executor import run_query
from toolenv_sql.paths import DATA_DIR, resolve_database
from toolenv_sql.reward import ExecutionMatch
from toolenv_sql.tool import SQLTool

__all__ = [
    "SYSTEM_PROMPT",
    "chinook_oracle",
    "make_chinook_env",
    "make_spider_env",
    "spider_oracle",
    "system_prompt",
]

SYSTEM_PROMPT = (
    "You answer questions about a database by writing SQL. You may run read-only queries to explore "
    "the data first. Give your final answer as one SQL query in the database's dialect inside "
    "<answer>...</answer>; it is scored by whether it returns the same rows as the reference query."
)
_ANSWER_MARKUP = "<answer>...</answer>"
_ANSWER_PHRASE = f" inside {_ANSWER_MARKUP}"
#: `SYSTEM_PROMPT`'s answer format for a model that answers through a tool (TRL's rows).
ANSWER_TOOL_REWRITES = {_ANSWER_PHRASE: " by calling the `{answer_tool}` tool"}


def system_prompt(dialect: str | None = None, answer_markup: str | None = _ANSWER_MARKUP) -> str:
    """`SYSTEM_PROMPT`, naming `dialect` when the model writes one other than the database's,
    and asking for the answer inside `answer_markup`, the parser's (`ActionParser.answer_markup()`).

    The queries and the answer are then read in that dialect (SQLite's `a || b` is MySQL's
    `a OR b`), so a prompt asking for the database's own dialect would have a right answer
    written as told scored 0. Likewise an answer written in tags the parser does not read is
    no answer; with `answer_markup=None` (a format that reads none, or a channel's plain text)
    the prompt names no tags and the parser's instructions say how to answer.
    """
    text = SYSTEM_PROMPT.replace(_ANSWER_PHRASE, f" inside {answer_markup}" if answer_markup else "")
    if dialect is None:
        return text
    name = type(Dialect.get_or_raise(dialect)).__name__  # "MySQL", "Postgres", ...; an unknown name: ValueError
    return text.replace("in the database's dialect", f"in {name}") + (
        f" Write every query in {name}: it is translated to the database's own dialect."
    )


# Options consumed here (the rest go to ToolEnv).
_TOOL_OPTIONS = ("dialect", "query_timeout", "max_rows", "max_count", "max_chars", "max_cell_chars", "root")
# Seconds an answer's query may run when scored (`ExecutionMatch`'s default), unless the tool's are more.
_REWARD_TIMEOUT = 10.0
_EXECUTION_MATCH = ExecutionMatch.name


def _make_env(name: str, default_tasks: Iterable[Task], overrides: Mapping[str, Any]) -> ToolEnv:
    opts = dict(overrides)
    tasks: Any = opts.pop("tasks", None)
    limit = opts.pop("limit", None)
    tool_opts = {k: opts.pop(k) for k in _TOOL_OPTIONS if k in opts}
    # Answers depend on the query, the task's database (the "task" scope) and the tool's options.
    namespace = ("toolenv_sql", name, tuple(sorted((k, str(v)) for k, v in tool_opts.items())))
    tool_opts["cache"] = shared_cache(namespace, opts.pop("cache", None))
    # A file, or Tasks and dicts alike (`exclude_empty_gold` reads each task's context).
    tasks = list(default_tasks) if tasks is None else load_tasks(tasks)
    if opts.pop("exclude_empty_gold", False):  # lazily: with a limit, only the tasks kept are run
        tasks = (t for t in tasks if not _gold_is_empty(t, tool_opts.get("root")))
    tasks = list(tasks if limit is None else itertools.islice(tasks, int(limit)))
    opts.setdefault("tools", [SQLTool(**tool_opts)])
    column_order = bool(opts.pop("column_order", True))
    require_table = bool(opts.pop("require_table", True))
    test_suite = bool(opts.pop("test_suite", False))
    # An answer gets at least the time its queries got in the tool: a query the model ran there
    # would otherwise time out when scored, on a database where queries are slow.
    timeout = max(_REWARD_TIMEOUT, float(tool_opts.get("query_timeout", 0.0)))
    reward_opts = _reward_options(
        tool_opts, timeout=timeout, column_order=column_order, require_table=require_table, test_suite=test_suite
    )
    if "reward" in opts:  # a spec naming execution_match scores with the env's options too
        opts["reward"] = _with_reward_options(opts["reward"], reward_opts)
    else:
        opts["reward"] = ExecutionMatch(**reward_opts)
    opts.setdefault("parser", "tags")
    opts.setdefault("max_turns", 5)
    if "system_prompt" not in opts:
        markup = answer_markup_of(opts["parser"], opts.get("parser_kwargs"))
        opts["system_prompt"] = system_prompt(tool_opts.get("dialect"), markup)
        if "answer_tool_rewrites" not in opts:  # the phrase the prompt now has
            opts["answer_tool_rewrites"] = {f" inside {markup}": ANSWER_TOOL_REWRITES[_ANSWER_PHRASE]} if markup else {}
    opts.setdefault("answer_tool_rewrites", ANSWER_TOOL_REWRITES)
    opts.setdefault("prompt_template", "{instructions}\n\n{question}\n")
    return ToolEnv(tasks=tasks, **opts)


def _reward_options(
    tool_opts: Mapping[str, Any], *, timeout: float, column_order: bool, require_table: bool, test_suite: bool
) -> dict[str, Any]:
    """The `ExecutionMatch` settings the env's options set: those left at the reward's defaults
    are left out, so a spec is built as it would be without the env."""
    given = {
        "dialect": tool_opts.get("dialect"),
        "root": tool_opts.get("root"),
        "timeout": timeout,
        "column_order": column_order,
        "require_table": require_table,
        "test_suite": test_suite,
    }
    defaults = {
        "dialect": None,
        "root": None,
        "timeout": _REWARD_TIMEOUT,
        "column_order": True,
        "require_table": True,
        "test_suite": False,
    }
    return {k: v for k, v in given.items() if v != defaults[k]}


def _with_reward_options(spec: Any, options: Mapping[str, Any]) -> Any:
    """`spec` (a reward spec, as `toolenv.rewards.get_reward` takes) with `options` as the
    settings of every `execution_match` it names; a setting the spec gives itself wins.

    The env's `dialect`, `root`, `column_order`, `require_table` and answer timeout are the reward's too: a bare
    `execution_match` would read a MySQL answer the tool ran as SQLite, and score it 0. The
    name becomes a `{"name": ..., **settings}` list item, so the core builds it (and refuses a
    setting it does not take) as for any spec. A `Reward` object is used as given.
    """
    if not options or isinstance(spec, Reward):
        return spec
    if isinstance(spec, str):
        return [_execution_match_item(options, {})] if spec == _EXECUTION_MATCH else spec
    if isinstance(spec, Mapping):
        if _EXECUTION_MATCH not in spec:
            return spec
        # `{name: weight or settings}` as the list items it stands for, which may carry settings.
        spec = [{**w, "name": k} if isinstance(w, Mapping) else (k, w) for k, w in spec.items()]
    if isinstance(spec, Sequence):
        return [_list_item(item, options) for item in spec]
    return spec  # not a spec: get_reward says so


def _execution_match_item(options: Mapping[str, Any], own: Mapping[str, Any]) -> dict[str, Any]:
    """A list item naming execution_match: the env's `options`, then the spec's `own` settings (which win)."""
    return {**options, **{str(k): v for k, v in own.items()}, "name": _EXECUTION_MATCH}


def _list_item(item: Any, options: Mapping[str, Any]) -> Any:
    """A list spec's item, with `options` when it names execution_match."""
    if isinstance(item, str):
        return _execution_match_item(options, {}) if item == _EXECUTION_MATCH else item
    if isinstance(item, Mapping):
        own = {k: v for k, v in item.items() if k != "name"}
        return _execution_match_item(options, own) if item.get("name") == _EXECUTION_MATCH else item
    if isinstance(item, Sequence) and len(item) == 2 and item[0] == _EXECUTION_MATCH:
        return _execution_match_item(options, {"weight": item[1]})
    return item


def _gold_is_empty(task: Task, root: Any) -> bool:
    """Whether the task's gold query returns no rows (any query that returns none then scores 1).

    Raises:
        ValueError: the gold query cannot run (the message names the task).
    """
    try:
        path, engine = resolve_database(task.context, Path(root) if root is not None else DATA_DIR)
        sql = _gold(task).strip().rstrip(";")
        return run_query(path, engine, sql, timeout=60.0, max_rows=1, count_all=False).row_count == 0
    except SQLError as exc:
        raise ValueError(f"task {task.id!r}: its gold query cannot run, so it cannot be scored: {exc}") from None


def make_spider_env(**overrides: Any) -> ToolEnv:
    """Spider dev (697 questions, 10 SQLite databases).

    Overrides: `tasks`, `limit` (first N tasks), `exclude_empty_gold` (leave out tasks whose
    gold query returns no rows: execution match gives any empty query full marks there, a
    reward a policy learns to take; 13 of Spider's 697, 2 of Chinook's 84), `column_order`
    (False: the answer's columns may come in any order, as in Spider's official evaluation),
    `require_table` (False: an answer that reads no table, such as `SELECT 6` or rows pasted as
    `VALUES`, or whose every column is a constant beside a table it names, is scored by its rows;
    by default it scores 0 when the gold query reads a table), `test_suite` (True: a matching
    answer must match again on a copy of the database with rows removed, Spider's test-suite
    idea; off by default, see `ExecutionMatch`),
    SQL options (`dialect`, `query_timeout`, `max_rows`, `max_count`, `max_chars`, `max_cell_chars`,
    `root`), `cache` (a `ResultCache`, or `True` or its settings for the process's cache of
    this env and options, keyed by task), and any `ToolEnv` keyword (`parser`, `reward`,
    `max_turns`, ...). With `dialect`, the system prompt asks for that dialect by name. Every
    `execution_match` a `reward` spec names gets `dialect`, `column_order`, `require_table`,
    `test_suite`, `root` and the answer's timeout, unless the spec sets them itself.
    """
    return _make_env("Spider-v0", spider_tasks(), overrides)


def make_chinook_env(**overrides: Any) -> ToolEnv:
    """Chinook (84 questions, one SQLite database); overrides as for `make_spider_env`."""
    return _make_env("Chinook-v0", chinook_tasks(), overrides)


def _gold(task: Task) -> str:
    gold = task.context.get("gold_sql")
    return gold if isinstance(gold, str) else (task.answers[0] if task.answers else "")


def spider_oracle(task: Task, turn: int, observation: str) -> str:
    """Run the gold query once, then answer with it (tags format)."""
    return f"<sql>{_gold(task)}</sql>" if turn == 0 else f"<answer>{_gold(task)}</answer>"


def chinook_oracle(task: Task, turn: int, observation: str) -> str:
    """As `spider_oracle`, for Chinook."""
    return spider_oracle(task, turn, observation)
