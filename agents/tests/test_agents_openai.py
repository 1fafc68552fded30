"""The `openai` agent against a real OpenAI-compatible HTTP server on 127.0.0.1 (scripted replies)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from _tools import Add
from pydantic import BaseModel

import toolenv
from toolenv.parsers import get_parser
from toolenv.runner import arollout
from toolenv_agents.openai_compat import OpenAIAgent, render_tool_calls

SECRET = "sk-test-very-secret-0123456789"


class Server:
    """Pops one scripted reply per request.

    Steps: ("json", status, obj, headers) | ("raw", status, bytes) | ("sleep", seconds, obj).
    """

    def __init__(self) -> None:
        self.script: list[tuple[Any, ...]] = []
        self.requests: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with outer.lock:
                    outer.requests.append({"path": self.path, "auth": self.headers.get("Authorization"), "body": body})
                    step = outer.script.pop(0) if outer.script else ("json", 500, {"error": "script empty"}, {})
                kind = step[0]
                if kind == "sleep":
                    time.sleep(step[1])
                    step = ("json", 200, step[2], {})
                    kind = "json"
                payload = json.dumps(step[2]).encode() if kind == "json" else step[2]
                self.send_response(step[1])
                for k, v in (step[3] if kind == "json" else {}).items():
                    self.send_header(k, v)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()


@pytest.fixture
def server() -> Iterator[Server]:
    s = Server()
    yield s
    s.httpd.shutdown()
    s.httpd.server_close()


def chat(content: str | None = None, tool_calls: list[dict[str, Any]] | None = None, **choice: Any) -> dict[str, Any]:
    msg: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls:
        msg["tool_calls"] = tool_calls
    return {
        "choices": [{"index": 0, "message": msg, "finish_reason": "stop", **choice}],
        "usage": {"prompt_tokens": 50, "completion_tokens": 7},
    }


def call(name: str, args: dict[str, Any], cid: str) -> dict[str, Any]:
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


def make_env(parser: str = "hermes") -> toolenv.ToolEnv:
    return toolenv.ToolEnv(tools=[Add()], tasks=[{"id": "t1", "question": "2+3?", "answer": "5"}], parser=parser)


def agent(server: Server, **kw: Any) -> OpenAIAgent:
    kw.setdefault("backoff", 0.01)
    return OpenAIAgent(model="tiny", base_url=server.url, **kw)


async def test_native_tool_calling_end_to_end(server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    server.script = [
        ("json", 200, chat("Let me add.", [call("add", {"a": 2, "b": 3}, "srv_1")]), {}),
        ("json", 200, chat("<answer>5</answer>"), {}),
    ]
    res = await arollout(make_env, agent(server), n=1)
    traj = res.trajectories[0]
    assert traj.error is None and traj.reward == 1.0 and traj.turns[0].results[0].text == "5"
    assert traj.turns[0].parsed.tool_calls[0].id == "srv_1"
    assert traj.turns[0].completion_tokens == 7 and traj.prompt_tokens() == 100
    first, second = (r["body"] for r in server.requests)
    assert first["tools"][0]["function"]["name"] == "add" and first["model"] == "tiny"
    assert server.requests[0]["auth"] == f"Bearer {SECRET}"
    # The second request answers the call by id with the tool result, and keeps the model's own content.
    msgs = second["messages"]
    assistant = next(m for m in msgs if m["role"] == "assistant")
    assert assistant["content"] == "Let me add." and assistant["tool_calls"][0]["id"] == "srv_1"
    assert {"role": "tool", "tool_call_id": "srv_1", "content": "5"} in msgs
    assert SECRET not in traj.model_dump_json() and SECRET not in repr(agent(server))
    # The tools go out as `tools` only: the system message says how to answer, not the tools again.
    system = first["messages"][0]
    assert system["role"] == "system" and '"name": "add"' not in system["content"]
    assert system["content"] == make_env().parser.answer_instructions()
    assert traj.prompt_messages[0].content == system["content"]  # the trajectory holds what was sent


async def test_text_mode_prompts_describe_the_tools(server: Server) -> None:
    done = {"choices": [{"index": 0, "text": "<answer>5</answer>", "finish_reason": "stop"}]}
    server.script = [("json", 200, chat("<answer>5</answer>"), {}), ("json", 200, done, {})]
    await arollout(make_env, agent(server, tool_calling="text"), n=1)
    await arollout(make_env, agent(server, api="completions"), n=1)
    assert [r["path"] for r in server.requests] == ["/v1/chat/completions", "/v1/completions"]
    chat_body, completions_body = (r["body"] for r in server.requests)
    assert "tools" not in chat_body and '"name": "add"' in chat_body["messages"][0]["content"]
    assert '"name": "add"' in completions_body["prompt"]


async def test_retries_429_500_and_malformed_json(server: Server) -> None:
    server.script = [
        ("json", 429, {"error": "slow down"}, {"Retry-After": "0"}),
        ("json", 500, {"error": "boom"}, {}),
        ("raw", 200, b"{not json"),
        ("json", 200, chat("<answer>5</answer>"), {}),
    ]
    res = await arollout(make_env, agent(server, max_retries=3), n=1)
    traj = res.trajectories[0]
    assert traj.error is None and traj.reward == 1.0
    assert traj.turns[0].agent_metadata["attempts"] == 4 and len(server.requests) == 4


async def test_gives_up_and_records_error_without_key(server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    server.script = [("json", 503, {"error": f"echo {SECRET}"}, {})] * 3
    res = await arollout(make_env, agent(server, max_retries=2), n=1)
    err = res.trajectories[0].error or ""
    assert "failed after 3 attempt(s)" in err and "HTTP 503" in err and SECRET not in err


async def test_client_error_is_not_retried(server: Server) -> None:
    server.script = [("json", 400, {"error": "bad model"}, {})]
    res = await arollout(make_env, agent(server), n=1)
    assert "HTTP 400" in (res.trajectories[0].error or "") and len(server.requests) == 1


async def test_slow_reply_times_out_then_retries(server: Server) -> None:
    server.script = [("sleep", 1.5, chat("<answer>5</answer>")), ("json", 200, chat("<answer>5</answer>"), {})]
    res = await arollout(make_env, agent(server, timeout=0.5, max_retries=1), n=1)
    traj = res.trajectories[0]
    assert traj.error is None and traj.reward == 1.0 and traj.turns[0].agent_metadata["attempts"] == 2


async def test_server_down_is_an_episode_error() -> None:
    a = OpenAIAgent(model="m", base_url="http://127.0.0.1:9/v1", max_retries=1, backoff=0.01, connect_timeout=1)
    res = await arollout(make_env, a, n=1)
    assert "connection failed" in (res.trajectories[0].error or "")


async def test_concurrency_cap(server: Server) -> None:
    tasks = [{"id": f"t{i}", "question": "2+3?", "answer": "5"} for i in range(6)]
    server.script = [("sleep", 0.3, chat("<answer>5</answer>"))] * 6
    start = time.perf_counter()
    res = await arollout(lambda: make_env(), agent(server, max_concurrency=2), tasks=tasks, concurrency=6)
    assert res.summary.success_rate == 1.0
    assert time.perf_counter() - start >= 0.85  # 6 requests, 2 at a time, 0.3 s each


async def test_text_chat_and_completions_modes(server: Server) -> None:
    server.script = [
        (
            "json",
            200,
            chat('<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}', stop_reason="</tool_call>"),
            {},
        ),
        ("json", 200, chat("<answer>5</answer>"), {}),
    ]
    res = await arollout(make_env, agent(server, tool_calling="text"), n=1)
    assert res.trajectories[0].reward == 1.0
    body = server.requests[1]["body"]
    assert "stop" not in body and "tools" not in body  # Hermes's per-call close: not a stop in chat (parallel calls)
    assert body["messages"][-1]["role"] == "user" and "<tool_response>" in body["messages"][-1]["content"]
    server.requests.clear()
    server.script = [
        (
            "json",
            200,
            {
                "choices": [
                    {
                        "text": '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}',
                        "finish_reason": "stop",
                        "stop_reason": "</tool_call>",
                    }
                ]
            },
            {},
        ),
        ("json", 200, {"choices": [{"text": " <answer>5</answer>", "finish_reason": "stop"}]}, {}),
    ]
    res = await arollout(make_env, agent(server, api="completions"), n=1)
    assert res.trajectories[0].reward == 1.0 and server.requests[0]["path"] == "/v1/completions"
    prompt = server.requests[1]["body"]["prompt"]
    assert prompt.startswith(res.trajectories[0].prompt) and "</tool_call>\n<tool_response>\n5" in prompt


class Lookup(toolenv.Tool):
    """Look a word up."""

    name = "search"

    class Args(BaseModel):
        query: str

    async def run(self, args: Args, ctx: toolenv.ToolContext) -> toolenv.ToolResult:  # type: ignore[override]
        return toolenv.ToolResult(text=f'Doc 1(Title: "{args.query}") five')


async def test_completions_mode_continues_the_text_as_search_r1_does(server: Server) -> None:
    """With the tags format the observation is appended as Search-R1's trainer appends it,
    `\n\n<information>...</information>\n\n`: the tokens its checkpoints were trained on."""

    def env() -> toolenv.ToolEnv:
        return toolenv.ToolEnv(tools=[Lookup()], tasks=[{"question": "2+3?", "answer": "5"}], parser="tags")

    first = "<think> look it up </think><search> five </search>"
    server.script = [
        (
            "json",
            200,
            {"choices": [{"text": first[: -len("</search>")], "finish_reason": "stop", "stop_reason": "</search>"}]},
            {},
        ),
        ("json", 200, {"choices": [{"text": "<answer> 5 </answer>", "finish_reason": "stop"}]}, {}),
    ]
    res = await arollout(env, agent(server, api="completions"), n=1)
    assert res.trajectories[0].reward == 1.0
    prompt = server.requests[1]["body"]["prompt"]
    assert prompt == res.trajectories[0].prompt + first + '\n\n<information>Doc 1(Title: "five") five</information>\n\n'


def test_render_tool_calls_for_each_parser() -> None:
    calls = [{"name": "search", "arguments": {"query": "paris"}, "id": "c1"}]
    assert render_tool_calls("", calls, get_parser("tags")) == "<search>paris</search>"
    code = [{"name": "python", "arguments": {"code": "print(1)"}, "id": "c1"}]
    assert render_tool_calls("", code, get_parser("codeblock")) == "```python\nprint(1)\n```"
    parsed = get_parser("hermes").parse(render_tool_calls("hi", calls, get_parser("hermes")))
    assert parsed.tool_calls[0].arguments == {"query": "paris"} and parsed.tool_calls[0].id == "c1"
    two = [*calls, {"name": "add", "arguments": {"a": 1, "b": 2}, "id": "c2"}]
    harmony = render_tool_calls("", two, get_parser("harmony"))
    assert harmony.count("<|call|>") == 2 and "<tool_call>" not in harmony
    assert [(c.name, c.arguments) for c in get_parser("harmony").parse(harmony).tool_calls] == [
        ("search", {"query": "paris"}),
        ("add", {"a": 1, "b": 2}),
    ]
    # A call the tag format cannot write falls back to a Hermes block.
    assert render_tool_calls("", two, get_parser("tags")).endswith("</tool_call>")


@toolenv.tool(name="search")
def _search(query: str, k: int) -> str:
    """Search."""
    return query * k


@toolenv.tool(name="add")
def _add(a: int, b: list[int]) -> str:
    """Add."""
    return str(a + sum(b))


@pytest.mark.parametrize(
    "spec",
    [
        "hermes",
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
    ],
)
def test_native_calls_rendered_in_a_model_format_parse_back(spec: str) -> None:
    """A server's native calls (two, after some text) written in the env's format are read back
    by that format's parser as the same calls, in order."""
    two = [
        {"name": "search", "arguments": {"query": "paris", "k": 2}, "id": "abcdefghi"},
        {"name": "add", "arguments": {"a": 1, "b": [2, 3]}, "id": "bcdefghij"},
    ]
    parser = get_parser(spec).bind([_search, _add])  # bound, as an env binds it (Qwen3-XML reads types)
    text = render_tool_calls("Let me check.", two, parser)
    assert "<tool_call>" not in text or spec in ("hermes", "qwen3_xml", "glm45")  # no Hermes fallback
    action = parser.parse(text)
    assert action.errors == []
    assert [(c.name, c.arguments) for c in action.tool_calls] == [(c["name"], c["arguments"]) for c in two]


async def test_completions_mode_asks_for_and_keeps_token_ids(server: Server) -> None:
    """`return_token_ids` and `logprobs` work in completions mode as in chat mode."""
    server.script = [
        (
            "json",
            200,
            {
                "choices": [
                    {
                        "text": "<answer>5</answer>",
                        "finish_reason": "stop",
                        "token_ids": [11, 12, 13],
                        "prompt_token_ids": [1, 2, 3, 4],
                        "logprobs": {"tokens": ["a", "b", "c"], "token_logprobs": [-0.5, -0.25, -0.125]},
                    }
                ],
                "usage": {"prompt_tokens": 20, "completion_tokens": 3},
            },
            {},
        )
    ]
    res = await arollout(make_env, agent(server, api="completions", return_token_ids=True, logprobs=True), n=1)
    turn = res.trajectories[0].turns[0]
    body = server.requests[0]["body"]
    assert body["return_token_ids"] is True and body["logprobs"] == 1
    assert turn.token_ids == [11, 12, 13] and turn.logprobs == [-0.5, -0.25, -0.125]
    assert turn.prompt_token_ids == [1, 2, 3, 4]  # vLLM's prompt ids, on the choice in completions


async def test_chat_mode_keeps_the_prompt_token_ids_vllm_returns(server: Server) -> None:
    """vLLM (`return_token_ids`) puts the prompt's ids on a chat response, the reply's on its choice:
    each turn records both, as the server rendered and generated them."""
    reply = chat("<answer>5</answer>", token_ids=[7, 8])
    reply["prompt_token_ids"] = [100, 101, 102]
    server.script = [("json", 200, reply, {})]
    res = await arollout(make_env, agent(server, return_token_ids=True), n=1)
    turn = res.trajectories[0].turns[0]
    assert server.requests[0]["body"]["return_token_ids"] is True
    assert turn.prompt_token_ids == [100, 101, 102] and turn.token_ids == [7, 8]


@pytest.mark.parametrize("api", ["chat", "completions"])
async def test_text_modes_keep_special_tokens_for_formats_written_in_them(server: Server, api: str) -> None:
    """A format made of special tokens (Mistral's `[TOOL_CALLS]`) reaches the env only if the
    server does not skip them (vLLM and SGLang skip them by default); other formats leave the
    server's default alone."""
    reply = '[TOOL_CALLS]add[ARGS]{"a": 2, "b": 3}'
    step = chat(reply) if api == "chat" else {"choices": [{"text": reply, "finish_reason": "stop"}]}
    server.script = [("json", 200, step, {})]
    env = toolenv.ToolEnv(tools=[Add()], tasks=[{"id": "t1", "question": "2+3?"}], parser="mistral", max_turns=1)
    res = await arollout(lambda: env, agent(server, api=api, tool_calling="text"), n=1)
    assert res.trajectories[0].turns[0].results[0].text == "5"
    assert server.requests[0]["body"]["skip_special_tokens"] is False
    server.script = [("json", 200, chat("<answer>5</answer>"), {})]
    await arollout(make_env, agent(server, tool_calling="text"), n=1)
    assert "skip_special_tokens" not in server.requests[1]["body"]


@pytest.mark.parametrize(
    "bad",
    [
        {"choices": [None]},
        {"choices": ["<answer>5</answer>"]},
        {"choices": [{"message": "<answer>5</answer>", "finish_reason": "stop"}]},
        {"choices": [{"message": None, "finish_reason": "stop"}]},
    ],
)
async def test_malformed_reply_shapes_are_retried(server: Server, bad: dict[str, Any]) -> None:
    """A 200 reply whose choice is not an object with a message is a malformed reply: retried."""
    server.script = [("json", 200, bad, {}), ("json", 200, chat("<answer>5</answer>"), {})]
    res = await arollout(make_env, agent(server, max_retries=1), n=1)
    traj = res.trajectories[0]
    assert traj.error is None and traj.reward == 1.0 and traj.turns[0].agent_metadata["attempts"] == 2


async def test_native_calls_with_null_function_or_arguments(server: Server) -> None:
    """`arguments: null` is a call without arguments; `function: null` is a call the env reports."""
    no_args = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": None}}
    server.script = [
        ("json", 200, chat(None, [no_args]), {}),
        ("json", 200, chat(None, [{"id": "c2", "type": "function", "function": None}]), {}),
        ("json", 200, chat("<answer>5</answer>"), {}),
    ]
    res = await arollout(make_env, agent(server), n=1)
    traj = res.trajectories[0]
    assert traj.error is None and traj.reward == 1.0
    first = traj.turns[0].parsed.tool_calls[0]
    assert (first.name, first.arguments) == ("add", {}) and "Invalid arguments" in traj.turns[0].results[0].text
    assert traj.turns[1].results[0].is_error


async def test_stop_string_already_in_the_text_is_not_added_twice(server: Server) -> None:
    """With `include_stop_str_in_output` (vLLM) the text ends with the stop string already."""
    text = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'
    server.script = [
        ("json", 200, chat(text, stop_reason="</tool_call>"), {}),
        ("json", 200, chat("<answer>5</answer>"), {}),
    ]
    kw: dict[str, Any] = {"tool_calling": "text", "extra_body": {"include_stop_str_in_output": True}}
    res = await arollout(make_env, agent(server, **kw), n=1)
    assert res.trajectories[0].turns[0].action == text
    assert server.requests[1]["body"]["messages"][-2] == {"role": "assistant", "content": text}


async def test_server_refusing_max_tokens_gets_max_completion_tokens(server: Server) -> None:
    """OpenAI's reasoning models refuse `max_tokens`: the agent asks again under the name the
    error gives, once, and keeps that name for later requests (also of its spawned copies)."""
    refusal = {
        "error": {
            "message": "Unsupported parameter: 'max_tokens' is not supported with this model. "
            "Use 'max_completion_tokens' instead.",
            "type": "invalid_request_error",
            "param": "max_tokens",
            "code": "unsupported_parameter",
        }
    }
    server.script = [
        ("json", 400, refusal, {}),
        ("json", 200, chat("<answer>5</answer>"), {}),
        ("json", 200, chat("<answer>5</answer>"), {}),
    ]
    res = await arollout(make_env, agent(server, max_tokens=77, max_retries=0), n=1, samples=2, concurrency=1)
    assert [t.error for t in res.trajectories] == [None, None]
    assert [t.reward for t in res.trajectories] == [1.0, 1.0]
    bodies = [r["body"] for r in server.requests]
    assert len(bodies) == 3
    assert bodies[0]["max_tokens"] == 77 and "max_completion_tokens" not in bodies[0]
    for later in bodies[1:]:
        assert later["max_completion_tokens"] == 77 and "max_tokens" not in later


async def test_other_client_errors_about_tokens_are_not_resent(server: Server) -> None:
    server.script = [("json", 400, {"error": "max_tokens must be at most 4096"}, {})]
    res = await arollout(make_env, agent(server, max_tokens=10**6), n=1)
    assert "HTTP 400" in (res.trajectories[0].error or "") and len(server.requests) == 1


@pytest.mark.parametrize("field", ["reasoning", "reasoning_content"])
async def test_native_mode_keeps_the_reasoning_and_sends_it_back(server: Server, field: str) -> None:
    """A reasoning model served with a reasoning parser answers with `reasoning` (vLLM) or
    `reasoning_content` (SGLang, older vLLM) beside the content: it is recorded with the turn and
    goes back on the assistant message of the next request (vLLM renders gpt-oss's analysis from
    it, Qwen3's template the thinking of the turn in progress) under the name the server gave it,
    as vLLM reads only `reasoning` and SGLang `reasoning_content` (and a strict server refuses a
    message field it does not know)."""
    first = chat(None, [call("add", {"a": 2, "b": 3}, "srv_1")])
    first["choices"][0]["message"][field] = "I should add 2 and 3."
    last = chat("<answer>5</answer>")
    last["choices"][0]["message"][field] = "The tool said 5."
    server.script = [("json", 200, first, {}), ("json", 200, last, {})]
    res = await arollout(make_env, agent(server), n=1)
    traj = res.trajectories[0]
    assert traj.error is None and traj.reward == 1.0
    assert [t.agent_metadata.get("reasoning") for t in traj.turns] == ["I should add 2 and 3.", "The tool said 5."]
    assistant = next(m for m in server.requests[1]["body"]["messages"] if m["role"] == "assistant")
    other = "reasoning_content" if field == "reasoning" else "reasoning"
    assert assistant[field] == "I should add 2 and 3." and other not in assistant
    assert assistant["tool_calls"][0]["id"] == "srv_1"


async def test_reasoning_given_under_both_names_goes_back_under_both(server: Server) -> None:
    """vLLM releases between the two names answer with both: both go back."""
    first = chat(None, [call("add", {"a": 2, "b": 3}, "srv_1")])
    first["choices"][0]["message"].update(reasoning="Add them.", reasoning_content="Add them.")
    server.script = [("json", 200, first, {}), ("json", 200, chat("<answer>5</answer>"), {})]
    res = await arollout(make_env, agent(server), n=1)
    assert res.trajectories[0].turns[0].agent_metadata["reasoning"] == "Add them."
    assistant = next(m for m in server.requests[1]["body"]["messages"] if m["role"] == "assistant")
    assert assistant["reasoning"] == assistant["reasoning_content"] == "Add them."


async def test_text_mode_keeps_the_reasoning_and_sends_it_back(server: Server) -> None:
    reply = chat('<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}', stop_reason="</tool_call>")
    reply["choices"][0]["message"]["reasoning_content"] = "Use the tool."
    server.script = [("json", 200, reply, {}), ("json", 200, chat("<answer>5</answer>"), {})]
    res = await arollout(make_env, agent(server, tool_calling="text"), n=1)
    traj = res.trajectories[0]
    assert traj.reward == 1.0 and traj.turns[0].agent_metadata["reasoning"] == "Use the tool."
    assistant = server.requests[1]["body"]["messages"][-2]
    assert assistant["role"] == "assistant" and assistant["reasoning_content"] == "Use the tool."
    assert "reasoning" not in assistant
    assert "reasoning" not in traj.turns[1].agent_metadata


async def test_error_bodies_are_one_line_and_never_show_part_of_the_key(
    server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The key is redacted before the server's body is cut to length (a cut key is still a leak),
    and the body is folded to one line (an HTML error page from a proxy)."""
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    for status, cut in ((401, 500), (503, 200)):
        # The key starts 12 characters before the cut.
        body = ("<html>\r\n<body>\n" + "x" * (cut - 37) + f" bad key {SECRET}</body></html>").encode()
        server.script = [("raw", status, body)]
        res = await arollout(make_env, agent(server, max_retries=0), n=1)
        err = res.trajectories[0].error or ""
        assert f"HTTP {status}" in err and "\n" not in err and "\r" not in err
        assert SECRET[:10] not in err, err


async def test_text_mode_sends_every_stop_string(server: Server) -> None:
    """vLLM and SGLang take any number of stop strings: a tag format with five tools stops at
    each tool's closing tag (a dropped one lets the model run on and write its own results)."""
    tags = {t: (t, "query") for t in ("search", "sql", "python", "browse", "calc")}
    env = toolenv.ToolEnv(
        tools=[],
        tasks=[{"id": "t1", "question": "2+3?", "answer": "5"}],
        parser=get_parser("tags", tags=tags),
        max_turns=1,
    )
    server.script = [("json", 200, chat("<answer>5</answer>"), {})]
    res = await arollout(lambda: env, agent(server, tool_calling="text"), n=1)
    assert res.trajectories[0].reward == 1.0
    assert server.requests[0]["body"]["stop"] == ["</search>", "</sql>", "</python>", "</browse>", "</calc>"]


def _chat_lp(values: list[Any]) -> dict[str, Any]:
    """A chat choice's `logprobs`: one entry per token, a None value written as `"logprob": null`."""
    return {"content": [v if v is None or isinstance(v, str) else {"token": "t", "logprob": v} for v in values]}


@pytest.mark.parametrize(
    ("api", "logprobs", "why"),
    [
        ("chat", _chat_lp([-0.5, {"token": "<tool_call>", "logprob": None}, -0.125]), "1 of 3 token log-probs"),
        ("chat", _chat_lp([-0.5, None, -0.125]), "1 of 3 token log-probs"),
        ("chat", {"content": None}, "no log-probs"),
        ("chat", None, "no log-probs"),
        ("chat", _chat_lp([-0.5, -0.25]), "2 log-probs for 3 token ids"),
        ("completions", {"tokens": ["a", "b", "c"], "token_logprobs": [-0.5, None, -0.125]}, "1 of 3 token log-probs"),
        ("completions", None, "no log-probs"),
    ],
)
async def test_log_probs_with_nulls_are_dropped_whole_and_say_why(
    server: Server, api: str, logprobs: Any, why: str
) -> None:
    """A null log-prob (a server's for a special or tool-call token), a null `logprobs`, or as many
    log-probs as token ids: dropping only the nulls would shift every later log-prob onto the wrong
    token id, which an RL trainer trains on silently. The turn keeps none, and its metadata says why."""
    fields = {"token_ids": [11, 12, 13], "logprobs": logprobs}
    if api == "chat":
        reply = chat("<answer>5</answer>", **fields)
    else:
        reply = {"choices": [{"text": "<answer>5</answer>", "finish_reason": "stop", **fields}]}
    server.script = [("json", 200, reply, {})]
    res = await arollout(make_env, agent(server, api=api, return_token_ids=True, logprobs=True), n=1)
    turn = res.trajectories[0].turns[0]
    assert turn.token_ids == [11, 12, 13] and turn.logprobs is None
    assert why in turn.agent_metadata["logprobs_dropped"]


async def test_log_probs_aligned_with_the_token_ids_are_kept(server: Server) -> None:
    reply = chat("<answer>5</answer>", token_ids=[11, 12, 13], logprobs=_chat_lp([-0.5, -0.25, 0]))
    server.script = [("json", 200, reply, {})]
    res = await arollout(make_env, agent(server, return_token_ids=True, logprobs=True), n=1)
    turn = res.trajectories[0].turns[0]
    assert turn.token_ids == [11, 12, 13] and turn.logprobs == [-0.5, -0.25, 0.0]
    assert "logprobs_dropped" not in turn.agent_metadata


async def test_native_calls_sharing_an_id_are_each_answered(server: Server) -> None:
    """Some servers (Kimi through some proxies, a few tool parsers) give two calls of one reply
    the same id. Each call must still be answered by its own `tool` message: an assistant message
    with two calls and one answer is refused by OpenAI's API and strict chat templates."""
    server.script = [
        ("json", 200, chat(None, [call("add", {"a": 2, "b": 3}, "dup"), call("add", {"a": 1, "b": 3}, "dup")]), {}),
        ("json", 200, chat("<answer>5</answer>"), {}),
    ]
    res = await arollout(make_env, agent(server), n=1)
    traj = res.trajectories[0]
    assert traj.error is None and [r.text for r in traj.turns[0].results] == ["5", "4"]
    ids = [c.id for c in traj.turns[0].parsed.tool_calls]
    assert ids[0] == "dup" and len(set(ids)) == 2
    msgs = server.requests[1]["body"]["messages"]
    assistant = next(m for m in msgs if m["role"] == "assistant")
    sent = [c["id"] for c in assistant["tool_calls"]]
    answers = [(m["tool_call_id"], m["content"]) for m in msgs if m["role"] == "tool"]
    assert answers == [(sent[0], "5"), (sent[1], "4")] and msgs[-1]["role"] == "tool"


@pytest.mark.parametrize("parser", ["tags", "qwen3_xml", "hermes"])
async def test_native_call_ids_sent_back_are_the_servers_and_unique(server: Server, parser: str) -> None:
    """Formats other than Hermes cannot write call ids, so the env's parser names each turn's calls
    `call_0`, `call_1`...; a server that gives no ids gets the same names every turn. The history
    sent back uses the server's ids where it gave them, and never repeats an id (Anthropic behind a
    gateway, Mistral and others refuse a conversation that does)."""

    def env() -> toolenv.ToolEnv:
        return toolenv.ToolEnv(tools=[Lookup()], tasks=[{"question": "2+3?", "answer": "5"}], parser=parser)

    no_id = {"type": "function", "function": {"name": "search", "arguments": '{"query": "c"}'}}
    server.script = [
        ("json", 200, chat(None, [call("search", {"query": "a"}, "srv_a")]), {}),
        ("json", 200, chat(None, [no_id]), {}),
        ("json", 200, chat(None, [no_id]), {}),
        ("json", 200, chat("<answer>5</answer>"), {}),
    ]
    res = await arollout(env, agent(server), n=1)
    assert res.trajectories[0].error is None and res.trajectories[0].reward == 1.0
    msgs = server.requests[-1]["body"]["messages"]
    sent = [c["id"] for m in msgs if m["role"] == "assistant" for c in m.get("tool_calls", [])]
    assert sent[0] == "srv_a" and len(sent) == 3 and len(set(sent)) == 3
    for i, m in enumerate(msgs):  # each assistant message is followed by the answer to each of its calls
        if m["role"] == "assistant" and m.get("tool_calls"):
            answers = [a["tool_call_id"] for a in msgs[i + 1 : i + 1 + len(m["tool_calls"])] if a["role"] == "tool"]
            assert answers == [c["id"] for c in m["tool_calls"]]


@pytest.mark.parametrize("api", ["chat", "completions"])
async def test_stop_string_put_back_when_the_server_does_not_say_which(server: Server, api: str) -> None:
    """OpenAI's API and most gateways end a reply at a stop string without returning it or saying
    which one matched (no `stop_reason` / `matched_stop`). The stop string that closes the call the
    text left open is put back, so the env reads the call rather than an unclosed tag, and the
    growing prompt holds what the model's format writes; a reply that ended by itself is kept as is."""

    def env() -> toolenv.ToolEnv:
        return toolenv.ToolEnv(tools=[Lookup()], tasks=[{"question": "2+3?", "answer": "5"}], parser="tags")

    def reply(text: str) -> dict[str, Any]:
        return chat(text) if api == "chat" else {"choices": [{"text": text, "finish_reason": "stop"}]}

    server.script = [
        ("json", 200, reply("<think>look</think><search> five "), {}),
        ("json", 200, reply("<answer>5</answer>"), {}),
    ]
    res = await arollout(env, agent(server, api=api, tool_calling="text"), n=1)
    traj = res.trajectories[0]
    assert traj.error is None and traj.reward == 1.0
    assert [t.action for t in traj.turns] == ["<think>look</think><search> five </search>", "<answer>5</answer>"]
    assert traj.turns[0].results[0].text == 'Doc 1(Title: "five") five'
    second = server.requests[1]["body"]
    if api == "chat":
        assert second["messages"][-2] == {"role": "assistant", "content": "<think>look</think><search> five </search>"}
    else:
        assert "<search> five </search>\n\n<information>" in second["prompt"]


@pytest.mark.parametrize(
    ("headers", "low", "high"),
    [
        ({"Retry-After": "7"}, 7.0, 7.0),
        ({"Retry-After": "1.5"}, 1.5, 1.5),
        ({"Retry-After": "-3"}, 0.0, 0.0),
        ({"Retry-After": "soon"}, None, None),
        ({"retry-after-ms": "250", "Retry-After": "1"}, 0.25, 0.25),  # OpenAI's, the finer one first
        ({"Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT"}, 0.0, 0.0),  # a date passed: at once
        ({}, None, None),
    ],
)
def test_retry_after_in_seconds_milliseconds_or_an_http_date(headers: dict[str, str], low: Any, high: Any) -> None:
    """`Retry-After` is seconds or an HTTP date (RFC 9110); OpenAI also sends `retry-after-ms`."""
    from toolenv_agents.openai_compat import _retry_after

    value = _retry_after(httpx.Response(429, headers=headers))
    assert value is None if low is None else (value is not None and low <= value <= high)


def test_retry_after_an_http_date_to_come() -> None:
    from email.utils import format_datetime

    from toolenv_agents.openai_compat import _retry_after

    when = format_datetime(datetime.now(timezone.utc) + timedelta(seconds=120), usegmt=True)
    value = _retry_after(httpx.Response(503, headers={"Retry-After": when}))
    assert value is not None and 100 <= value <= 121


@pytest.mark.parametrize("status", [408, 409])
async def test_request_timeout_and_conflict_are_retried(server: Server, status: int) -> None:
    """408 (a proxy or gateway timed the request out) and 409 (OpenAI: a lock timeout) are
    transient, retried as OpenAI's own client retries them; other 4xx fail at once."""
    server.script = [("json", status, {"error": "try again"}, {}), ("json", 200, chat("<answer>5</answer>"), {})]
    res = await arollout(make_env, agent(server, max_retries=1), n=1)
    traj = res.trajectories[0]
    assert traj.error is None and traj.reward == 1.0 and traj.turns[0].agent_metadata["attempts"] == 2


@pytest.mark.parametrize("how", ["argument", "extra_body"])
async def test_a_seed_draws_each_sample_and_turn_apart(server: Server, how: str) -> None:
    """With a seed, each request sends `seed + turn`, offset per episode: sent as it is (a
    `seed` in `extra_body` was), every sample of a task was the same draw, so a GRPO group or
    pass@k over a seeded vLLM had one sample k times. A fresh agent draws the same seeds again."""
    kw: dict[str, Any] = {"seed": 7} if how == "argument" else {"extra_body": {"seed": 7, "top_k": 5}}

    async def seeds() -> list[int]:
        server.requests.clear()
        server.script = [
            ("json", 200, chat("", [call("add", {"a": 2, "b": 3}, "c1")]), {}),
            ("json", 200, chat("<answer>5</answer>"), {}),
        ] * 2
        res = await arollout(make_env, agent(server, **kw), n=1, samples=2, concurrency=1)
        assert all(t.error is None for t in res.trajectories)
        return [r["body"]["seed"] for r in server.requests]

    first = await seeds()
    assert len(set(first)) == 4 and first[0] == 7 + (1 << 20) and first[1] == first[0] + 1  # turn 0, turn 1
    assert await seeds() == first
    if how == "extra_body":
        assert server.requests[0]["body"]["top_k"] == 5
    with pytest.raises(ValueError, match="seed must be an int"):
        agent(server, seed="7")  # type: ignore[arg-type]


def test_more_than_one_choice_a_request_is_refused(server: Server) -> None:
    """`n > 1` in `extra_body` made the server generate choices the agent never reads (the first
    is used): refused, pointing at samples, which draws attempts the run records."""
    with pytest.raises(ValueError, match=r"n=4: .*samples=N"):
        agent(server, extra_body={"n": 4})
    assert agent(server, extra_body={"n": 1}).extra_body == {"n": 1}


async def test_a_resumed_run_draws_each_episode_as_the_whole_run_does(server: Server, tmp_path: Path) -> None:
    """The seed offset is the episode's place in the run, not the order episodes started in:
    numbered by start order, a retried (or resumed) episode took the seed of the run's first
    episode, so sample 1 of t1 drew exactly sample 0's reply (a GRPO group with a duplicate)."""
    tasks = [{"id": "t1", "question": "2+3?", "answer": "5"}, {"id": "t2", "question": "2+3?", "answer": "5"}]

    def env() -> toolenv.ToolEnv:
        return toolenv.ToolEnv(tools=[Add()], tasks=tasks, parser="hermes")

    async def run(**kw: Any) -> list[int]:
        server.requests.clear()
        await arollout(env, agent(server, seed=7), n=2, samples=2, concurrency=1, out=tmp_path / "run", **kw)
        return [r["body"]["seed"] for r in server.requests]

    answer = ("json", 200, chat("<answer>5</answer>"), {})
    server.script = [answer, ("json", 400, {"error": "refused"}, {}), answer, answer]
    first = await run()  # t1 sample 1 fails
    server.script = [answer]
    retried = await run(retry_errors=True)
    server.script = [answer] * 4
    whole = await run(overwrite=True)
    assert len(set(whole)) == 4 and first == whole
    assert retried == [whole[1]]  # t1 sample 1 draws as it would have, not as t1 sample 0 did


@pytest.mark.parametrize("url", ["localhost:8000/v1", "127.0.0.1:8000/v1", "htp://example.test/v1", "http:///v1"])
def test_a_base_url_without_http_or_a_host_is_refused_at_once(url: str) -> None:
    """A base URL missing its `http://` (`--base-url localhost:8000/v1`) was retried as a dropped
    connection: every episode of the run waited out its retries and was recorded as failed."""
    with pytest.raises(ValueError, match=r"base_url must be an http:// or https:// URL with a host"):
        OpenAIAgent(model="tiny", base_url=url)
    assert OpenAIAgent(model="tiny", base_url="HTTP://127.0.0.1:8000/v1/").base_url == "HTTP://127.0.0.1:8000/v1"


async def test_a_redirect_fails_at_once_naming_where_it_points(server: Server) -> None:
    """A 3xx (an http:// URL a proxy sends to https://, a moved endpoint) was read as a reply
    without JSON and retried: every episode failed after its retries with "malformed JSON: ''"."""
    target = "https://llm.example.test/v1/chat/completions"
    server.script = [("json", 307, {}, {"Location": target})]
    traj = (await arollout(make_env, agent(server), n=1)).trajectories[0]
    assert len(server.requests) == 1
    assert traj.error is not None and f"HTTP 307 (redirected to {target})" in traj.error


async def test_a_reply_that_cannot_be_decoded_is_retried(server: Server) -> None:
    """A body that fails its Content-Encoding (a gzip reply cut or mangled by a proxy) is a
    malformed reply like bad JSON: retried, not an error outside the retries naming no URL."""
    server.script = [
        ("json", 200, chat("<answer>5</answer>"), {"Content-Encoding": "gzip"}),
        ("json", 200, chat("<answer>5</answer>"), {}),
    ]
    traj = (await arollout(make_env, agent(server), n=1)).trajectories[0]
    assert traj.error is None and traj.reward == 1.0 and traj.turns[0].agent_metadata["attempts"] == 2


PARALLEL = (
    '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>\n'
    '<tool_call>{"name": "add", "arguments": {"a": 10, "b": 4}}</tool_call>'
)


@pytest.mark.parametrize("parser", ["hermes", "qwen3_xml"])
async def test_chat_text_mode_lets_a_model_make_parallel_calls(server: Server, parser: str) -> None:
    """Hermes/Qwen templates write each call in its own `<tool_call>` block and end the turn after
    the last one: stopping at the first `</tool_call>` cut every turn to one call. In chat text
    mode the per-call closer is not sent as a stop string, so both calls of a turn run."""
    reply = PARALLEL
    if parser == "qwen3_xml":
        reply = reply.replace(
            '{"name": "add", "arguments": {"a": 2, "b": 3}}',
            "<function=add>\n<parameter=a>\n2\n</parameter>\n<parameter=b>\n3\n</parameter>\n</function>",
        )
        reply = reply.replace(
            '{"name": "add", "arguments": {"a": 10, "b": 4}}',
            "<function=add>\n<parameter=a>\n10\n</parameter>\n<parameter=b>\n4\n</parameter>\n</function>",
        )
    server.script = [("json", 200, chat(reply), {}), ("json", 200, chat("<answer>5</answer>"), {})]
    res = await arollout(lambda: make_env(parser), agent(server, tool_calling="text"), n=1)
    traj = res.trajectories[0]
    assert "stop" not in server.requests[0]["body"]
    assert traj.error is None and [r.text for r in traj.turns[0].results] == ["5", "14"]


async def test_stop_strings_kept_where_the_format_takes_one_call_a_turn_or_asked(server: Server) -> None:
    """Search-R1's tags (one call a turn: the model would write its own `<information>` next),
    the completions API (one growing text: no chat turn to end) and a user's own `stop` keep
    stop strings; `stop=[]` sends none."""

    def tags_env() -> toolenv.ToolEnv:
        return toolenv.ToolEnv(tools=[Lookup()], tasks=[{"question": "q", "answer": "5"}], parser="tags", max_turns=1)

    done = chat("<answer>5</answer>")
    cases: list[tuple[Any, dict[str, Any], Any]] = [
        (tags_env, {"tool_calling": "text"}, ["</search>", "</sql>", "</python>"]),
        (make_env, {"api": "completions"}, ["</tool_call>"]),
        (
            make_env,
            {"tool_calling": "text", "stop": ["</tool_call>", "Observation:"]},
            ["</tool_call>", "Observation:"],
        ),
        (tags_env, {"tool_calling": "text", "stop": []}, None),
    ]
    for env, kw, want in cases:
        server.requests.clear()
        step = (
            done
            if kw.get("api") != "completions"
            else {"choices": [{"text": "<answer>5</answer>", "finish_reason": "stop"}]}
        )
        server.script = [("json", 200, step, {})]
        await arollout(env, agent(server, **kw), n=1)
        assert server.requests[0]["body"].get("stop") == want, kw


async def test_a_stop_string_of_ones_own_is_put_back_as_the_parsers_are(server: Server) -> None:
    """A stop string the user sent that the server names as the one it cut at is put back, as the
    parser's are (the action holds what the model wrote)."""
    text = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}'
    server.script = [
        ("json", 200, chat(text, stop_reason="</tool_call>"), {}),
        ("json", 200, chat("<answer>5</answer>"), {}),
    ]
    res = await arollout(make_env, agent(server, tool_calling="text", stop=["</tool_call>"]), n=1)
    assert res.trajectories[0].turns[0].action == text + "</tool_call>"


@pytest.mark.parametrize("tool_calling", ["text", "native"])
async def test_a_stop_in_extra_body_is_taken_as_stop(server: Server, tool_calling: str) -> None:
    """`extra_body={"stop": [...]}` (how stop strings were set before `stop`) is the `stop` argument:
    sent in either mode, and the one the server cut at is put back in text mode."""
    text = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}'
    first = chat(text, stop_reason="</tool_call>") if tool_calling == "text" else chat("<answer>5</answer>")
    server.script = [("json", 200, first, {}), ("json", 200, chat("<answer>5</answer>"), {})]
    kw: dict[str, Any] = {"tool_calling": tool_calling, "extra_body": {"stop": ["</tool_call>"]}}
    res = await arollout(make_env, agent(server, **kw), n=1)
    assert server.requests[0]["body"]["stop"] == ["</tool_call>"]
    if tool_calling == "text":
        assert res.trajectories[0].turns[0].action == text + "</tool_call>"


@pytest.mark.parametrize(
    ("kw", "name"),
    [
        ({"connect_timeout": 0}, "connect_timeout"),
        ({"connect_timeout": -1.0}, "connect_timeout"),
        ({"timeout": float("nan")}, "timeout"),
        ({"backoff": -0.5}, "backoff"),
        ({"max_backoff": float("nan")}, "max_backoff"),
    ],
)
def test_timeouts_and_backoffs_that_cannot_work_are_refused_at_once(kw: dict[str, Any], name: str) -> None:
    """`connect_timeout=0` failed every request of the run as a server timing out ("timed out
    (ConnectTimeout)" after all retries, in every episode); a NaN `timeout` failed each turn with
    "deadline must not be NaN". Refused when the agent is built, naming the argument."""
    with pytest.raises(ValueError, match=rf"^{name} must be"):
        OpenAIAgent(model="tiny", base_url="http://127.0.0.1:9/v1", **kw)


async def test_a_404_says_to_check_base_url(server: Server) -> None:
    """`--base-url http://host:8000` (no `/v1`) got vLLM's bare `{"detail": "Not Found"}` in every
    episode's error, which did not say what was wrong: a 404 names base_url and model to check."""
    server.script = [("json", 404, {"detail": "Not Found"}, {})]
    traj = (await arollout(make_env, agent(server, max_retries=0), n=1)).trajectories[0]
    assert traj.error is not None and "HTTP 404" in traj.error
    assert "check base_url (the API root, e.g. http://127.0.0.1:8000/v1) and model" in traj.error


async def test_a_stop_token_the_server_names_by_id_is_put_back_as_its_stop_string(server: Server) -> None:
    """vLLM stops gpt-oss at `<|call|>` as a stop token (its generation config lists it as an end
    of turn), cuts it from the text and says so with the token's id (`stop_reason: 200012`), not
    a string. The id does not say which stop string it stands for, so the one that completes the
    call is put back: the growing prompt holds the call as Harmony writes it, `<|call|>` and all,
    rather than an unterminated message the model never sees in training."""

    def env() -> toolenv.ToolEnv:
        return toolenv.ToolEnv(tools=[Lookup()], tasks=[{"question": "2+3?", "answer": "5"}], parser="harmony")

    call = '<|channel|>commentary to=functions.search <|constrain|>json<|message|>{"query": "five"}'
    server.script = [
        ("json", 200, {"choices": [{"text": call, "finish_reason": "stop", "stop_reason": 200012}]}, {}),
        ("json", 200, {"choices": [{"text": "<|channel|>final<|message|>5", "finish_reason": "stop"}]}, {}),
    ]
    res = await arollout(env, agent(server, api="completions"), n=1)
    traj = res.trajectories[0]
    assert traj.error is None and traj.turns[0].action == call + "<|call|>"
    assert traj.turns[0].results[0].text == 'Doc 1(Title: "five") five'
    assert call + "<|call|>" in server.requests[1]["body"]["prompt"]
    # A reply the model ended by itself (vLLM: `stop_reason` null) is kept as it is.
    server.script = [("json", 200, {"choices": [{"text": call, "finish_reason": "stop", "stop_reason": None}]}, {})]
    kept = await arollout(env, agent(server, api="completions"), n=1)
    assert kept.trajectories[0].turns[0].action == call
