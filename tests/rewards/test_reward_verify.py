"""Tool-verified rewards with a real Python-subprocess tool inside a ToolEnv."""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import pytest
from pydantic import BaseModel

import toolenv
from toolenv import Tool, ToolContext
from toolenv.episode import Episode
from toolenv.rewards import ToolVerified, reward_info
from toolenv.types import ToolResult


class Python(Tool):
    """Run Python code in a fresh interpreter; stdout comes back."""

    name = "python"

    class Args(BaseModel):
        code: str

    async def run(self, args: Any, ctx: ToolContext) -> ToolResult:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-I", "-c", args.code, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
        )
        out, err = await proc.communicate()
        if proc.returncode:
            return ToolResult.error(err.decode(errors="replace")[-500:], exit_code=proc.returncode)
        return ToolResult(text=out.decode(errors="replace"))


TASK = {
    "question": "Write a Python function square(x) and give its code as the answer.",
    "answer": "def square(x): return x * x",
    "context": {"tests": "assert square(3) == 9\nassert square(-2) == 4\nprint('ALL PASS')"},
}


def with_tests(ep: Episode) -> dict[str, str]:
    return {"code": f"{ep.answer}\n{ep.task.context['tests']}"}


def passed(result: ToolResult) -> float:
    return 1.0 if "ALL PASS" in result.text else 0.0


def run(actions: list[str], reward: Any) -> tuple[dict[str, float], float, toolenv.ToolEnv]:
    env = toolenv.ToolEnv(tools=[Python()], tasks=[TASK], parser="codeblock", reward=reward)
    env.reset(seed=0)
    for a in actions:
        _, r, term, trunc, info = env.step(a)
        if term or trunc:
            break
    env.close()
    return info["reward_components"], float(r), env


VERIFIED = ToolVerified(tool="python", build_args=with_tests, judge=passed, name="tests")


def test_correct_answer_passes_the_tests() -> None:
    actions = ["```python\nprint(3 * 3)\n```", "<answer>\ndef square(x):\n    return x ** 2\n</answer>"]
    comps, reward, env = run(actions, [(VERIFIED, 1.0), ("exact_match", 0.0)])
    assert comps == {"tests": 1.0, "exact_match": 0.0}
    assert reward == 1.0
    assert env.episode is not None
    assert env.episode.tool_calls == 1  # the verification call is not one of the model's calls
    assert "ALL PASS" in reward_info(env.episode)["tests"]["tool_output"]


def test_wrong_answer_fails_the_tests() -> None:
    comps, reward, env = run(["<answer>def square(x): return x + x</answer>"], VERIFIED)
    assert comps == {"tests": 0.0} and reward == 0.0
    assert env.episode is not None
    info = reward_info(env.episode)["tests"]
    assert "AssertionError" in info["error"]


def test_error_results_can_be_scored_by_the_judge() -> None:
    partial = ToolVerified(
        "python",
        with_tests,
        judge=lambda r: 0.5 if r.is_error and "AssertionError" in r.text else 1.0,
        score_errors=True,
        name="partial",
    )
    comps, _, _ = run(["<answer>def square(x): return x + x</answer>"], partial)
    assert comps == {"partial": 0.5}


def test_async_judge() -> None:
    async def judge(result: ToolResult) -> float:
        await asyncio.sleep(0)
        return float(result.text.count("PASS"))

    comps, _, _ = run(["<answer>square = lambda x: x * x</answer>"], ToolVerified("python", with_tests, judge))
    assert comps == {"tool_verified": 1.0}


@pytest.mark.parametrize(
    ("reward", "error"),
    [
        (ToolVerified("python", lambda ep: {"code": ep.task.context["missing"]}), "build_args failed: KeyError"),
        (ToolVerified("python", with_tests, judge=lambda r: 1 / 0), "judge failed: ZeroDivisionError"),
        (ToolVerified("nope", with_tests), "Unknown tool 'nope'"),
        (ToolVerified("python", lambda ep: {"source": "x"}), "for tool 'python'"),
    ],
)
def test_failures_score_zero_and_are_recorded(reward: ToolVerified, error: str) -> None:
    comps, reward_value, env = run(["<answer>def square(x): return x * x</answer>"], reward)
    assert comps == {"tool_verified": 0.0} and reward_value == 0.0
    assert env.episode is not None
    assert error in reward_info(env.episode)["tool_verified"]["error"]


def test_no_answer_is_not_verified() -> None:
    calls: list[Episode] = []

    def build(ep: Episode) -> dict[str, str]:
        calls.append(ep)
        return with_tests(ep)

    env = toolenv.ToolEnv(
        tools=[Python()], tasks=[TASK], parser="codeblock", reward=ToolVerified("python", build), max_turns=1
    )
    env.reset(seed=0)
    _, reward, _, truncated, info = env.step("```python\nprint(1)\n```")
    env.close()
    assert truncated and reward == 0.0 and calls == []
    assert env.episode is not None and reward_info(env.episode)["tool_verified"]["skipped"] == "no answer"


def test_build_args_returning_none_skips() -> None:
    comps, _, env = run(["<answer>x</answer>"], ToolVerified("python", lambda ep: None))
    assert comps == {"tool_verified": 0.0}
    assert env.episode is not None and "skipped" in reward_info(env.episode)["tool_verified"]


@pytest.mark.parametrize(
    ("reward", "error"),
    [
        (ToolVerified("python", with_tests, judge=lambda r: float("nan")), "judge returned nan"),
        (ToolVerified("python", with_tests, judge=lambda r: float("inf")), "judge returned inf"),
        (ToolVerified("python", lambda ep: "print(1)"), "build_args failed"),
        (ToolVerified("python", lambda ep: {1: "x"}), "build_args failed"),
    ],
)
def test_bad_judge_scores_and_arguments_score_zero_instead_of_raising(reward: ToolVerified, error: str) -> None:
    """The reward promises nothing raises: a NaN score would end the step with an error, and
    arguments that are not a mapping of names would escape `final`."""
    comps, reward_value, env = run(["<answer>def square(x): return x * x</answer>"], reward)
    assert comps == {"tool_verified": 0.0} and reward_value == 0.0
    assert env.episode is not None
    assert error in reward_info(env.episode)["tool_verified"]["error"]


class Lookup(Tool):
    """A tool whose argument is called `name` (a user, a file, a city...)."""

    name = "lookup"

    class Args(BaseModel):
        name: str

    async def run(self, args: Any, ctx: ToolContext) -> ToolResult:
        return ToolResult(text=f"found {args.name}")


def test_a_tool_with_an_argument_called_name_can_verify() -> None:
    """`episode.call_tool(tool, **arguments)` took the tool's name by keyword `name` too, so
    arguments with a `name` raised a TypeError out of `final` and ended the step."""
    reward = ToolVerified("lookup", lambda ep: {"name": ep.answer}, judge=lambda r: float(r.text == "found bob"))
    env = toolenv.ToolEnv(tools=[Lookup()], tasks=[{"question": "who?", "answer": "bob"}], reward=reward)
    env.reset(seed=0)
    _, r, term, _, info = env.step("<answer>bob</answer>")
    env.close()
    assert term and r == 1.0 and info["reward_components"] == {"tool_verified": 1.0}


@pytest.mark.parametrize("blank", ["<answer></answer>", "<answer> \n </answer>"])
def test_a_blank_answer_is_not_verified(blank: str) -> None:
    """`<answer></answer>` answers nothing, as for the judge, the format reward and the answer
    avoidance penalty: running it would pass a verifier whose tool accepts empty input (empty
    code runs without error, so the default judge scored it 1)."""
    runs_the_answer = ToolVerified("python", lambda ep: {"code": ep.answer or ""})
    comps, reward_value, env = run([blank], runs_the_answer)
    assert comps == {"tool_verified": 0.0} and reward_value == 0.0
    assert env.episode is not None and reward_info(env.episode)["tool_verified"]["skipped"] == "no answer"
    comps, reward_value, _ = run(["<answer>print(1)</answer>"], runs_the_answer)
    assert comps == {"tool_verified": 1.0}


def test_an_async_build_args_is_awaited() -> None:
    """`build_args` may be a coroutine function (it reads the task's tests from a store): its
    coroutine was taken for the arguments, failed as 'not iterable' and scored 0 (never awaited)."""

    async def build(ep: Episode) -> dict[str, str]:
        await asyncio.sleep(0)
        return with_tests(ep)

    async def build_none(ep: Episode) -> None:
        await asyncio.sleep(0)

    async def build_fails(ep: Episode) -> dict[str, str]:
        raise KeyError("tests")

    comps, reward_value, _ = run(["<answer>square = lambda x: x * x</answer>"], ToolVerified("python", build, passed))
    assert comps == {"tool_verified": 1.0} and reward_value == 1.0
    comps, _, env = run(["<answer>x</answer>"], ToolVerified("python", build_none))
    assert comps == {"tool_verified": 0.0}
    assert (
        env.episode is not None and reward_info(env.episode)["tool_verified"]["skipped"] == "build_args returned None"
    )
    comps, _, env = run(["<answer>x</answer>"], ToolVerified("python", build_fails))
    assert comps == {"tool_verified": 0.0}
    assert (
        env.episode is not None and "build_args failed: KeyError" in reward_info(env.episode)["tool_verified"]["error"]
    )
