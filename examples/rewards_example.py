"""Composing rewards: answer match, format, action penalties, a per-turn bonus,
tool verification and an LLM judge, each reported as its own component.

Runs offline: the "judge model" is a tiny OpenAI-compatible server on 127.0.0.1
that says yes when the prediction contains a gold answer. Point `base_url` at
vLLM or SGLang (and set `api_key_env`) to use a real model.

    python examples/rewards_example.py
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import toolenv
from toolenv import tool
from toolenv.rewards import (
    FormatReward,
    InvalidCallPenalty,
    LLMJudge,
    ToolCallPenalty,
    ToolSuccessBonus,
    ToolVerified,
    reward_info,
)


@tool
def calc(expression: str) -> str:
    """Evaluate an arithmetic expression of integers and + - * ( )."""
    if not set(expression) <= set("0123456789+-*() "):
        raise ValueError("only integers, + - * and parentheses are allowed")
    return str(eval(expression, {"__builtins__": {}}))  # input restricted to arithmetic above


# Re-run the answer through the env's own calculator: 1.0 when it comes out as the task's value.
VERIFIED = ToolVerified(
    "calc",
    build_args=lambda ep: {"expression": ep.answer},
    judge=lambda result: float(result.text.strip() == "42"),
    name="verified",
)


class JudgeHandler(BaseHTTPRequestHandler):
    """A stand-in judge model: 'yes' when a gold answer appears in the prediction."""

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        prompt = body["messages"][-1]["content"]
        gold = prompt.split("Gold answer(s): ")[1].split("\n")[0].split(" | ")
        prediction = prompt.split("<prediction>\n")[1].split("\n</prediction>")[0]
        verdict = "yes" if any(g in prediction for g in gold) else "no"
        data = json.dumps({"choices": [{"message": {"role": "assistant", "content": verdict}}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        pass


def main() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), JudgeHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    judge_url = f"http://127.0.0.1:{server.server_address[1]}/v1"

    reward: list[tuple[toolenv.Reward | str, float]] = [
        ("exact_match", 1.0),
        (FormatReward(require_think=True), 0.2),  # every turn well formed, with a <think> block
        (ToolCallPenalty(-1.0, free_calls=1), 0.05),  # calls beyond the first cost 0.05 each
        (InvalidCallPenalty(-1.0), 0.25),  # parse errors, failed calls, empty turns
        ("answer_avoidance_penalty", 1.0),  # truncated without an answer
        (ToolSuccessBonus(1.0, max_per_turn=1), 0.1),  # per-turn bonus for a successful call
        (VERIFIED, 0.5),
        (LLMJudge(base_url=judge_url, model="judge", api_key_env=None, retries=1), 0.5),
    ]
    env = toolenv.ToolEnv(
        tools=[calc],
        tasks=[{"question": "What is 6 * 7?", "answer": "42"}],
        reward=reward,
        max_turns=4,
    )
    env.reset(seed=0)
    actions = [
        '<think>Compute it.</think><tool_call>{"name": "calc", "arguments": {"expression": "6 * 7"}}</tool_call>',
        '<think>Check, badly.</think><tool_call>{"name": "calc", "arguments": {"expression": "6 / 7"}}</tool_call>',
        "<think>It is 42.</think><answer>42</answer>",
    ]
    for i, action in enumerate(actions, 1):
        _, r, terminated, truncated, info = env.step(action)
        parts = ", ".join(f"{k}={v:+.2f}" for k, v in info["reward_components"].items() if v)
        print(f"step {i}: reward={float(r):+.3f} [{parts}]")
        if terminated or truncated:
            print(f"episode return={info['episode_stats']['return']:.3f}")
    assert env.episode is not None
    print("judge:", reward_info(env.episode)["judge"])
    env.close()
    server.shutdown()


if __name__ == "__main__":
    main()
