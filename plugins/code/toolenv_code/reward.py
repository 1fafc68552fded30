"""`tests_passed`: the share of a task's hidden tests that the final answer passes (or, with
`all_or_nothing`, 1 only when it passes them all)."""

from __future__ import annotations

import math
from typing import Any

from toolenv.episode import Episode
from toolenv.rewards import Reward, record_reward_info, register_reward
from toolenv_code.grading import TestSpec, arun_tests
from toolenv_code.sandbox import SandboxPool

__all__ = ["TestsPassed"]


def _time_limit(name: str, value: Any) -> float:
    """`value` as a time limit in seconds: a finite number above 0.

    Raises:
        ValueError: it is not one; the message names `name`.
    """
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds > 0):
        raise ValueError(f"{name} must be a number of seconds above 0, got {value!r}")
    return seconds


def time_limits(test_timeout: Any = None, total_timeout: Any = None) -> dict[str, float]:
    """The grading's time limits that are given (not None), as `TestSpec` fields.

    Raises:
        ValueError: a limit is not a number of seconds above 0.
    """
    given = (("test_timeout", test_timeout), ("total_timeout", total_timeout))
    return {name: _time_limit(name, value) for name, value in given if value is not None}


class TestsPassed(Reward):
    """Fraction of `task.context["tests"]` passed, graded in the sandbox pool.

    Args:
        pool: the sandbox pool (by default the process's shared one).
        all_or_nothing: score 1 only when every test passes, else 0 (HumanEval's pass@1, the
            usual RL recipe). Grading then stops at the first test that runs out of time:
            nothing after it can change the score.
        test_timeout: seconds allowed per test, instead of the task's own
            (`task.context["test_timeout"]`, 5 s by default).
        total_timeout: seconds one sandboxed grading run may take, instead of the task's own
            (60 s by default); see `TestSpec.total_timeout`.

    `reward_info(episode)["tests_passed"]` holds the fraction (`fraction`, `passed`, `total`)
    whatever the score; the whole report (which tests passed, their errors, the solution's own
    error) is kept in `episode.state["tests_passed"]` for trajectories and debugging.
    """

    __test__ = False
    name = "tests_passed"

    def __init__(
        self,
        pool: SandboxPool | None = None,
        *,
        all_or_nothing: bool = False,
        test_timeout: float | None = None,
        total_timeout: float | None = None,
    ) -> None:
        if not isinstance(all_or_nothing, bool):  # a config's "false" would read as true
            raise ValueError(f"all_or_nothing must be true or false, got {all_or_nothing!r}")
        self.pool = pool
        self.all_or_nothing = all_or_nothing
        self.limits = time_limits(test_timeout, total_timeout)

    def _spec(self, context: dict[str, Any]) -> TestSpec:
        """The task's tests, with this reward's time limits over the task's own."""
        fields = {k: context[k] for k in TestSpec.model_fields if k in context}
        return TestSpec.model_validate({**fields, **self.limits})

    async def final(self, episode: Episode) -> float:
        ctx = episode.task.context
        if episode.answer is None or not ctx.get("tests"):
            return 0.0
        spec = self._spec(ctx)
        try:
            report = await arun_tests(episode.answer, spec, self.pool, stop_on_timeout=self.all_or_nothing)
        except (RuntimeError, OSError) as exc:  # the pool is closed or cannot start: no score, no crash
            episode.state["tests_passed"] = {"error": f"grading failed: {exc}"}
            return 0.0
        episode.state["tests_passed"] = report.model_dump()
        fraction = report.fraction
        score = float(all(report.passed)) if self.all_or_nothing else fraction
        record_reward_info(
            episode, self.name, fraction=fraction, passed=sum(report.passed), total=len(report.passed), score=score
        )
        return score


register_reward("tests_passed", TestsPassed)
