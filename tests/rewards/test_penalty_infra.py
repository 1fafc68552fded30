"""`invalid_call_penalty` charges the model's own faults, not a backend's outage.

A well-formed call whose server answered 5xx, could not be reached, timed out in the caller or
was refused by an open circuit is no invalid action: charging it skews the advantages of every
episode that ran during an outage and teaches the policy to stop calling tools.
"""

from __future__ import annotations

import asyncio
import http.server
import json
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

import toolenv
from toolenv import ToolResult, tool
from toolenv.breaker import reset_breakers
from toolenv.episode import Turn
from toolenv.rewards import InvalidCallPenalty, count_invalid
from toolenv.types import ParsedAction, ToolCall


@pytest.fixture(autouse=True)
def _closed_circuits() -> Iterator[None]:
    reset_breakers()
    yield
    reset_breakers()


def call(name: str, **args: Any) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': args})}</tool_call>"


@tool
def add(a: int, b: int) -> str:
    """Add two integers."""
    return str(a + b)


@tool
def busy(q: str) -> ToolResult:
    """A backend answering 503: the tool marks the failure retryable, as the search tool does."""
    return ToolResult.error(f"upstream answered HTTP 503 for {q!r}", retryable=True)


@tool(timeout=0.05)
async def stuck(q: str) -> str:
    """A backend that never answers: the caller's timeout ends the call."""
    await asyncio.sleep(30)
    return q


@tool(breaker_threshold=1, breaker_cooldown=600)
def down(q: str) -> ToolResult:
    """A backend that is down, behind a circuit breaker that opens after one failure."""
    return ToolResult.error("could not reach the server (ConnectError)", retryable=True)


@tool
def picky(q: str) -> ToolResult:
    """A tool that refuses its input: the model's fault (a SQL syntax error is one)."""
    return ToolResult.error(f"syntax error near {q!r}")


def steps(actions: list[str], reward: Any) -> list[tuple[float, dict[str, float], list[ToolResult]]]:
    env = toolenv.ToolEnv(
        tools=[add, busy, stuck, down, picky],
        tasks=[{"question": "2+3?", "answer": "5"}],
        reward=reward,
        max_turns=len(actions) + 1,
    )
    env.reset(seed=0)
    out = []
    try:
        for a in actions:
            _, r, _, _, info = env.step(a)
            out.append((float(r), info["reward_components"], info["tool_results"]))
    finally:
        env.close()
    return out


def test_infrastructure_failures_are_not_invalid_actions() -> None:
    out = steps(
        [call("busy", q="x"), call("stuck", q="x"), call("down", q="x"), call("down", q="x")],
        "invalid_call_penalty",
    )
    results = [r[2][0] for r in out]
    assert all(r.is_error for r in results)  # every call failed...
    assert "timed out" in results[1].text and results[3].metadata.get("circuit_open") is True
    assert [r[1]["invalid_call_penalty"] for r in out] == [0.0, 0.0, 0.0, 0.0]  # ...and none is the model's


def test_the_models_own_faults_are_still_charged() -> None:
    out = steps(
        [
            "<tool_call>{not json</tool_call>",  # parse error
            call("nope", q="x"),  # unknown tool
            call("add", a="x", b=1),  # arguments that fail validation
            call("picky", q="SELEC"),  # an error the tool puts on the input
            "just chatting",  # no action
        ],
        "invalid_call_penalty",
    )
    assert [r[1]["invalid_call_penalty"] for r in out] == [-1.0, -1.0, -1.0, -1.0, -1.0]


def test_a_turn_with_an_outage_and_a_fault_is_charged_for_the_fault_only() -> None:
    out = steps([call("busy", q="x") + call("nope") + call("add", a=1, b=2)], InvalidCallPenalty(-0.5))
    assert out[0][1]["invalid_call_penalty"] == -0.5


def test_infra_errors_true_charges_outages_too() -> None:
    out = steps([call("busy", q="x"), call("stuck", q="x")], InvalidCallPenalty(-1.0, infra_errors=True))
    assert [r[1]["invalid_call_penalty"] for r in out] == [-1.0, -1.0]


def _turn(*results: ToolResult) -> Turn:
    calls = [ToolCall(name="t", id=f"call_{i}") for i in range(len(results))]
    return Turn(action="...", parsed=ParsedAction(tool_calls=calls), results=list(results))


def test_count_invalid_tells_outages_from_faults() -> None:
    turn = _turn(
        ToolResult.error("HTTP 503", retryable=True),
        ToolResult.error("Tool 't' is unavailable: its last 5 calls failed", circuit_open=True),
        ToolResult.error("syntax error"),
        ToolResult(text="ok"),
    )
    assert count_invalid(turn) == 1
    assert count_invalid(turn, infra_errors=True) == 3
    assert count_invalid(turn, tool_errors=False, infra_errors=True) == 0


# -- end to end: the search tool over a real HTTP retriever on 127.0.0.1 -------------------------


class _Retriever(http.server.BaseHTTPRequestHandler):
    """Search-R1's `/retrieve`: HTTP 500 for a query containing FAIL, one passage otherwise."""

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if any("FAIL" in q for q in body["queries"]):
            self.send_response(500)
            self.end_headers()
            self.wfile.write(b"index shard offline")
            return
        doc = {"document": {"contents": '"Paris"\nParis is the capital of France.'}, "score": 1.0}
        data = json.dumps({"result": [[doc] for _ in body["queries"]]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def retriever() -> Iterator[http.server.ThreadingHTTPServer]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Retriever)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def test_hotpotqa_charges_no_invalid_action_for_a_retriever_outage(
    retriever: http.server.ThreadingHTTPServer,
) -> None:
    pytest.importorskip("toolenv_search")
    import gymnasium as gym

    url = f"http://127.0.0.1:{retriever.server_address[1]}/retrieve"
    env = gym.make(
        "toolenv/HotpotQA-v0",
        backend="http",
        backend_options={"url": url, "retries": 0},
        tasks=[{"id": "q1", "question": "What is the capital of France?", "answer": "Paris"}],
        invalid_action_penalty=0.1,
        max_turns=10,
        tool_limits={"search": {"breaker_threshold": 2, "breaker_cooldown": 600}},
    )
    try:
        env.reset(options={"task_id": "q1"})
        comps = []
        for query in ["capital", "FAIL one", "FAIL two", "capital"]:  # ok, 500, 500, refused (circuit open)
            obs, _, _, _, info = env.step(f"<search> {query} </search>")
            comps.append(info["reward_components"]["invalid_call_penalty"])
        assert "unavailable" in obs
        retriever.shutdown()
        retriever.server_close()
        reset_breakers()
        obs, _, _, _, info = env.step("<search> capital </search>")  # nothing listens: connection refused
        assert "could not reach" in obs
        comps.append(info["reward_components"]["invalid_call_penalty"])
        assert comps == [0.0] * 5
        _, _, _, _, info = env.step("<search> capital")  # unclosed tag: the model's own fault
        assert info["reward_components"]["invalid_call_penalty"] == pytest.approx(-0.1)
    finally:
        env.close()


# -- the SQL tool: an error in the model's query is the model's ---------------------------------


def test_a_sql_error_in_the_models_query_is_charged(tmp_path: Path) -> None:
    pytest.importorskip("toolenv_sql")
    from toolenv_sql.tool import SQLTool

    db = tmp_path / "t.sqlite"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE singer (name TEXT)")
        conn.execute("INSERT INTO singer VALUES ('Ann')")
    conn.close()
    env = toolenv.ToolEnv(
        tools=[SQLTool(root=tmp_path)],
        tasks=[{"question": "How many singers?", "answer": "1", "context": {"db_path": "t.sqlite"}}],
        parser="tags",
        reward="invalid_call_penalty",
        max_turns=4,
    )
    try:
        env.reset(seed=0)
        _, _, _, _, ok = env.step("<sql>SELECT count(*) FROM singer</sql>")
        _, _, _, _, bad = env.step("<sql>SELEC count(*) FRM singer</sql>")
        _, _, _, _, missing = env.step("<sql>SELECT * FROM no_such_table</sql>")
    finally:
        env.close()
    assert ok["reward_components"]["invalid_call_penalty"] == 0.0
    assert bad["tool_results"][0].is_error and bad["reward_components"]["invalid_call_penalty"] == -1.0
    assert missing["tool_results"][0].is_error and missing["reward_components"]["invalid_call_penalty"] == -1.0


# -- errors a tool marks as its own or the task's (`infra_error`) --------------------------------


@tool
def broken_backend(q: str) -> ToolResult:
    """A tool whose backend refuses for its own reason, not the input's, and says so."""
    return ToolResult.error("the index failed to load", infra_error=True)


class _WrongType(toolenv.Tool):
    """A tool with a bug: it returns a string, not a ToolResult."""

    name = "wrong_type"

    class Args(BaseModel):
        pass

    async def run(self, args: Any, ctx: toolenv.ToolContext) -> Any:
        return "not a result"


def test_an_error_the_tool_marks_infra_is_not_charged() -> None:
    env = toolenv.ToolEnv(
        tools=[broken_backend, _WrongType(), picky],
        tasks=[{"question": "2+3?", "answer": "5"}],
        reward="invalid_call_penalty",
        max_turns=5,
    )
    try:
        env.reset(seed=0)
        comps, results = [], []
        for action in [call("broken_backend", q="x"), call("wrong_type"), call("picky", q="x")]:
            _, _, _, _, info = env.step(action)
            comps.append(info["reward_components"]["invalid_call_penalty"])
            results.append(info["tool_results"][0])
    finally:
        env.close()
    assert all(r.is_error for r in results)
    assert "a bug in the tool" in results[1].text and results[1].metadata["infra_error"] is True
    assert comps == [0.0, 0.0, -1.0]  # the backend's and the tool's faults free; the bad input charged


def test_infra_errors_true_charges_an_infra_marked_error() -> None:
    out = steps([call("down", q="x")], InvalidCallPenalty(-1.0, infra_errors=True))
    assert out[0][1]["invalid_call_penalty"] == -1.0
    env = toolenv.ToolEnv(
        tools=[broken_backend],
        tasks=[{"question": "q", "answer": "a"}],
        reward=InvalidCallPenalty(-1.0, infra_errors=True),
        max_turns=3,
    )
    try:
        env.reset(seed=0)
        _, _, _, _, info = env.step(call("broken_backend", q="x"))
    finally:
        env.close()
    assert info["reward_components"]["invalid_call_penalty"] == -1.0


def test_a_task_whose_database_is_missing_is_not_charged(tmp_path: Path) -> None:
    pytest.importorskip("toolenv_sql")
    from toolenv_sql.tool import SQLTool

    env = toolenv.ToolEnv(
        tools=[SQLTool(root=tmp_path)],
        tasks=[{"question": "How many singers?", "answer": "1", "context": {"db_path": "gone.sqlite"}}],
        parser="tags",
        reward="invalid_call_penalty",
        max_turns=4,
    )
    try:
        env.reset(seed=0)
        _, _, _, _, info = env.step("<sql>SELECT count(*) FROM singer</sql>")
    finally:
        env.close()
    result = info["tool_results"][0]
    assert result.is_error and "does not exist" in result.text
    assert result.metadata.get("infra_error") is True
    assert info["reward_components"]["invalid_call_penalty"] == 0.0


def test_a_task_image_that_cannot_be_opened_is_not_charged(tmp_path: Path) -> None:
    pytest.importorskip("toolenv_vision")
    from toolenv_vision.crop import CropTool

    (tmp_path / "broken.png").write_bytes(b"not a png")
    env = toolenv.ToolEnv(
        tools=[CropTool(image_root=tmp_path)],
        tasks=[{"question": "What is it?", "answer": "cat", "context": {"image": "broken.png"}}],
        reward="invalid_call_penalty",
        max_turns=4,
    )
    try:
        env.reset(seed=0)
        _, _, _, _, info = env.step(call("crop", bbox=[0, 0, 10, 10]))
    finally:
        env.close()
    result = info["tool_results"][0]
    assert result.is_error and "Cannot open the task image" in result.text
    assert result.metadata.get("infra_error") is True
    assert info["reward_components"]["invalid_call_penalty"] == 0.0
