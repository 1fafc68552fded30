"""The `math` reward: the last `\\boxed{}` of the answer against the gold with math-verify."""

from __future__ import annotations

import asyncio
import concurrent.futures
import subprocess
import sys
import threading
import time

import pytest
from _tools import Add

import toolenv
from toolenv.rewards import get_reward

pytest.importorskip("math_verify", reason="the `math` reward needs the math extra: pip install 'toolenv[math]'")


def score(answer: str, gold: str | list[str], **reward: object) -> tuple[float, dict[str, object]]:
    """The final reward of an episode answered `answer` with the `<answer>` tag, and its info."""
    spec = {"math": dict(reward)} if reward else "math"
    env = toolenv.ToolEnv(tools=[Add()], tasks=[{"question": "?", "answer": gold}], reward=spec)  # type: ignore[arg-type]
    env.reset(seed=0)
    _, value, term, _, info = env.step(f"<answer>{answer}</answer>")
    env.close()
    assert term
    return float(value), info


@pytest.mark.parametrize(
    ("answer", "gold", "expected"),
    [
        (r"So the probability is \boxed{\frac{1}{2}}.", "0.5", 1.0),
        (r"\boxed{2.0}", "2", 1.0),
        (r"\boxed{3}", "2", 0.0),
        (r"\boxed{1+x}", "x+1", 1.0),  # a bare LaTeX gold is read as an expression, not as text
        (r"\boxed{0.5}", r"\frac{1}{2}", 1.0),
        (r"\boxed{1000}", "1,000", 1.0),
        (r"\boxed{x+2}", "x+1", 0.0),
    ],
)
def test_the_boxed_answer_is_compared_as_mathematics(answer: str, gold: str, expected: float) -> None:
    assert score(answer, gold)[0] == expected


def test_the_last_box_is_the_answer() -> None:
    reply = r"At first I thought it was \boxed{3}, but checking the case n = 0 again gives \boxed{2}"
    assert score(reply, "2")[0] == 1.0
    assert score(reply, "3")[0] == 0.0


def test_of_boxes_side_by_side_only_the_last_counts() -> None:
    """math-verify alone reads `\\boxed{2}, \\boxed{3}` as the set {2, 3}; the recipes score the
    last box, and listing guesses in boxes wins nothing."""
    assert score(r"\boxed{2}, \boxed{3}", "3")[0] == 1.0
    assert score(r"\boxed{2}, \boxed{3}", "2")[0] == 0.0
    assert score(r"\boxed{2, 3}", "{2, 3}")[0] == 1.0  # several values are one box
    assert score(r"so $x = \boxed{2}$.", "2")[0] == 1.0


def test_without_a_box_math_verify_reads_the_last_number_unless_a_box_is_required() -> None:
    reply = "Adding 7 and 5 gives 12, and half of that is 6"
    assert score(reply, "6")[0] == 1.0
    assert score(reply, "12")[0] == 0.0
    value, info = score(reply, "6", require_box=True)
    assert value == 0.0
    assert "no \\boxed{}" in info["reward_info"]["math"]["error"]
    assert score(r"so \boxed{6}", "6", require_box=True)[0] == 1.0


def test_any_gold_alias_counts() -> None:
    golds = ["-4", "4"]
    assert score(r"\boxed{4}", golds)[0] == 1.0
    assert score(r"\boxed{-4}", golds)[0] == 1.0
    assert score(r"\boxed{5}", golds)[0] == 0.0
    value, info = score(r"\boxed{4.0}", golds)
    assert value == 1.0 and info["reward_info"]["math"]["gold"] == "4"


def test_an_unreadable_answer_scores_zero() -> None:
    value, info = score(r"\boxed{", "2")
    assert value == 0.0 and info["reward_info"]["math"]["extracted"] is None


def test_a_spec_by_name_with_format() -> None:
    env = toolenv.ToolEnv(
        tools=[Add()],
        tasks=[{"question": "1/2 as a decimal?", "answer": "0.5"}],
        reward={"math": 1.0, "format": 0.1},
    )
    env.reset(seed=0)
    _, value, term, _, info = env.step(r"<answer>\boxed{\frac{1}{2}}</answer>")
    env.close()
    assert term
    assert info["reward_components"]["math"] == 1.0
    assert value == pytest.approx(1.0 + 0.1 * info["reward_components"]["format"])
    assert "math" in toolenv.rewards.reward_names()


def test_scoring_from_many_threads_and_the_loop_at_once() -> None:
    """math-verify's own timeouts use `signal.alarm`, which raises off the main thread: the reward
    turns them off, so episodes scored on a pool's threads (each env on its own loop) and many
    scored at once on one loop all get their right score."""
    cases = [(rf"\boxed{{\frac{{{2 * i}}}{{2}}}}", str(i), 1.0) for i in range(12)]
    cases += [(rf"\boxed{{{i + 1}}}", str(i), 0.0) for i in range(12)]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        got = list(pool.map(lambda c: score(c[0], c[1])[0], cases))
    assert got == [c[2] for c in cases]

    async def on_one_loop() -> list[float]:
        envs = [
            toolenv.ToolEnv(tools=[Add()], tasks=[{"question": "?", "answer": g}], reward="math") for _, g, _ in cases
        ]
        for env in envs:
            await env.areset(seed=0)
        steps = await asyncio.gather(*(env.astep(f"<answer>{a}</answer>") for env, (a, _, _) in zip(envs, cases)))
        for env in envs:
            await env.aclose()
        return [float(s[1]) for s in steps]

    assert asyncio.run(on_one_loop()) == [c[2] for c in cases]
    assert threading.current_thread() is threading.main_thread()  # and the main thread's loop too, above


def test_an_answer_past_its_timeout_scores_zero_and_the_process_goes_on() -> None:
    """A power tower keeps sympy in one C call holding the GIL for minutes: on a thread of this
    process nothing else would run (signals neither). The child checking it is killed at the
    timeout; the loop kept running meanwhile, and the next answer gets a new child."""

    async def run() -> tuple[float, dict[str, object], int, float]:
        env = toolenv.ToolEnv(tools=[Add()], tasks=[{"question": "?", "answer": "2"}], reward={"math": {"timeout": 1}})
        await env.areset(seed=0)
        await env.astep(r"<answer>\boxed{2}</answer>")  # a child is up: its start is not the tower's time
        await env.areset(seed=0)
        ticks = 0

        async def tick() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.05)
                ticks += 1

        ticker = asyncio.ensure_future(tick())
        start = time.monotonic()
        _, value, _, _, info = await env.astep(r"<answer>\boxed{9^{9^{9^{9}}}}</answer>")
        took = time.monotonic() - start
        ticker.cancel()
        await env.aclose()
        return float(value), info, ticks, took

    value, info, ticks, took = asyncio.run(run())
    assert value == 0.0
    assert info["reward_info"]["math"]["error"] == "math-verify took over 1 s; scored 0"
    assert took < 30 and ticks >= 5  # bounded, and the loop ran while the child worked
    assert score(r"\boxed{2}", "2")[0] == 1.0  # a new child took the killed one's place


def test_a_child_killed_while_idle_is_replaced() -> None:
    from toolenv.rewards._math_pool import shared_pool

    assert score(r"\boxed{2}", "2")[0] == 1.0
    pool = shared_pool()
    for child in list(pool._all):
        child.proc.kill()  # an OOM killer's doing, between two answers
    assert score(r"\boxed{\frac{1}{2}}", "0.5")[0] == 1.0


def test_an_error_in_the_check_scores_zero_and_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    """The child answers an error math-verify raised as such; the reward scores it 0 and says why."""
    from toolenv.rewards import _math_child, _math_pool, math_answer

    def broken(*args: object, **kwargs: object) -> tuple[float, dict[str, object]]:
        raise RecursionError("maximum recursion depth exceeded")  # what sympy raises on a deep expression

    monkeypatch.setattr(math_answer, "score", broken)
    answered = _math_child._answer({"answer": r"\boxed{2}", "golds": ["2"], "require_box": False})
    assert answered == {"error": "RecursionError: maximum recursion depth exceeded"}

    class Pool:
        def score(self, *args: object) -> dict[str, object]:
            return answered

    monkeypatch.setattr(_math_pool, "shared_pool", lambda: Pool())
    value, info = score(r"\boxed{2}", "2")
    assert value == 0.0
    assert info["reward_info"]["math"]["error"] == (
        "math-verify failed: RecursionError: maximum recursion depth exceeded; scored 0"
    )


def test_a_bad_timeout_is_refused() -> None:
    with pytest.raises(ValueError, match="timeout must be a positive number"):
        get_reward({"math": {"timeout": 0}})


def _python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_import_toolenv_and_its_rewards_stays_light() -> None:
    out = _python(
        "import sys, toolenv, toolenv.rewards; toolenv.ToolEnv; toolenv.rewards.get_reward('f1'); "
        "print(sorted(m for m in ('math_verify', 'sympy', 'latex2sympy2_extended') if m in sys.modules))"
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_without_the_extra_building_the_reward_says_how_to_install_it() -> None:
    out = _python(
        "import sys; sys.modules['math_verify'] = None\n"  # what an environment without the extra has
        "import toolenv\n"
        "try:\n"
        "    toolenv.ToolEnv(tools=[], tasks=[{'question': 'q', 'answer': '1'}], reward='math')\n"
        "except ImportError as e:\n"
        "    print(e)\n"
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "the `math` reward needs math-verify: pip install 'toolenv[math]'"
