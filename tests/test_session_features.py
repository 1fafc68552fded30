"""A user's day with this session's features, through the CLI as a user types it, against a
scripted OpenAI-compatible server on 127.0.0.1 that answers as vLLM does: native tool calls,
`usage`, and with `return_token_ids` the prompt's ids on the response and the generated ones on
the choice, rendered by a real (tiny) Qwen2 tokenizer and chat template.

`toolenv rollout ... --samples 4`, Ctrl-C half way, the same command again, `toolenv export`
(chat with `--tools`, and `--format tokens`) and `toolenv view`: each step must agree with the
others, with the server and with the docs."""

from __future__ import annotations

import json
import math
import signal
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from toolenv import Message, ToolEnv
from toolenv.agent import Agent, EnvInfo
from toolenv.runner import arollout

pytest.importorskip("transformers", reason="the scripted server renders prompts with a real chat template")
pytest.importorskip("toolenv_sql", reason="the day runs toolenv/Chinook-v0")

TOOLENV = str(Path(sys.executable).parent / "toolenv")
ENV_ID = "toolenv/Chinook-v0"
TASKS, SAMPLES, CONCURRENCY = 3, 4, 2


class FakeVLLM:
    """Chat completions as vLLM answers them. Turn 0 calls `sql`; turn 1 answers (the gold query,
    except every third answer). Requests after `hold_after` wait until `release` is set."""

    def __init__(self, tokenizer: Any, gold: dict[str, str]) -> None:
        self.tokenizer, self.gold = tokenizer, gold
        self.lock = threading.Condition()
        self.requests = 0
        self.answers = 0
        self.held = 0
        self.hold_after: int | None = None
        self.release = threading.Event()
        self.log: list[dict[str, Any]] = []  # per answered request: the body, prompt ids, output ids, text

    def render(self, messages: list[dict[str, Any]], tools: Any) -> list[int]:
        """The prompt's ids as vLLM renders it: JSON call arguments decoded to objects for the template."""
        decoded = [
            {
                **m,
                "tool_calls": [
                    {**c, "function": {**c["function"], "arguments": _decoded(c["function"]["arguments"])}}
                    for c in m["tool_calls"]
                ],
            }
            if m.get("tool_calls")
            else m
            for m in messages
        ]
        out = self.tokenizer.apply_chat_template(decoded, tools=tools, add_generation_prompt=True, tokenize=True)
        return list(out if isinstance(out, list) else out["input_ids"])

    def answer(self, body: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            self.requests += 1
            if self.hold_after is not None and self.requests > self.hold_after:
                self.held += 1
                self.lock.notify_all()
                hold = True
            else:
                hold = False
        if hold:
            self.release.wait()
            raise ConnectionAbortedError("held until the client went away")
        messages = body["messages"]
        prompt_ids = self.render(messages, body.get("tools"))
        question = next(m["content"] for m in messages if m["role"] == "user").rsplit("Question: ", 1)[-1]
        message: dict[str, Any]
        if not any(m["role"] == "assistant" for m in messages):
            args = {"query": "SELECT COUNT(*) FROM Album"}
            text = "<tool_call>\n" + json.dumps({"name": "sql", "arguments": args}) + "\n</tool_call>"
            call = {"id": f"chatcmpl-tool-{len(self.log)}", "type": "function", "function": {"name": "sql"}}
            call["function"]["arguments"] = json.dumps(args)
            message, finish = {"role": "assistant", "content": None, "tool_calls": [call]}, "tool_calls"
        else:
            with self.lock:
                self.answers += 1
                right = self.answers % 3 != 0
            text = f"<answer>{self.gold[question] if right else 'SELECT 1'}</answer>"
            message, finish = {"role": "assistant", "content": text, "tool_calls": []}, "stop"
        ids = list(self.tokenizer(text + "<|im_end|>", add_special_tokens=False)["input_ids"])
        with self.lock:
            self.log.append({"body": body, "prompt_token_ids": prompt_ids, "token_ids": ids, "text": text})
        choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": finish, "logprobs": None}
        usage = {"prompt_tokens": len(prompt_ids), "completion_tokens": len(ids)}
        reply: dict[str, Any] = {"id": "cmpl", "object": "chat.completion", "choices": [choice], "usage": usage}
        if body.get("return_token_ids"):
            reply["prompt_token_ids"] = prompt_ids
            choice["token_ids"] = ids
        return reply

    def wait_held(self, count: int) -> None:
        with self.lock:
            assert self.lock.wait_for(lambda: self.held >= count, timeout=120), "the rollout never reached the hold"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[FakeVLLM, str]]:
    import gymnasium as gym
    from transformers import AutoTokenizer

    from toolenv.integrations.verl.tiny import build_tiny_qwen2

    tokenizer = AutoTokenizer.from_pretrained(build_tiny_qwen2(tmp_path_factory.mktemp("qwen"), with_model=False))
    env = gym.make(ENV_ID)
    gold = {t.question.rsplit("Question: ", 1)[-1]: t.context["gold_sql"] for t in env.unwrapped.tasks}
    env.close()
    fake = FakeVLLM(tokenizer, gold)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            data = json.dumps(fake.answer(body)).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    class Server(ThreadingHTTPServer):
        daemon_threads = True

        def handle_error(self, request: Any, client_address: Any) -> None:
            pass  # a held request whose client was interrupted

    httpd = Server(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield fake, f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    finally:
        fake.release.set()
        httpd.shutdown()
        httpd.server_close()


def _decoded(arguments: Any) -> Any:
    return json.loads(arguments) if isinstance(arguments, str) else arguments


def _pass_at_k(successes: dict[str, list[bool]], k: int) -> float:
    """Chen et al.'s unbiased estimate with binomials, averaged over tasks."""
    per_task = [1 - math.comb(len(s) - sum(s), k) / math.comb(len(s), k) for s in successes.values()]
    return sum(per_task) / len(per_task)


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_a_users_day_rollout_interrupt_resume_export_view(server: tuple[FakeVLLM, str], tmp_path: Path) -> None:
    fake, base_url = server
    run = tmp_path / "RUN"
    rollout = [
        TOOLENV, "rollout", ENV_ID, "--agent", "openai", "--model", "tiny-qwen", "--base-url", base_url,
        "--agent-arg", "return_token_ids=true", "--agent-arg", "max_tokens=64",
        "-n", str(TASKS), "--samples", str(SAMPLES), "-c", str(CONCURRENCY), "--out", str(run), "--no-progress",
    ]  # fmt: skip
    # Half way (10 of 24 requests answered), every worker waits on the server: Ctrl-C then.
    fake.hold_after = 10
    proc = subprocess.Popen(rollout, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        fake.wait_held(CONCURRENCY)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    kept = {(t["task"]["id"], t["sample"]) for t in _lines(run / "trajectories.jsonl")}
    assert 0 < len(kept) < TASKS * SAMPLES
    assert f"{len(kept)} trajectories kept" in err
    assert json.loads((run / "summary.json").read_text())["interrupted"] is True

    fake.hold_after = None
    fake.release.set()
    done = subprocess.run(rollout, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert f"{TASKS * SAMPLES - len(kept)} new, {len(kept)} already done" in done.stdout

    # Nothing lost or run twice on resume; every episode took its two turns.
    trajectories = _lines(run / "trajectories.jsonl")
    keys = [(t["task"]["id"], t["sample"]) for t in trajectories]
    assert len(keys) == len(set(keys)) == TASKS * SAMPLES and kept <= set(keys)
    assert all(t["error"] is None and len(t["turns"]) == 2 for t in trajectories)
    # (an episode stopped half way was not written, and ran again whole)

    # The summary's pass@k is the file's, and what the console showed.
    summary = json.loads((run / "summary.json").read_text())
    successes: dict[str, list[bool]] = {}
    for t in trajectories:
        successes.setdefault(t["task"]["id"], []).append(t["success"])
    assert summary["episodes"] == TASKS * SAMPLES and summary["interrupted"] is False
    assert summary["pass_at_k"].keys() == {"1", "2", "4"}
    for k, value in summary["pass_at_k"].items():
        assert value == pytest.approx(_pass_at_k(successes, int(k)))
        assert f"pass@{k} {value:.1%}" in done.stdout
    turns = [turn for t in trajectories for turn in t["turns"]]
    assert all(turn["prompt_tokens"] == len(turn["prompt_token_ids"]) for turn in turns)  # the server's usage
    assert summary["prompt_tokens"] == sum(turn["prompt_tokens"] for turn in turns)

    # run.json records the agent's settings as given (none of them is a secret).
    config = json.loads((run / "run.json").read_text())
    assert config["agent_kwargs"]["return_token_ids"] is True
    assert config["agent_kwargs"]["max_tokens"] == 64

    # Each turn holds the server's ids; the token export is the server's ids, the loss on its output.
    # (samples of a task read the same prompt: a reply is known by the ids it read and wrote)
    answered = {(tuple(r["prompt_token_ids"]), tuple(r["token_ids"])): r["text"] for r in fake.log}
    for t in trajectories:
        for turn in t["turns"]:
            assert (tuple(turn["prompt_token_ids"]), tuple(turn["token_ids"])) in answered
    out = subprocess.run(
        [TOOLENV, "export", str(run), "--format", "tokens", "--out", str(tmp_path / "sft" / "tokens.jsonl")],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    rows = _lines(tmp_path / "sft" / "tokens.jsonl")
    assert len(rows) == TASKS * SAMPLES  # Qwen's template re-renders nothing: one row per episode
    by_key = {(t["task"]["id"], t["sample"]): t for t in trajectories}
    for row in rows:
        meta = row["metadata"]
        last = by_key[meta["task_id"], meta["sample"]]["turns"][-1]
        assert meta["turns"] == [0, 1]
        assert row["input_ids"] == last["prompt_token_ids"] + last["token_ids"]
        generated = [i for i, m in zip(row["input_ids"], row["assistant_masks"], strict=True) if m]
        turns = by_key[meta["task_id"], meta["sample"]]["turns"]
        assert generated == [i for turn in turns for i in turn["token_ids"]]

    # The chat export with --tools renders, through the same template, to what the model read
    # last, and ends with what it wrote.
    export = [TOOLENV, "export", str(run), "--tools", ENV_ID, "--arguments", "object"]
    out = subprocess.run([*export, "--out", str(tmp_path / "sft" / "chat.jsonl")], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    chat = _lines(tmp_path / "sft" / "chat.jsonl")
    assert len(chat) == TASKS * SAMPLES
    for row in chat:
        last = by_key[row["metadata"]["task_id"], row["metadata"]["sample"]]["turns"][-1]
        assert fake.render(row["messages"][:-1], row["tools"]) == last["prompt_token_ids"]
        assert row["messages"][-1] == {
            "role": "assistant",
            "content": answered[tuple(last["prompt_token_ids"]), tuple(last["token_ids"])],
        }

    # The report shows every episode, from the file and from the server's pages.
    out = subprocess.run([TOOLENV, "view", str(run)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert (run / "report.html").stat().st_size > 0
    serve = subprocess.Popen(
        [TOOLENV, "view", str(run), "--serve", "--port", "0", "--out", str(tmp_path / "r.html")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert serve.stdout is not None
        line = ""
        while "serving" not in line:
            line = serve.stdout.readline()
            assert line, serve.stderr.read() if serve.stderr else ""
        url = line.split(" at ")[1].split()[0]
        with urllib.request.urlopen(url + "rows.json", timeout=30) as resp:
            listed = json.loads(resp.read())
        assert sorted((r["task_id"], r["sample"]) for r in listed) == sorted(keys)
    finally:
        serve.send_signal(signal.SIGINT)
        serve.communicate(timeout=30)


class Settings(Agent):
    """An agent taking any settings, answering at once."""

    def __init__(self, **settings: Any) -> None:
        self.settings = settings

    async def act(self, observation: str, messages: list[Message], env_info: EnvInfo) -> str:
        return "<answer>done</answer>"


async def test_run_json_keeps_settings_whose_names_only_mention_tokens(tmp_path: Path) -> None:
    """`max_tokens`, `return_token_ids` and `max_new_tokens` name no secret (run.json showed them as
    `***`); a key or a token given as text still is one."""
    settings = {"max_tokens": 64, "return_token_ids": True, "max_new_tokens": 32, "api_key": "sk-x", "token": "hf_x"}
    await arollout(
        lambda: ToolEnv(tools=[], tasks=[{"id": "t", "question": "q?", "answer": "done"}]),
        f"{__name__}:Settings",
        out=tmp_path,
        agent_kwargs=settings,
    )
    recorded = json.loads((tmp_path / "run.json").read_text())["agent_kwargs"]
    assert recorded == {**settings, "api_key": "***", "token": "***"}
