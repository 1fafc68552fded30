"""`task.question` of the HotpotQA and NQ-open tasks is the question itself; the Search-R1
instructions are the task's rendered `prompt`, and the model reads exactly the text it read when
they lived in `question` (text and chat forms, tags and hermes, TRL rows)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from toolenv import Task
from toolenv.integrations.trl import dataset_rows
from toolenv.rewards import LLMJudge
from toolenv_search.corpus import bundled_questions_path
from toolenv_search.envs import (
    SEARCH_R1_PROMPT,
    TOOL_CALL_PROMPT,
    hotpotqa_tasks,
    make_hotpotqa_env,
    nq_open_tasks,
    search_r1_question,
)


def _dataset_questions() -> dict[str, str]:
    with bundled_questions_path().open(encoding="utf-8") as fh:
        return {str(r["id"]): r["question"] for r in map(json.loads, filter(str.strip, fh))}


def _expected(parser: str, prompt: str, question: str, instructions: str) -> tuple[str, str]:
    """(text, chat user message) as the env rendered them when the prompt was the task's question:
    tags, the prompt alone; hermes, the tool instructions, a blank line, then the prompt."""
    rendered = prompt.format(question=search_r1_question(question))
    if parser == "tags":
        return rendered, rendered
    return f"{instructions}\n\n{rendered}", rendered.strip()


def test_bundled_and_nq_questions_are_the_questions_themselves() -> None:
    dataset = _dataset_questions()
    tasks = hotpotqa_tasks()
    assert [t.question for t in tasks] == [dataset[t.id] for t in tasks]
    assert all(t.question == t.context["question"] for t in tasks)
    assert not any("Answer the given question" in t.question for t in tasks)
    moon = nq_open_tasks()[0]
    assert moon.question == "when was the last time anyone was on the moon"
    assert moon.prompt == SEARCH_R1_PROMPT.format(question="when was the last time anyone was on the moon?")


def test_a_users_task_keeps_its_question() -> None:
    env = make_hotpotqa_env(tasks=[{"question": "  capital of France ", "answer": "Paris"}])
    obs, _ = env.reset()
    assert env.episode is not None and env.episode.task.question == "  capital of France "
    assert obs == SEARCH_R1_PROMPT.format(question="capital of France?")
    env.close()


@pytest.mark.parametrize("parser", ["tags", "hermes"])
@pytest.mark.parametrize("native", [False, True])
@pytest.mark.parametrize(
    "prompt",
    [SEARCH_R1_PROMPT, TOOL_CALL_PROMPT, "Mine. Question: {question}\n"],
    ids=["search_r1", "tool_call", "own"],
)
def test_the_model_reads_the_same_text_byte_for_byte(parser: str, native: bool, prompt: str) -> None:
    """Whichever prompt the tasks were made with, in either parser's env (a task made for one
    and run in the other keeps its own prompt, as before), but Search-R1's under `native_tools`,
    which reads as the tool-calling one (no `<search>` tags beside the API's tools)."""
    tasks = [*hotpotqa_tasks(prompt=prompt)[:20], *nq_open_tasks(prompt=prompt)[:20]]
    env = make_hotpotqa_env(parser=parser, tasks=tasks)
    read = TOOL_CALL_PROMPT if native and prompt == SEARCH_R1_PROMPT else prompt
    for task in env.tasks:
        obs, info = env.reset(options={"task_id": task.id, "native_tools": native})
        system = env.parser.answer_instructions() if native else env.parser.instructions(env.tools)
        text, user = _expected(parser, read, task.context["question"], system)
        assert obs == text
        assert [(m.role, m.content) for m in info["messages"]] == [("system", system), ("user", user)]
    env.close()


def test_a_task_prepared_the_old_way_still_reads_the_same() -> None:
    """Tasks saved before (the prompt in `question`, e.g. in a verl parquet or a TRL row) render as then."""
    for parser in ("tags", "hermes"):
        env = make_hotpotqa_env(parser=parser, limit=1)
        old_prompt = (SEARCH_R1_PROMPT if parser == "tags" else TOOL_CALL_PROMPT).format(
            question=search_r1_question(env.tasks[0].context["question"])
        )
        old = Task(id="old", question=old_prompt, answer="x", context={"question": env.tasks[0].context["question"]})
        new_obs, new_info = env.reset(options={"task_index": 0})
        old_obs, old_info = env.reset(options={"task": old})
        assert old_obs == new_obs and old_info["messages"] == new_info["messages"]
        env.close()


@pytest.mark.parametrize("parser", ["tags", "hermes"])
def test_trl_rows_keep_the_instructions(parser: str) -> None:
    """TRL builds its rows from the task's prompt (its chat template shows the tools)."""
    rows = dataset_rows(lambda: make_hotpotqa_env(parser=parser, limit=3), answer_tool=None)
    for row in rows:
        task = json.loads(row["task"])
        prompt = SEARCH_R1_PROMPT if parser == "tags" else TOOL_CALL_PROMPT
        question = search_r1_question(task["context"]["question"])
        assert row["prompt"][-1] == {"role": "user", "content": prompt.format(question=question)}


@pytest.fixture
def judge_server() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """A real OpenAI-style judge on 127.0.0.1 that answers "yes" and keeps every request."""
    seen: list[dict[str, Any]] = []

    class Judge(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            seen.append(json.loads(self.rfile.read(int(self.headers["content-length"]))))
            body = json.dumps({"choices": [{"message": {"role": "assistant", "content": "yes"}}]}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Judge)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1", seen
    finally:
        server.shutdown()
        server.server_close()


def test_llm_judge_is_asked_about_the_question_not_the_instructions(
    judge_server: tuple[str, list[dict[str, Any]]],
) -> None:
    url, seen = judge_server
    judge = LLMJudge(base_url=url, model="j", api_key_env=None)
    env = make_hotpotqa_env(reward=[(judge, 1.0)])
    env.reset(options={"task_id": "5a7613c15542994ccc9186bf"})
    env.step("<answer>GmbH</answer>")
    env.close()
    asked = seen[0]["messages"][-1]["content"]
    assert "VIVA Media AG changed it's name in 2004. What does their new acronym stand for?" in asked
    assert "Answer the given question" not in asked and "<search>" not in asked
