"""Model text holding lone UTF-16 surrogates (half an emoji a server cut; JSON `"\\ud83d"` decodes
to one) is made encodable where it enters the env, so no parser, tool or agent meets a string
UTF-8 cannot encode (httpx, for one, sends JSON as UTF-8 and raised UnicodeEncodeError)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import gymnasium as gym
import pytest
from pydantic import BaseModel

import toolenv
from toolenv.env import ToolEnv
from toolenv.types import ParsedAction, ToolCall

LONE = "\udcff"  # what json.loads("\"\\udcff\"") gives: no UTF-8 encoding exists
HALF_EMOJI = "\ud83d"  # the first half of a surrogate pair, its second half cut off


class Echo(toolenv.Tool):
    """Say the query back (and keep what it was given)."""

    name = "echo"

    class Args(BaseModel):
        q: str

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    async def run(self, args: Args, ctx: toolenv.ToolContext) -> toolenv.ToolResult:  # type: ignore[override]
        self.seen.append(args.q)
        return toolenv.ToolResult(text=f"you said {args.q}")


def make(tool: Echo, parser: str = "hermes") -> ToolEnv:
    return ToolEnv(tools=[tool], tasks=[{"id": "t", "question": "q?", "answer": "\ufffd2004"}], parser=parser)


def encodable(value: Any) -> bool:
    """True when every string in `value` (a message, a parsed action, JSON data) encodes as UTF-8."""
    try:
        json.dumps(_plain(value), ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _plain(value: Any) -> Any:
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        return dump(mode="python")
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def call(q: str) -> str:
    return '<tool_call>{"name": "echo", "arguments": {"q": "' + q + '"}}</tool_call>'


@pytest.mark.parametrize(
    ("query", "seen"),
    [
        (f"caf\u00e9 {LONE}{HALF_EMOJI} x", "caf\u00e9 \ufffd\ufffd x"),  # the surrogates in the text itself
        ("caf\\u00e9 \\udcff x", "caf\u00e9 \ufffd x"),  # escaped in the call's JSON: ASCII text, decoded by the parser
    ],
)
def test_a_lone_surrogate_in_a_call_reaches_the_tool_and_the_turn_as_u_fffd(query: str, seen: str) -> None:
    tool = Echo()
    env = make(tool)
    env.reset(seed=0)
    obs, _, _, _, info = env.step("I look " + call(query))
    assert tool.seen == [seen]
    assert obs.encode("utf-8") and encodable(info["messages"]) and encodable(info["action"])
    assert env.episode is not None
    turn = env.episode.turns[0]
    assert turn.action.encode("utf-8") and encodable(turn.parsed) and encodable(env.episode.messages)
    env.close()


async def test_astep_cleans_the_answer_and_the_text_outside_calls() -> None:
    env = make(Echo())
    await env.areset(seed=0)
    _, reward, terminated, _, info = await env.astep(f"thinking {LONE}<answer>{LONE}2004</answer>")
    assert terminated and info["answer"] == "\ufffd2004" and reward == 1.0
    assert env.episode is not None and env.episode.turns[0].action == "thinking \ufffd<answer>\ufffd2004</answer>"
    assert encodable(env.episode.messages)
    await env.aclose()


async def test_a_turn_parsed_elsewhere_is_cleaned_too() -> None:
    """`astep(text, parsed=...)`: the calls a trainer's parser read reach the tools clean, and the
    arguments given as JSON text (verl's) decoded with an escaped half emoji too."""
    tool = Echo()
    env = make(tool)
    await env.areset(seed=0)
    parsed = ParsedAction(
        tool_calls=[
            ToolCall(name="echo", arguments={"q": f"a{LONE}"}, id="c1"),
            ToolCall(name="echo", arguments='{"q": "b\\ud83d"}', id="c2"),  # type: ignore[arg-type]
        ],
        text=f"t{LONE}",
    )
    obs, _, _, _, info = await env.astep(f"t{LONE}", parsed=parsed)
    assert tool.seen == ["a\ufffd", "b\ufffd"]
    assert encodable(info["action"]) and encodable(info["messages"]) and obs.encode("utf-8")
    assert info["action"].text == "t\ufffd"
    await env.aclose()


def test_text_utf_8_can_encode_is_kept_as_the_same_object() -> None:
    """The fast path: ASCII and ordinary non-ASCII text (a surrogate pair joined, as JSON decodes
    it) are neither copied nor walked into a new parsed action."""
    env = make(Echo())
    for action in ("<answer>2004</answer>", "<answer>caf\u00e9 \U0001f600 2004</answer>"):
        env.reset(seed=0)
        parsed = ParsedAction(answer="2004")
        env.step(action, parsed=parsed)
        assert env.episode is not None
        assert env.episode.turns[0].action is action and env.episode.turns[0].parsed is parsed
    env.close()


# ------------------------------------------------------------------ the search plugin's HTTP backend
class Retriever:
    """A Search-R1 `/retrieve` server on 127.0.0.1 that answers every query with one passage."""

    def __init__(self) -> None:
        self.queries: list[str] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.queries.extend(body["queries"])
                result = [[{"document": {"id": "1", "contents": '"Jaclyn Stapp"\nMarried in 2004.'}, "score": 1.0}]]
                payload = json.dumps({"result": result * len(body["queries"])}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()


@pytest.fixture
def retriever() -> Iterator[Retriever]:
    r = Retriever()
    yield r
    r.httpd.shutdown()
    r.httpd.server_close()


def test_hotpotqa_http_search_gets_the_query_with_u_fffd(retriever: Retriever) -> None:
    """The reviewer's case: `<search>` with half an emoji went to the retriever as a UTF-8 body
    httpx could not encode ("Tool 'search' failed: UnicodeEncodeError")."""
    pytest.importorskip("toolenv_search")
    env = gym.make(
        "toolenv/HotpotQA-v0",
        backend="http",
        backend_options={"url": retriever.url, "retries": 0},
        tasks=[{"id": "s1", "question": "Jaclyn Stapp married when?", "answer": "2004"}],
    ).unwrapped
    env.reset(seed=0)
    obs, _, _, _, info = env.step(f"<search>{LONE}{HALF_EMOJI} caf\u00e9 Jaclyn Stapp</search>")
    assert retriever.queries == ["\ufffd\ufffd caf\u00e9 Jaclyn Stapp"]
    assert not info["tool_results"][0].is_error and "Married in 2004." in obs
    env.close()


async def test_a_remote_env_records_the_turn_as_a_local_one_does() -> None:
    """The remote client's own record of a turn holds U+FFFD too, as the server's env and a local
    env do: a reward or report reading the client's episode meets no lone surrogate."""
    pytest.importorskip("starlette", reason="the env server needs the serve extra: pip install 'toolenv[serve]'")
    pytest.importorskip("uvicorn", reason="the env server needs the serve extra: pip install 'toolenv[serve]'")
    from _remote import make_env, serving

    from toolenv.remote import RemoteToolEnv

    with serving(make_env) as u:
        env = RemoteToolEnv(u)
        try:
            await env.areset(options={"task_id": "t1"})
            _, _, term, _, info = await env.astep(f"I am sure {HALF_EMOJI} <answer>5</answer>")
            assert term and info["action"].text == "I am sure \ufffd"
            assert env.episode is not None and env.episode.turns[-1].action == "I am sure \ufffd <answer>5</answer>"
        finally:
            await env.aclose()


class Undecodable(toolenv.Tool):
    """Output bytes that are not UTF-8, decoded as a subprocess reader may (`surrogateescape`)."""

    name = "bytes"

    class Args(BaseModel):
        fail: bool = False

    async def run(self, args: Args, ctx: toolenv.ToolContext) -> toolenv.ToolResult:  # type: ignore[override]
        text = b"caf\xe9 \xff".decode("utf-8", "surrogateescape")
        if args.fail:
            raise RuntimeError(text)
        return toolenv.ToolResult(text=text)


@pytest.mark.parametrize(("fail", "seen"), [(False, "caf\ufffd \ufffd"), (True, "RuntimeError: caf\ufffd \ufffd")])
def test_tool_output_utf_8_cannot_hold_reaches_the_model_as_u_fffd(fail: bool, seen: str) -> None:
    env = ToolEnv(tools=[Undecodable()], tasks=[{"id": "t", "question": "q", "answer": "a"}])
    env.reset(seed=0)
    call = json.dumps({"name": "bytes", "arguments": {"fail": fail}})
    obs, _, _, _, info = env.step(f"<tool_call>{call}</tool_call>")
    assert seen in obs and seen in info["tool_results"][0].text
    assert all(not m.content or seen in m.content for m in info["messages"][1:])
    obs.encode("utf-8")  # what an agent sends on, and a trajectory file holds
    env.close()
