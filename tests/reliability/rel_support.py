"""Shared helpers of the reliability suite: which envs exist, how to build them, process gauges.

Every registered env (`toolenv.registry.entries("envs")`) plus the core
`toolenv/ToolEnv-v0` is exercised. The core env gets a few typed test tools whose
schemas cover the shapes models get wrong (ints, bounded optionals, fixed-size
lists, enums). Counts scale with environment variables so CI stays fast and a
full run is one variable away (see docs/reliability.md):

- `TOOLENV_REL_FUZZ_ACTIONS`: mutated actions per env (CI: 10,000).
- `TOOLENV_REL_EPISODES`: episodes of the leak test (5,000 in CI and in the full run).
"""

from __future__ import annotations

import gc
import os
import threading
import time
from pathlib import Path
from typing import Annotated, Any, Literal

import pytest
from pydantic import Field

import toolenv
from toolenv import registry, tool

CORE = "ToolEnv-v0"
#: The core env again with each other model-format parser (`ToolEnv-v0/harmony`, ...): fuzzed
#: like the others, from a corpus that the parser's own `format_call` writes (plus hand-written
#: actions for some formats).
CORE_PARSERS = (
    "harmony",
    "qwen3_xml",
    "llama3_json",
    "pythonic",
    "mistral",
    "glm45",
    "deepseek_v3",
    "deepseek_v31",
    "gemma4",
    "kimi_k2",
    "muse_glimmer",
)
CORE_VARIANTS = {f"{CORE}/{p}": p for p in CORE_PARSERS}
FUZZ_ACTIONS = int(os.environ.get("TOOLENV_REL_FUZZ_ACTIONS", "10000"))
EPISODES = int(os.environ.get("TOOLENV_REL_EPISODES", "5000"))

# The code envs run each ```python block in a sandbox; a 2 s sandbox limit keeps a mutated
# program that happens to loop from costing a minute (the default), and `format` scores
# answers without running the tests (the grading path is fuzzed separately, fewer times).
CHEAP = {
    "HumanEval-v0": {"sandbox": {"timeout": 2.0}, "reward": "format"},
    "MBPP-v0": {"sandbox": {"timeout": 2.0}, "reward": "format"},
}
SANDBOX_ONLY = {k: {"sandbox": v["sandbox"]} for k, v in CHEAP.items()}

#: Registered envs again with options that change their tasks (options, not envs of their own, so
#: the registry does not list them): MBPP's test split showing one test of each task (all are
#: graded), and HotpotQA's env on the NQ-open questions (Search-R1's other set). Fuzzed, graded
#: and played in the leak run like the envs they come from; skipped when their plugin is missing.
OPTION_VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "MBPP-v0/test,shown_tests=1": ("MBPP-v0", {"split": "test", "shown_tests": 1}),
    "HotpotQA-v0/nq_open": ("HotpotQA-v0", {"tasks": "nq_open"}),
}


def base_name(name: str) -> str:
    """The registry name of `name` (an option variant's env, else `name` itself)."""
    return OPTION_VARIANTS[name][0] if name in OPTION_VARIANTS else name


def option_variants() -> list[str]:
    """The option variants whose env is installed."""
    installed = {e.name for e in registry.entries("envs")}
    return [n for n, (base, _) in OPTION_VARIANTS.items() if base in installed]


def variant_options(name: str) -> dict[str, Any]:
    """The factory options of an option variant (NQ-open's tasks loaded here, by their plugin)."""
    options = dict(OPTION_VARIANTS[name][1])
    if options.get("tasks") == "nq_open":
        from toolenv_search import nq_open_tasks

        options["tasks"] = nq_open_tasks()
    return options


def cheap(name: str) -> dict[str, Any]:
    """`CHEAP`'s settings for `name` (an option variant gets its base env's)."""
    return CHEAP.get(base_name(name), {})


def sandbox_only(name: str) -> dict[str, Any]:
    """`SANDBOX_ONLY`'s settings for `name` (an option variant gets its base env's)."""
    return SANDBOX_ONLY.get(base_name(name), {})


@tool
def add(a: int, b: int) -> str:
    """Add two integers."""
    return str(a + b)


@tool
async def lookup(query: Annotated[str, Field(min_length=1, max_length=200)], topk: int | None = None) -> str:
    """Look a phrase up in a tiny in-memory table."""
    table = {"paris": "capital of France", "ottawa": "capital of Canada"}
    hits = [v for k, v in table.items() if k in query.lower()]
    return "\n".join(hits[: topk or 5]) or "no match"


@tool
def box(
    bbox: Annotated[list[float], Field(min_length=4, max_length=4)],
    units: Literal["auto", "pixels", "normalized"] = "auto",
) -> str:
    """Area of a box [x1, y1, x2, y2]."""
    x1, y1, x2, y2 = bbox
    return f"{abs(x2 - x1) * abs(y2 - y1):g} ({units})"


CORE_TASKS = [
    {"id": "sum", "question": "2+3?", "answer": "5"},
    {"id": "capital", "question": "Capital of France?", "answer": "Paris"},
    {"id": "area", "question": "Area of [0, 0, 2, 3]?", "answer": "6"},
]

# Valid actions for the core env, the seed corpus its mutation fuzzer starts from.
CORE_CORPUS = [
    '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>',
    '<tool_call>\n{"name": "lookup", "arguments": {"query": "paris", "topk": 1}}\n</tool_call>',
    '<tool_call>\n{"name": "box", "arguments": {"bbox": [0, 0, 2, 3], "units": "pixels"}}\n</tool_call>',
    '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 1}}</tool_call>'
    '<tool_call>{"name": "lookup", "arguments": {"query": "ottawa"}}</tool_call>',
    "<answer>5</answer>",
    "I think the answer is <answer>Paris</answer>",
]


#: Valid calls of the core env's tools, written out by each variant's parser.
CORE_CALLS = [
    ("add", {"a": 2, "b": 3}),
    ("lookup", {"query": "paris", "topk": 1}),
    ("box", {"bbox": [0, 0, 2, 3], "units": "pixels"}),
]
CORE_ANSWERS = ["<answer>5</answer>", "I think the answer is <answer>Paris</answer>"]

# Hand-written actions in formats with more than one way to say a thing.
CORE_HAND_WRITTEN = {
    "harmony": [
        "<|channel|>analysis<|message|>Add them.<|end|>"
        '<|start|>assistant<|channel|>commentary to=functions.add <|constrain|>json<|message|>{"a": 2, "b": 3}<|call|>',
        '<|start|>assistant to=functions.lookup<|channel|>commentary json<|message|>{"query": "paris", "topk": 1}',
        '<|channel|>commentary to=functions.box<|message|>{"bbox": [0, 0, 2, 3], "units": "pixels"}<|call|>',
        "<|channel|>final<|message|>5<|return|>",
        "<|channel|>final<|message|>I think <answer>Paris</answer><|return|>",
    ],
    "kimi_k2": [  # K2-Thinking's reasoning, ids without `functions.`, a call cut off before its end
        "<think>Add them.</think><|tool_calls_section_begin|><|tool_call_begin|>add:0"
        '<|tool_call_argument_begin|>{"a": 2, "b": 3}<|tool_call_end|><|tool_calls_section_end|><|im_end|>',
        "<|tool_calls_section_begin|><|tool_call_begin|>functions.lookup:0<|tool_call_argument_begin|>"
        '{"query": "paris"}',
    ],
    "muse_glimmer": [  # a reply after the generation prompt, and one decoded without its special tokens
        " to=self<|message|>Add them.<|eom|><|start|>assistant to=add<|message|><atem:function_calls>\n"
        '<atem:invoke name="add">\n<atem:parameter name="a">2</atem:parameter>\n'
        '<atem:parameter name="b">3</atem:parameter>\n</atem:invoke>\n</atem:function_calls><|eot|>',
        ' to=selfLook it up.assistant to=lookup<atem:function_calls>\n<atem:invoke name="lookup">\n'
        '<atem:parameter name="query">paris</atem:parameter>\n</atem:invoke>\n</atem:function_calls>',
        " to=user<|message|>I think <answer>Paris</answer><|eot|>",
    ],
}


def core_corpus(name: str) -> list[str]:
    """Valid actions for the core env `name` (CORE or a CORE_VARIANTS key)."""
    if name == CORE:
        return list(CORE_CORPUS)
    parser = toolenv.parsers.get_parser(CORE_VARIANTS[name])
    written = [parser.format_call(tool_name, args, f"call_{i}") for i, (tool_name, args) in enumerate(CORE_CALLS)]
    assert all(written), f"{parser.name} cannot write the core env's calls"
    return [*(w for w in written if w), *CORE_HAND_WRITTEN.get(parser.name, []), *CORE_ANSWERS]


def env_names() -> list[str]:
    """The core env and every installed env plugin, by registry name."""
    return [CORE, *sorted({e.name for e in registry.entries("envs")})]


def make_env(name: str, **overrides: Any) -> toolenv.ToolEnv:
    """Build env `name` (a registry name) with `overrides` passed to its factory."""
    if name == CORE or name in CORE_VARIANTS:
        parser = CORE_VARIANTS.get(name, "hermes")
        kwargs: dict[str, Any] = {"tools": [add, lookup, box], "tasks": CORE_TASKS, "parser": parser}
        kwargs.update(overrides)
        return toolenv.ToolEnv(**kwargs)
    if name in OPTION_VARIANTS:
        overrides = {**variant_options(name), **overrides}
    env = registry.load("envs", base_name(name))(**overrides)
    assert isinstance(env, toolenv.ToolEnv)
    return env


def oracle(name: str) -> Any:
    """The env's oracle, or None (the core env has none)."""
    if name == CORE or name in CORE_VARIANTS:
        return None
    try:
        return registry.load("oracles", base_name(name))
    except registry.PluginError:
        return None


# ---------------------------------------------------------------------- process gauges (Linux /proc)
PROC = Path("/proc/self")
needs_proc = pytest.mark.skipif(not PROC.exists(), reason="process gauges read /proc (Linux only)")


def open_fds() -> int:
    """File descriptors open in this process."""
    return len(os.listdir(PROC / "fd"))


DB_SUFFIXES = (".sqlite", ".sqlite3", ".db", ".duckdb")


def database_fds() -> dict[str, int]:
    """Open descriptors per database file: the SQL executor's per-thread connection caches."""
    per_file: dict[str, int] = {}
    for fd in os.listdir(PROC / "fd"):
        try:
            target = os.readlink(PROC / "fd" / fd)
        except OSError:  # closed while listing (listdir's own descriptor among them)
            continue
        if target.endswith(DB_SUFFIXES):
            per_file[target] = per_file.get(target, 0) + 1
    return per_file


def sql_threads() -> int:
    """Threads of the SQL executor's pool (started lazily, up to its size)."""
    return sum(t.name.startswith("toolenv-sql") for t in threading.enumerate())


def thread_count() -> int:
    """OS threads of this process."""
    return len(os.listdir(PROC / "task"))


def child_pids() -> set[int]:
    """Live direct children of this process (zombies excluded)."""
    me = os.getpid()
    kids: set[int] = set()
    for task in os.listdir(PROC / "task"):
        try:
            text = (PROC / "task" / task / "children").read_text()
        except OSError:
            continue
        kids.update(int(p) for p in text.split())
    alive = set()
    for pid in kids:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if fields[0] != "Z" and int(fields[1]) == me:
            alive.add(pid)
    return alive


def rss_mb() -> float:
    """Resident set size in MiB."""
    for line in (PROC / "status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


# ---------------------------------------------------------------------- leak gauges
def gauges() -> dict[str, Any]:
    """fds and threads other than the SQL executor's (see test_rel_leaks), children, RSS."""
    gc.collect()
    db = database_fds()
    pool = sql_threads()
    return {
        "fds": open_fds() - sum(db.values()),
        "threads": thread_count() - pool,
        "children": child_pids(),
        "rss_mb": rss_mb(),
        "db_fds": db,
        "sql_threads": pool,
    }


def settle(baseline: dict[str, Any], seconds: float = 10.0) -> dict[str, Any]:
    """Gauges once they are back at the baseline, or the last reading after `seconds`."""
    deadline = time.monotonic() + seconds
    while True:
        now = gauges()
        back = (
            now["fds"] <= baseline["fds"]
            and now["threads"] <= baseline["threads"]
            and now["children"] <= baseline["children"]
        )
        if back or time.monotonic() > deadline:
            return now
        time.sleep(0.1)


def zombie_children() -> set[int]:
    """Direct children of this process that have ended but were not reaped."""
    me = os.getpid()
    zombies: set[int] = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] == "Z" and int(fields[1]) == me:
            zombies.add(int(entry))
    return zombies
