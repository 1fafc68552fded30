"""`tests_passed`'s options: all-or-nothing scoring (HumanEval pass@1), the per-test and total
grading time limits from gym.make and from the reward's spec, and grading that stops at the
first test that times out when nothing after it can change an all-or-nothing score."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest

from toolenv import Task
from toolenv.registry import load
from toolenv_code.envs import make_code_env
from toolenv_code.grading import TestSpec, run_tests
from toolenv_code.reward import TestsPassed

_WRONG = "<answer>\ndef has_close_elements(numbers, threshold):\n    return False\n</answer>"  # passes 3 of 7
_HANGS = "def f(x):\n    while True:\n        pass"


def _step(env: Any, text: str) -> tuple[float, dict[str, Any]]:
    _, reward, terminated, _, info = env.step(text)
    assert terminated
    return float(reward), info


def _task(tests: list[str], **context: Any) -> Task:
    return Task(id="t", question="write f", answer="", context={"tests": tests, **context})


def _graded(env: Any, answer: str) -> tuple[float, dict[str, Any]]:
    """Reward and grading report of `answer` on the env's first task."""
    env.reset(seed=0)
    reward, _ = _step(env, f"<answer>\n{answer}\n</answer>")
    return reward, env.unwrapped.episode.state["tests_passed"]


@pytest.mark.parametrize(
    "spec",
    [
        {"tests_passed": {"all_or_nothing": True}},
        [{"name": "tests_passed", "weight": 1.0, "all_or_nothing": True}],
    ],
    ids=["mapping", "list"],
)
def test_all_or_nothing_scores_a_partly_right_answer_zero_and_reports_the_fraction(spec: Any) -> None:
    env = gym.make("toolenv/HumanEval-v0", reward=spec)
    try:
        env.reset(options={"task_id": "HumanEval/0"})
        reward, info = _step(env, _WRONG)
        passed = env.unwrapped.episode.state["tests_passed"]["passed"]
        assert 0 < sum(passed) < len(passed)  # partly right: the fraction alone would pay for it
        assert reward == 0.0 and info["reward_components"]["tests_passed"] == 0.0
        details = info["reward_info"]["tests_passed"]
        assert details["fraction"] == pytest.approx(sum(passed) / len(passed))
        assert details["passed"] == sum(passed) and details["total"] == len(passed)
        env.reset(options={"task_id": "HumanEval/0"})
        oracle = load("oracles", "HumanEval-v0")
        reward, info = _step(env, oracle(env.unwrapped.episode.task, 0, ""))
        assert reward == 1.0 and info["reward_info"]["tests_passed"]["fraction"] == 1.0
    finally:
        env.close()


def test_the_default_still_pays_the_fraction_and_reports_it() -> None:
    env = gym.make("toolenv/HumanEval-v0")
    try:
        env.reset(options={"task_id": "HumanEval/0"})
        reward, info = _step(env, _WRONG)
        passed = env.unwrapped.episode.state["tests_passed"]["passed"]
        assert reward == pytest.approx(sum(passed) / len(passed)) and 0.0 < reward < 1.0
        assert info["reward_info"]["tests_passed"]["fraction"] == pytest.approx(reward)
    finally:
        env.close()


_SLEEPS = "import time\ndef f(x):\n    time.sleep(1.0)\n    return x"


def test_test_timeout_from_the_env_kwargs_replaces_the_tasks_own() -> None:
    tasks = [_task(["assert f(1) == 1"])]
    env = make_code_env(tasks, test_timeout=0.3)
    try:
        env.reset(seed=0)
        assert env.episode is not None and env.episode.task.context["test_timeout"] == 0.3
        reward, report = _graded(env, _SLEEPS)
        assert reward == 0.0 and "time limit" in report["messages"][0]
    finally:
        env.close()
    env = make_code_env(tasks)  # the default 5 s: a second is fine
    try:
        assert _graded(env, _SLEEPS)[0] == 1.0
    finally:
        env.close()


def test_test_timeout_from_gym_make() -> None:
    env = gym.make("toolenv/HumanEval-v0", test_timeout=0.3)
    try:
        env.reset(options={"task_id": "HumanEval/0"})
        assert env.unwrapped.episode.task.context["test_timeout"] == 0.3
        slow = "import time\ndef has_close_elements(numbers, threshold):\n    time.sleep(1.0)\n    return False"
        reward, _ = _step(env, f"<answer>\n{slow}\n</answer>")
        report = env.unwrapped.episode.state["tests_passed"]
        assert reward == 0.0 and all("time limit" in m for m in report["messages"])
    finally:
        env.close()


def test_the_reward_s_own_test_timeout_wins_over_the_env_s() -> None:
    tasks = [_task(["assert f(1) == 1"])]
    env = make_code_env(tasks, test_timeout=30, reward={"tests_passed": {"test_timeout": 0.3}})
    try:
        reward, report = _graded(env, _SLEEPS)
        assert reward == 0.0 and "time limit" in report["messages"][0]
    finally:
        env.close()


_TEN = [f"assert f({i}) == {i}" for i in range(10)]
_NAPS = "import time\ndef f(x):\n    time.sleep(0.6)\n    return x"  # 6 s in all, 0.6 s a test


@pytest.mark.parametrize("where", ["env", "reward"])
def test_total_timeout_caps_one_grading_run(where: str) -> None:
    """Ten tests of 0.6 s each fit the default cap; at `total_timeout=1` a run may take
    max(1, 2 × test_timeout) + 2 = 4 s, and the tests not reached by then fail."""
    tasks = [_task(_TEN, test_timeout=1.0)]
    kwargs: dict[str, Any] = (
        {"total_timeout": 1} if where == "env" else {"reward": {"tests_passed": {"total_timeout": 1}}}
    )
    env = make_code_env(tasks, **kwargs)
    try:
        reward, report = _graded(env, _NAPS)
        assert report["timed_out"] and 0.0 < reward < 1.0
    finally:
        env.close()
    env = make_code_env(tasks)
    try:
        reward, report = _graded(env, _NAPS)
        assert reward == 1.0 and not report["timed_out"]
    finally:
        env.close()


@pytest.mark.parametrize(
    ("setting", "value"),
    [("test_timeout", 0), ("test_timeout", -1), ("total_timeout", float("inf")), ("test_timeout", "soon")],
)
def test_bad_time_limits_are_refused_in_one_line(setting: str, value: Any) -> None:
    with pytest.raises(ValueError, match=setting) as env_error:
        make_code_env([_task(["assert f(1) == 1"])], **{setting: value})
    with pytest.raises(ValueError, match=setting) as reward_error:
        TestsPassed(**{setting: value})
    assert "\n" not in str(env_error.value) and "\n" not in str(reward_error.value)


def test_all_or_nothing_stops_grading_at_the_first_test_that_times_out() -> None:
    """After a test times out, an all-or-nothing score is 0 whatever the rest do: they are not run
    (a looping answer costs one test's time instead of every test's)."""
    tasks = [_task(["assert f(0) == 0", *_TEN[1:6]], test_timeout=0.5)]
    hangs_from_1 = "def f(x):\n    while x >= 1:\n        pass\n    return x"
    env = make_code_env(tasks, reward={"tests_passed": {"all_or_nothing": True}})
    try:
        reward, report = _graded(env, hangs_from_1)
        assert reward == 0.0 and report["passed"] == [True] + [False] * 5
        assert "time limit" in report["messages"][1]
        assert all(m.startswith("not run") and "timed out" in m for m in report["messages"][2:])
    finally:
        env.close()
    env = make_code_env(tasks)  # the fraction needs every test
    try:
        reward, report = _graded(env, hangs_from_1)
        assert all("time limit" in m for m in report["messages"][1:])
    finally:
        env.close()


def test_a_timeout_that_need_not_fail_its_test_does_not_stop_grading() -> None:
    """`f(1) == 1 or f(2) == 2`: the second call is behind `or`; its timeout fails nothing when
    the first holds, so the tests after it still run."""
    spec = TestSpec(tests=["assert f(1) == 1 or f(2) == 2", "assert f(3) == 3"], test_timeout=0.5)
    hangs_on_2 = "def f(x):\n    while x == 2:\n        pass\n    return x"
    report = run_tests(hangs_on_2, spec, stop_on_timeout=True)
    assert report.split == [True, True] and report.passed == [True, True], report.messages


@pytest.mark.parametrize("split", [True, False])
def test_run_tests_stop_on_timeout(split: bool) -> None:
    spec = TestSpec(tests=_TEN[:4], test_timeout=0.5, split_tests=split)
    report = run_tests(_HANGS, spec, stop_on_timeout=True)
    assert report.passed == [False] * 4 and "time limit" in report.messages[0], report.messages
    assert all(m.startswith("not run") for m in report.messages[1:]), report.messages


def test_the_code_page_s_options_example_builds_what_it_says() -> None:
    """docs/plugins/code.md's Options example, line by line (each line makes an env)."""
    page = (Path(__file__).resolve().parents[3] / "docs" / "plugins" / "code.md").read_text()
    options = page.split("**Options.**", 1)[1]
    (code,) = re.findall(r"^```python\n(.*?)^```", options, re.M | re.S)[:1]
    lines = code.strip().splitlines()
    envs = []
    try:
        for line in lines:
            scope: dict[str, Any] = {"gym": gym}
            exec(line, scope)
            envs.append(scope["env"].unwrapped)
        assert all(t.context["test_timeout"] == 2 and t.context["total_timeout"] == 30 for t in envs[0].tasks)
        (reward, _) = envs[1].reward_fn.parts["tests_passed"]
        assert isinstance(reward, TestsPassed) and reward.all_or_nothing and reward.limits == {"test_timeout": 2.0}
    finally:
        for env in envs:
            env.close()
