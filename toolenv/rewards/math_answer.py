"""`math`: a math answer checked against the gold with Hugging Face's math-verify (LaTeX-aware).

What ReTool, ToRL, SimpleTIR and most math RL recipes with a code tool score: the last
`\\boxed{...}` of the final reply, equal to the gold answer as mathematics (`\\frac{1}{2}` is
`0.5`, `2.0` is `2`, `x+1` is `1+x`), not as text. math-verify (`pip install 'toolenv[math]'`)
and the sympy it brings run in child processes (`_math_pool`), which a timeout kills: this
process never imports them.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
from typing import Any

from toolenv._tool import _in_thread
from toolenv.episode import Episode
from toolenv.rewards.base import Reward, record_reward_info, register_reward

__all__ = ["MathVerify"]

_MISSING = "the `math` reward needs math-verify: pip install 'toolenv[math]'"


@functools.cache
def _math_verify() -> Any:
    """The math-verify module, imported once (it imports sympy: seconds, and tens of MB).

    Raises:
        ImportError: it is not installed; one line saying how to install it.
    """
    try:
        import math_verify
    except ImportError:
        raise ImportError(_MISSING) from None
    # With its own timeouts off (see `MathVerify`) it warns once that the caller must bound the
    # work; this reward does, so the warning would only alarm users.
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    return math_verify


@functools.cache
def _answer_config() -> tuple[Any, ...]:
    """How the answer is read: a `\\boxed{}` first (its last one), then math-verify's own
    fallbacks (an "answer is ..." phrase, `$...$`, the last number or expression)."""
    mv = _math_verify()
    normalization = mv.LatexNormalizationConfig(
        basic_latex=True, units=True, malformed_operators=True, nits=True, boxed="last", equations=False
    )
    return (
        mv.LatexExtractionConfig(boxed_match_priority=0, normalization_config=normalization),
        mv.ExprExtractionConfig(),
    )


def _parse_gold(gold: str) -> list[Any]:
    """A gold answer as math-verify reads it: a bare answer (`0.5`, `x+1`, `\\frac{1}{2}`,
    `(1,2)`) is wrapped in `$...$`, as math-verify reads an expression only from LaTeX (a bare
    `x+1` parses to nothing); one already in `$` or `\\boxed{}` is read as written."""
    mv = _math_verify()
    text = gold.strip()
    if not text:
        return []
    wrapped = text if "$" in text or "\\boxed" in text else f"${text}$"
    return list(mv.parse(wrapped, parsing_timeout=None)) or list(mv.parse(text, parsing_timeout=None))


def _last_box_at(text: str) -> int:
    """Where the last `\\boxed` (or `\\fbox`) starts, -1 without one."""
    return max(text.rfind("\\boxed"), text.rfind("\\fbox"))


def _from_last_box(answer: str) -> str:
    """The answer from its last box on: math-verify itself joins boxes up to 70 characters
    apart into one answer of several values ("\\boxed{3}, no: \\boxed{2}" read as {3, 2}),
    where the recipes score the last box alone. Its own reading (braces, normalisation) is
    left to it; without a box, the whole answer."""
    start = _last_box_at(answer)
    return answer[start:] if start >= 0 else answer


def score(answer: str, golds: list[str], *, require_box: bool = False) -> tuple[float, dict[str, Any]]:
    """1.0 when `answer` equals any of `golds` as mathematics, else 0.0, and what was read.

    Blocking (sympy): the reward runs it on a worker thread. math-verify's signal-based
    timeouts are off (`parsing_timeout=None`, `timeout_seconds=None`): `signal.alarm` works
    only on the main thread, and would take over SIGALRM there.
    """
    mv = _math_verify()
    if require_box and _last_box_at(answer) < 0:
        return 0.0, {"extracted": None, "error": "no \\boxed{} in the answer"}
    predicted = mv.parse(_from_last_box(answer), extraction_config=_answer_config(), parsing_timeout=None)
    info: dict[str, Any] = {"extracted": str(predicted[-1]) if predicted else None}
    if not predicted:
        return 0.0, info
    for gold in golds:
        parsed = _parse_gold(gold)
        if parsed and mv.verify(parsed, predicted, timeout_seconds=None):
            return 1.0, {**info, "gold": gold}
    return 0.0, info


class MathVerify(Reward):
    """1.0 when the final answer is any gold answer as mathematics (math-verify), else 0.0.

    The answer's last `\\boxed{}` is what is compared (one answer of several values is one box,
    `\\boxed{1, 2}`; of `\\boxed{1}, \\boxed{2}` only the 2 counts). An answer with no box
    falls back to math-verify's reading of plain text: an "answer is ..." phrase, else its last
    number or expression (`"... so the result is 2"` scores as `2`); `require_box=True` scores
    it 0, as ReTool's strict box check does.

    Args:
        require_box: an answer without `\\boxed{}` scores 0.
        timeout: seconds one answer may take (sympy can take minutes on a power tower);
            past it the answer scores 0, `reward_info` says so, and the child process checking
            it is killed (a thread could not be stopped: sympy holds the GIL there). An answer
            math-verify fails on (an error sympy raises) scores 0 the same way.

    Raises:
        ImportError: math-verify is not installed (`pip install 'toolenv[math]'`).
    """

    name = "math"

    def __init__(self, require_box: bool = False, timeout: float = 10.0) -> None:
        if not timeout > 0:
            raise ValueError(f"the `math` reward's timeout must be a positive number of seconds, got {timeout!r}")
        self.require_box = bool(require_box)
        self.timeout = float(timeout)
        if not _installed():  # said when the env is built, not at the first episode's end
            raise ImportError(_MISSING)

    async def final(self, episode: Episode) -> float:
        from toolenv.rewards._math_pool import MathTimeout, shared_pool

        if episode.answer is None:
            return 0.0
        request = [episode.answer, list(episode.task.answers), self.require_box, self.timeout]
        # The pool blocks on a child's pipe: on a daemon thread, off the loop.
        try:
            result: dict[str, Any] = await _in_thread(shared_pool().score, request, {})
        except MathTimeout:
            record_reward_info(episode, self.name, error=f"math-verify took over {self.timeout:g} s; scored 0")
            return 0.0
        except (BrokenPipeError, OSError) as exc:
            record_reward_info(episode, self.name, error=f"math-verify failed: {exc}; scored 0")
            return 0.0
        if "error" in result:  # math-verify raised (sympy's errors are many): one odd answer scores 0
            record_reward_info(episode, self.name, error=f"math-verify failed: {result['error']}; scored 0")
            return 0.0
        record_reward_info(episode, self.name, **result["info"])
        return float(result["value"])


def _installed() -> bool:
    """Whether math-verify can be imported, without importing it (and sympy) here."""
    try:
        return importlib.util.find_spec("math_verify") is not None
    except ValueError:  # `sys.modules["math_verify"] = None`: blocked, as without the extra
        return False


register_reward("math", MathVerify)
