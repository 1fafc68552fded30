"""What a TRL tool call costs through toolenv, against the bare Python function TRL users write.

TRL's `GRPOTrainer` runs an environment's tool methods as `method(**arguments)`. The same
calculator is called both ways on the same arguments, with TRL's own calling convention:

- **bare function**: a method on a plain class that evaluates the expression (what a TRL
  environment without toolenv does: no validation, no limits, no record);
- **toolenv**: `environment_factory(env)()`'s method: one env step with Pydantic validation,
  the tool's timeout and truncation, the turn recorded for the reward, the result as text;
- and `reset` + `get_reward` per episode, the other two calls TRL makes.

Model generation on a GPU takes tens of milliseconds per turn; the figures say how much of
that a toolenv call adds. TRL itself is not needed (only its calling convention is used).
"""

from __future__ import annotations

from typing import Any

from _common import median, parse_args, repeat, table, write

import toolenv
from toolenv.integrations.trl import environment_factory
from toolenv.integrations.verl.demo import Calculator, evaluate

TASK = {"id": "q", "question": "What is 6 * 7?", "answer": "42"}
ARGS = {"expression": "6 * 7"}


class BareEnvironment:
    """A TRL environment written by hand: one tool, no checks."""

    def reset(self, **row: Any) -> str | None:
        self.calls = 0
        return None

    def calculator(self, expression: str) -> str:
        """Evaluate an arithmetic expression.

        Args:
            expression: The expression.
        """
        self.calls += 1
        return f"{evaluate(expression):g}"


def make() -> toolenv.ToolEnv:
    return toolenv.ToolEnv(tools=[Calculator()], tasks=[TASK], max_turns=10**9)


def main() -> None:
    args = parse_args(__doc__ or "")
    n = 500 if args.quick else 20_000
    bare = BareEnvironment()
    bare.reset()
    wrapped: Any = environment_factory(make)()  # its tool methods are made at run time
    wrapped.reset(task_id="q")
    assert bare.calculator(**ARGS) == wrapped.calculator(**ARGS) == "42"
    bare_s = median(repeat(lambda: bare.calculator(**ARGS), n))
    call_s = median(repeat(lambda: wrapped.calculator(**ARGS), n))

    def episode() -> None:
        wrapped.reset(task_id="q")
        wrapped.calculator(**ARGS)
        wrapped.answer(answer="42")
        wrapped.get_reward()

    episode_s = median(repeat(episode, max(1, n // 4)))
    wrapped.reset(task_id="q")
    wrapped.answer(answer="42")
    assert wrapped.get_reward() == 1.0
    rows = [
        ["bare function (no checks)", bare_s * 1e6, 1.0],
        ["toolenv tool method (one env step)", call_s * 1e6, call_s / bare_s],
        ["toolenv episode: reset, call, answer, get_reward", episode_s * 1e6, episode_s / bare_s],
    ]
    table(rows, ["TRL calls", "µs", "× bare"])
    added = call_s - bare_s
    print(f"per call, toolenv adds {added * 1e6:.1f} µs: {added / 0.02 * 100:.3f}% of a 20 ms generation turn")
    write(
        "trl",
        {
            "quick": args.quick,
            "n": n,
            "bare_call_us": bare_s * 1e6,
            "toolenv_call_us": call_s * 1e6,
            "toolenv_episode_us": episode_s * 1e6,
            "ratio_call": call_s / bare_s,
        },
        args.out,
    )


if __name__ == "__main__":
    main()
