"""`tests_passed`: the share of a task's hidden tests that the final answer passes."""

from __future__ import annotations

from toolenv.episode import Episode
from toolenv.rewards import Reward, register_reward
from toolenv_code.grading import TestSpec, arun_tests
from toolenv_code.sandbox import SandboxPool

__all__ = ["TestsPassed"]


class TestsPassed(Reward):
    """Fraction of `task.context["tests"]` passed, graded in the sandbox pool.

    The report (which tests passed, the solution's error) is kept in
    `episode.state["tests_passed"]` for trajectories and debugging.
    """

    __test__ = False
    name = "tests_passed"

    def __init__(self, pool: SandboxPool | None = None) -> None:
        self.pool = pool

    async def final(self, episode: Episode) -> float:
        ctx = episode.task.context
        if episode.answer is None or not ctx.get("tests"):
            return 0.0
        spec = TestSpec.model_validate({k: ctx[k] for k in TestSpec.model_fields if k in ctx})
        try:
            report = await arun_tests(episode.answer, spec, self.pool)
        except (RuntimeError, OSError) as exc:  # the pool is closed or cannot start: no score, no crash
            episode.state["tests_passed"] = {"error": f"grading failed: {exc}"}
            return 0.0
        episode.state["tests_passed"] = report.model_dump()
        return report.fraction


register_reward("tests_passed", TestsPassed)
