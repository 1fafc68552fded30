"""A ReTool-style episode: run Python in ```python blocks, then answer in prose with a \\boxed{}.

ReTool, ToRL and SimpleTIR train a model that runs code until it knows the answer and then
writes its solution without a tool call; the reward is the last `\\boxed{}` of that reply,
compared with the gold answer as mathematics. Here a scripted policy (no model) plays both
turns: the gold is `0.5` and the policy answers `\\frac{1}{2}`, which `exact_match` would score 0.

Run: python examples/retool_example.py
(needs `pip install -e plugins/code` and `pip install 'toolenv[math]'`)
"""

from __future__ import annotations

import toolenv
from toolenv_code import PythonTool

TASKS = [
    {
        "id": "dice",
        "question": "Two fair dice are rolled. What is the probability that their sum is even?",
        "answer": "0.5",
    }
]

CODE = """```python
import sympy
even = sum((a + b) % 2 == 0 for a in range(1, 7) for b in range(1, 7))
print(sympy.Rational(even, 36))
```"""


def policy(observation: str, turn: int) -> str:
    """Turn 0 runs code; turn 1 reads its output and answers without a tool call."""
    if turn == 0:
        return "Let me count the outcomes.\n" + CODE
    printed = observation.split("```output\n", 1)[-1].split("```", 1)[0].strip()  # "1/2"
    numerator, denominator = printed.split("/")
    return (
        f"The code found {printed} of the outcomes.\nThe answer is $\\boxed{{\\frac{{{numerator}}}{{{denominator}}}}}$."
    )


def main() -> None:
    env = toolenv.ToolEnv(
        # ToRL-style code imports sympy in nearly every block: the sandbox imports it once, ahead
        # of every call (0.3-0.45 s a call otherwise).
        tools=[PythonTool(preload="sympy")],
        tasks=TASKS,
        parser="codeblock",
        no_call_is_answer=True,  # a reply with no ```python block is the final answer
        reward="math",
        max_turns=4,
    )
    try:
        observation, _ = env.reset(seed=0)
        for turn in range(4):
            action = policy(observation, turn)
            observation, reward, terminated, truncated, info = env.step(action)
            if terminated or truncated:
                break
            print(f"turn {turn}: python printed {[r.text.strip() for r in info['tool_results']]}")
        print(f"turn {turn}: answered {info['answer'].splitlines()[-1]!r}")
        print(f"reward={float(reward)} terminated={terminated} boxed={info['reward_info']['math']['extracted']}")
    finally:
        env.close()


if __name__ == "__main__":
    main()
