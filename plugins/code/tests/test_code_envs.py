"""HumanEval-v0 and MBPP-v0: env checker, oracles on every task, rewards, the example."""

from __future__ import annotations

import asyncio
import functools
import os
import subprocess
import sys
import time
from pathlib import Path

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

import toolenv
from toolenv.registry import load
from toolenv_code.envs import make_humaneval_env, make_mbpp_env

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("env_id", ["toolenv/HumanEval-v0", "toolenv/MBPP-v0"])
def test_check_env(env_id: str) -> None:
    env = gym.make(env_id, limit=5)
    try:
        check_env(env.unwrapped, skip_render_check=True)
    finally:
        env.close()


def test_tool_plugin_registered() -> None:
    tool = toolenv.load_tool("python")
    assert tool.name == "python" and "code" in tool.schema()["function"]["parameters"]["properties"]


def test_codeblock_turns_then_answer() -> None:
    env = make_humaneval_env(limit=1)
    try:
        obs, info = env.reset(seed=0)
        assert "def has_close_elements" in obs and "<answer>" in obs
        obs, reward, terminated, _, info = env.step("Try:\n```python\nprint(sorted([3, 1, 2]))\n```")
        assert obs == "```output\n[1, 2, 3]\n```" and reward == 0.0 and not terminated
        obs, reward, terminated, _, info = env.step("```python\nimport os\nos.listdir('/nope')\n```")
        assert "FileNotFoundError" in obs and info["tool_results"][0].is_error
        answer = "<answer>\ndef has_close_elements(numbers, threshold):\n    return False\n</answer>"
        _, reward, terminated, _, info = env.step(answer)
        report = env.unwrapped.episode.state["tests_passed"]
        assert terminated and 0.0 < float(reward) < 1.0
        assert float(reward) == pytest.approx(sum(report["passed"]) / len(report["passed"]))
    finally:
        env.close()


def test_mbpp_hermes_and_fenced_answer() -> None:
    env = make_mbpp_env(parser="hermes")
    try:
        env.reset(seed=0, options={"task_id": "MBPP/11"})  # remove first and last occurrence of a char
        call = '<tool_call>{"name": "python", "arguments": {"code": "print(2 ** 10)"}}</tool_call>'
        obs, *_ = env.step(call)
        assert obs == "<tool_response>\n1024\n</tool_response>"
        _, reward, terminated, _, _ = env.step("<answer>def remove_Occ(s, ch):\n    return s</answer>")
        assert terminated and reward == 0.0
        env.reset(seed=0, options={"task_id": "MBPP/11"})
        fenced = "<answer>\n```python\ndef remove_Occ(s, ch):\n    return s.replace(ch, '')\n```\n</answer>"
        _, reward, terminated, _, _ = env.step(fenced)
        assert terminated and reward == 1.0
    finally:
        env.close()


_BODY = (
    "    for i, a in enumerate(numbers):\n"
    "        for b in numbers[i + 1 :]:\n"
    "            if abs(a - b) < threshold:\n"
    "                return True\n"
    "    return False"
)
_ONE_LINE = "    return any(abs(a - b) < threshold for i, a in enumerate(numbers) for b in numbers[i + 1 :])"


@pytest.mark.parametrize(
    "answer",
    [
        f"<answer>\n{_BODY}\n</answer>",  # the parser strips the answer: the first line loses its indentation
        f"<answer>\n{_ONE_LINE}\n</answer>",
        f"<answer>\n```python\n{_BODY}\n```\n</answer>",
    ],
)
def test_a_body_only_completion_scores_with_or_without_a_fence(answer: str) -> None:
    env = make_humaneval_env(limit=1)
    try:
        env.reset(seed=0)
        _, reward, terminated, _, _ = env.step(answer)
        assert terminated and reward == 1.0, env.unwrapped.episode.state["tests_passed"]
    finally:
        env.close()


@pytest.mark.parametrize("answer", ["-" * 100_000 + "1", "not " * 100_000 + "x", "f" + "()" * 100_000])
def test_an_answer_too_deep_for_the_parser_scores_zero_without_raising(answer: str) -> None:
    env = make_humaneval_env(limit=1)
    try:
        env.reset(seed=0)
        _, reward, terminated, _, _ = env.step(f"<answer>\n{answer}\n</answer>")
        assert terminated and reward == 0.0
    finally:
        env.close()


def test_mbpp_splits_are_the_datasets_own_and_disjoint() -> None:
    """Training on `train` and reporting on `test` uses MBPP's own splits (its README's task ids;
    Hugging Face's `mbpp` has the same sizes), with no task in two of them."""
    sizes = {"full": {"train": 374, "test": 500, "validation": 90, "prompt": 10}}
    sizes["sanitized"] = {"train": 120, "test": 257, "validation": 43, "prompt": 7}
    for subset, expected in sizes.items():
        ids = {split: {t.id for t in make_mbpp_env(subset=subset, split=split).tasks} for split in expected}
        assert {split: len(v) for split, v in ids.items()} == expected
        everything = {t.id for t in make_mbpp_env(subset=subset).tasks}
        assert set().union(*ids.values()) == everything and sum(expected.values()) == len(everything)
        if subset == "full":
            assert {"MBPP/11", "MBPP/510"} <= ids["test"] and {"MBPP/601", "MBPP/974"} <= ids["train"]
    with pytest.raises(ValueError, match="unknown MBPP split 'dev'"):
        make_mbpp_env(split="dev")


def test_mbpp_prompt_can_show_fewer_tests_than_are_graded() -> None:
    """`shown_tests=1`: the prompt shows one test (it names the function), all three are graded,
    so an answer special-casing the input it saw scores a third, not 1."""
    env = make_mbpp_env(split="test", shown_tests=1)
    try:
        obs, _ = env.reset(options={"task_id": "MBPP/11"})
        task = env.unwrapped.episode.task
        shown = [t for t in task.context["tests"] if t in obs]
        assert len(task.context["tests"]) == 3 and shown == task.context["tests"][:1]
        # The first test: remove_Occ("hello", "l") == "heo"; this answer knows only that one.
        seen = "<answer>def remove_Occ(s, ch):\n    return 'heo'</answer>"
        _, reward, terminated, _, _ = env.step(seen)
        assert terminated and reward == pytest.approx(1 / 3)
    finally:
        env.close()
    with pytest.raises(ValueError, match="shown_tests must be at least 1"):
        make_mbpp_env(shown_tests=0)


async def _oracle_scores(env_name: str, factory: object) -> list[float]:
    oracle = load("oracles", env_name)
    env = factory()  # type: ignore[operator]
    sem = asyncio.Semaphore(8)

    async def one(index: int) -> float:
        async with sem:
            e = factory(tasks=[env.tasks[index]])  # type: ignore[operator]
            obs, _ = await e.areset(seed=0)
            _, reward, terminated, _, _ = await e.astep(oracle(e.episode.task, 0, obs))
            await e.aclose()
            assert terminated
            return float(reward)

    return await asyncio.gather(*(one(i) for i in range(len(env.tasks))))


@pytest.mark.slow
async def test_oracles_score_one_on_every_task() -> None:
    start = time.monotonic()
    he = await _oracle_scores("HumanEval-v0", make_humaneval_env)
    mbpp = await _oracle_scores("MBPP-v0", make_mbpp_env)
    sanitized = await _oracle_scores("MBPP-v0", functools.partial(make_mbpp_env, subset="sanitized"))
    elapsed = time.monotonic() - start
    assert len(he) == 164 and len(mbpp) == 974 and len(sanitized) == 427
    assert [i for i, r in enumerate(he) if r != 1.0] == []
    assert [i for i, r in enumerate(mbpp) if r != 1.0] == []
    assert [i for i, r in enumerate(sanitized) if r != 1.0] == []
    print(f"oracles: 1565 tasks graded in {elapsed:.1f} s")


def test_example_runs() -> None:
    env = {**os.environ, "PYTHONPATH": ""}
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "code_example.py")],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert out.returncode == 0, out.stderr
    assert "reward 1.0" in out.stdout and "network=" in out.stdout, out.stdout + out.stderr


async def test_many_envs_share_one_pool() -> None:
    from toolenv_code.sandbox import get_pool

    envs = [make_mbpp_env(limit=4) for _ in range(64)]
    pool = get_pool()
    pids_before = {s["pid"] for s in pool.stats()}

    async def episode(i: int, env: toolenv.ToolEnv) -> str:
        await env.areset(seed=i)
        obs, *_ = await env.astep(f"```python\nprint({i} ** 2)\n```")
        return obs

    observations = await asyncio.gather(*(episode(i, e) for i, e in enumerate(envs)))
    assert observations == [f"```output\n{i * i}\n```" for i in range(64)]
    assert all(t.pool is pool for e in envs for t in e.tools)  # type: ignore[attr-defined]
    assert {s["pid"] for s in pool.stats()} == pids_before and len(pids_before) == pool.size
    for e in envs:
        await e.aclose()


async def test_a_session_killed_by_a_real_time_signal_is_an_observation() -> None:
    """A real-time signal (SIGRTMIN+1) has no `signal.Signals` member: the observation still
    says what ended the session instead of the tool failing with a ValueError."""
    from toolenv import Task, ToolEnv
    from toolenv_code.tool import PythonTool

    env = ToolEnv(tools=[PythonTool(stateful=True)], tasks=[Task(id="t", question="q", answer="a")], parser="codeblock")
    try:
        await env.areset()
        obs, *_, info = await env.astep("```python\nimport os, signal\nos.kill(os.getpid(), signal.SIGRTMIN + 1)\n```")
        assert "killed by SIGRTMIN+1" in obs and "session has ended" in obs, obs
        assert info["tool_results"][0].is_error
    finally:
        await env.aclose()


def test_tools_given_as_an_empty_list_mean_no_tools() -> None:
    """`tools=[]` (a baseline that answers without running code) is taken as given, not
    replaced by the default `python` tool; leaving `tools` out still gives that tool."""
    env = make_humaneval_env(tools=[], limit=1)
    try:
        assert env.tools == []
    finally:
        env.close()
    default = make_mbpp_env(limit=1)
    try:
        assert [t.name for t in default.tools] == ["python"]
    finally:
        default.close()
