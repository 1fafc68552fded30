"""`toolenv/HotpotQA-v0`: multi-hop QA over the bundled HotpotQA corpus, in Search-R1's format.

The model searches with `<search> query </search>`, reads `<information>Doc 1(Title: "...")
...</information>`, and answers with `<answer> ... </answer>`; the reward is exact
match (Search-R1's), or token F1 with `reward="f1"`. `parser="hermes"` gives the
same env with JSON tool calls.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from toolenv import ActionParser, Message, Task, ToolEnv, WeightedSum, get_reward, load_tasks
from toolenv.parsers import TagParser
from toolenv.result_cache import shared_cache
from toolenv.rewards.penalties import InvalidCallPenalty, ToolCallPenalty
from toolenv_search.backend import SearchBackend
from toolenv_search.corpus import bundled_nq_open_path, bundled_questions_path
from toolenv_search.tool import SearchTool

__all__ = [
    "SEARCH_R1_PROMPT",
    "hotpotqa_oracle",
    "hotpotqa_tasks",
    "make_hotpotqa_env",
    "nq_open_tasks",
    "search_r1_question",
]

#: Search-R1's instruction prompt (its `make_prefix`, base-model form): Search-R1 checkpoints see their training text.
SEARCH_R1_PROMPT = (
    "Answer the given question. "
    "You must conduct reasoning inside <think> and </think> first every time you get new information. "
    "After reasoning, if you find you lack some knowledge, you can call a search engine by <search> query </search> "
    "and it will return the top searched results between <information> and </information>. "
    "You can search as many times as your want. "
    "If you find no further external knowledge needed, you can directly provide the answer inside <answer> and "
    "</answer>, without detailed illustrations. For example, <answer> Beijing </answer>. Question: {question}\n"
)

#: The same instructions for native tool calling (hermes): the search tool replaces the tags.
TOOL_CALL_PROMPT = (
    "Answer the given question. Reason step by step. If you find you lack some knowledge, call the search tool; "
    "its results come back as tool responses. You can search as many times as you want. "
    "If you find no further external knowledge needed, provide the answer inside <answer> and </answer>, "
    "without detailed illustrations. For example, <answer> Beijing </answer>. Question: {question}\n"
)

#: The instructions of both prompts for a model that calls the search tool and gives the answer through a tool
#: (TRL's rows): the env's `answer_tool_rewrites`, the question that follows kept as it is.
ANSWER_TOOL_REWRITES = dict.fromkeys(
    (SEARCH_R1_PROMPT.partition("Question: ")[0], TOOL_CALL_PROMPT.partition("Question: ")[0]),
    "Answer the given question. Reason step by step. If you find you lack some knowledge, call the search tool; "
    "its results come back as tool responses. You can search as many times as you want. "
    "If you find no further external knowledge needed, give the answer by calling the `{answer_tool}` tool, "
    "without detailed illustrations (for example, Beijing). ",
)


#: The prompts this module has put tasks' questions in (`_SearchEnv` knows its tasks' prompts by
#: them): its own two, and any other a caller gave `hotpotqa_tasks(prompt=...)` in this process.
_PROMPTS: dict[str, None] = dict.fromkeys((SEARCH_R1_PROMPT, TOOL_CALL_PROMPT))


def _gold_titles(row: Mapping[str, Any]) -> list[str]:
    titles: list[str] = []
    for fact in row.get("supporting_facts", []):
        if fact and fact[0] not in titles:
            titles.append(str(fact[0]))
    return titles


def hotpotqa_tasks(path: str | Path | None = None, *, prompt: str = SEARCH_R1_PROMPT) -> list[Task]:
    """The HotpotQA questions as Tasks; gold titles, doc ids and supporting facts go in `context`.

    `question` is the dataset's question (what a judge or a reward reads); `prompt` is the text
    the model reads: the question in `prompt` (by default Search-R1's instructions).

    The bundled file is read once per prompt (every env a rollout worker makes shares its
    Tasks, as the SQL envs do); a file of your own is read on every call.
    """
    if path is None:
        return list(_bundled_tasks(prompt))
    return _read_tasks(Path(path), prompt)


@functools.lru_cache(maxsize=4)
def _bundled_tasks(prompt: str) -> tuple[Task, ...]:
    return tuple(_read_tasks(bundled_questions_path(), prompt))


def nq_open_tasks(*, prompt: str = SEARCH_R1_PROMPT) -> list[Task]:
    """NQ-open's 3,610 dev questions (Search-R1's other evaluation set) as Tasks, answers as aliases.

    The bundled corpus holds HotpotQA's paragraphs only, so these questions want a Wikipedia
    retriever: `make_hotpotqa_env(tasks=nq_open_tasks(), backend="http", backend_options={"url": ...})`
    against a Search-R1 retrieval server (e5 over its 2018 Wikipedia dump).
    """
    return list(_nq_open(prompt))


@functools.lru_cache(maxsize=4)
def _nq_open(prompt: str) -> tuple[Task, ...]:
    return tuple(_read_tasks(bundled_nq_open_path(), prompt))


def search_r1_question(question: str) -> str:
    """The question as Search-R1's data scripts put it in the prompt: stripped, ending with "?".

    NQ-open's questions have no question mark; Search-R1 adds one before `make_prefix`,
    so its checkpoints were trained and evaluated on the question with it.
    """
    question = question.strip()
    return question if not question or question.endswith("?") else question + "?"


def _in_prompt(prompt: str, question: str) -> str:
    """The env's prompt holding `question`, as Search-R1's data scripts put it there."""
    return prompt.format(question=search_r1_question(question))


def _read_tasks(src: Path, prompt: str) -> list[Task]:
    _PROMPTS[prompt] = None
    tasks = []
    with src.open(encoding="utf-8") as fh:
        for line in fh:
            if not line.strip():
                continue
            row = json.loads(line)
            tasks.append(
                Task(
                    id=str(row["id"]),
                    question=row["question"],
                    prompt=_in_prompt(prompt, row["question"]),
                    answer=list(row["answers"]),
                    context={
                        "question": row["question"],
                        "gold_titles": _gold_titles(row),
                        "gold_doc_ids": list(row.get("gold_doc_ids", [])),
                        "supporting_facts": row.get("supporting_facts", []),
                    },
                    metadata={"type": row.get("type"), "level": row.get("level")},
                )
            )
    return tasks


def _prepared(task: Task, prompt: str) -> Task:
    """A task of the user's own in the env's prompt, as the bundled ones are: its `prompt` the
    question in `prompt` (which says how to search and answer), its question kept, and copied to
    `context["question"]`. A task prepared already (`hotpotqa_tasks()`, `nq_open_tasks()`, or one
    saved when the prompt was put in `question`), or with a whole `prompt` of its own, is kept."""
    if task.prompt is not None or "question" in task.context:
        return task
    prepared = _in_prompt(prompt, task.question)
    return task.model_copy(update={"prompt": prepared, "context": {**task.context, "question": task.question}})


class _SearchEnv(ToolEnv):
    """The HotpotQA env: a `ToolEnv` that renders a task's Search-R1 `prompt` where its question goes.

    The tasks keep the question itself in `question` (for judges and rewards) and the question in
    the instructions in `prompt` (which TRL's rows read). A core `prompt` replaces the template;
    here it takes the question's place in it, so the model reads what it read when the prompt was
    the question: with `parser="hermes"`, the tool instructions, then this prompt. After a reset
    with `native_tools` (the agent gives the model the search tool itself), Search-R1's prompt
    becomes `TOOL_CALL_PROMPT`, which does not teach `<search>` tags.
    """

    def render_prompt(self, task: Task) -> tuple[str, list[Message]]:
        """The first observation of `task`; a prompt this module made goes where the template puts the question."""
        if task.prompt is not None and any(task.prompt == _in_prompt(p, task.question) for p in list(_PROMPTS)):
            prompt = task.prompt
            if self.native_tools and prompt == _in_prompt(SEARCH_R1_PROMPT, task.question):
                # The agent gives the model the search tool natively: `<search>` tags would teach a second call format.
                prompt = _in_prompt(TOOL_CALL_PROMPT, task.question)
            task = task.model_copy(update={"question": prompt, "prompt": None})
        return super().render_prompt(task)


class _Same:
    """A backend object as part of a cache key: equal only to itself.

    It holds the object, so the id is never that of a later backend (CPython reuses the
    ids of objects that are gone; a cache keyed by `id()` served the old one's passages).
    """

    __slots__ = ("obj",)

    def __init__(self, obj: object) -> None:
        self.obj = obj

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Same) and other.obj is self.obj

    def __hash__(self) -> int:
        return id(self.obj)


def _is_tags(parser: str | ActionParser) -> bool:
    return parser == "tags" or isinstance(parser, TagParser)


def make_hotpotqa_env(**overrides: Any) -> ToolEnv:
    """The HotpotQA env; every keyword is optional.

    Keywords of this env: `backend` (a `SearchBackend` or name; default the shared
    bundled BM25 index), `backend_options`, `topk` (3), `cache` (a `ResultCache`, or `True`
    or its settings for the process's cache of this backend, options and topk, shared by
    every task unless the settings say otherwise), `limit` (first N tasks),
    `tasks` (your own are put in the env's prompt as the bundled ones are, unless they have
    a `prompt` of their own or are already prepared), `reward` (`"exact_match"`, `"f1"`, or
    any spec), `invalid_action_penalty` (charged per parse error, call failed for its input
    (not for an outage) or empty turn) and `search_penalty` (per search call), both sizes of
    the core's per-turn penalties, default 0. The rest (`parser`, `max_turns`, `prompt_template`, ...) go to `ToolEnv`.
    """
    parser: str | ActionParser = overrides.pop("parser", "tags")
    tags = _is_tags(parser)
    backend: SearchBackend | str = overrides.pop("backend", "bm25")
    topk, options = overrides.pop("topk", 3), overrides.pop("backend_options", None)
    # Answers depend on the query, the backend and its options, and topk: not on the task.
    namespace = ("toolenv_search", backend if isinstance(backend, str) else _Same(backend), repr(options), topk)
    cache_spec = overrides.pop("cache", None)
    if isinstance(cache_spec, Mapping) or cache_spec is True:
        cache_spec = {"scope": "shared", **(cache_spec if isinstance(cache_spec, Mapping) else {})}
    tool = SearchTool(backend, topk=topk, backend_options=options, cache=shared_cache(namespace, cache_spec))
    given: Iterable[Any] | str | Path | None = overrides.pop("tasks", None)
    prompt = SEARCH_R1_PROMPT if tags else TOOL_CALL_PROMPT
    tasks = hotpotqa_tasks(prompt=prompt) if given is None else [_prepared(t, prompt) for t in load_tasks(given)]
    limit = overrides.pop("limit", None)
    if limit is not None:
        tasks = tasks[: int(limit)]
    reward = get_reward(overrides.pop("reward", "exact_match"))
    parts = dict(reward.parts)
    # The core's penalties carry their sign and size; they join the spec at weight 1.
    invalid = float(overrides.pop("invalid_action_penalty", 0.0))
    if invalid:
        parts["invalid_call_penalty"] = (InvalidCallPenalty(-abs(invalid)), 1.0)
    per_search = float(overrides.pop("search_penalty", 0.0))
    if per_search:
        parts["tool_call_penalty"] = (ToolCallPenalty(-abs(per_search)), 1.0)
    overrides.setdefault("prompt_template", "{question}" if tags else "{instructions}\n\n{question}")
    overrides.setdefault("max_turns", 5)
    overrides.setdefault("answer_tool_rewrites", ANSWER_TOOL_REWRITES)
    return _SearchEnv(tools=[tool], tasks=tasks, parser=parser, reward=WeightedSum(parts), **overrides)


def gold_query(task: Task) -> str:
    """A "gold passage query": the titles of the task's supporting facts (else the raw question)."""
    titles = task.context.get("gold_titles") or []
    return " ".join(titles) if titles else str(task.context.get("question", task.question))


def hotpotqa_oracle(task: Task, turn: int, observation: str) -> str:
    """Turn 0 searches the gold passages, turn 1 answers with the gold answer (tags format)."""
    if turn == 0:
        return f"<think> I will look up the supporting articles. </think><search> {gold_query(task)} </search>"
    answer = task.answers[0] if task.answers else ""
    return f"<think> The passages give the answer. </think><answer> {answer} </answer>"
