"""The child process of the `math` reward: reads requests as JSON lines on stdin, answers each
on stdout (`python -m toolenv.rewards._math_child`).

sympy evaluates some answers (a power tower, `\\boxed{9^{9^{9^{9}}}}`) in one C call that
holds the GIL for minutes: on a thread of the trainer's process nothing else runs meanwhile, not
even a signal handler (SIGTERM went unanswered). A child process can be killed at its timeout.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any


def _answer(request: dict[str, Any]) -> dict[str, Any]:
    from toolenv.rewards.math_answer import score

    try:
        value, info = score(request["answer"], request["golds"], require_box=bool(request["require_box"]))
    except Exception as exc:  # noqa: BLE001 - sympy's errors are many: the parent scores the answer 0
        return {"error": f"{type(exc).__name__}: {exc}"}
    return {"value": value, "info": info}


def main() -> None:
    """Serve until stdin closes (the parent exited or let this child go)."""
    out = os.fdopen(os.dup(sys.stdout.fileno()), "w", encoding="utf-8")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # a stray print must not garble the answers
    try:
        from toolenv.rewards.math_answer import _math_verify

        _math_verify()  # sympy's import (a second or so) is paid before the first answer's clock starts
    except ImportError as exc:
        out.write(json.dumps({"error": str(exc)}) + "\n")
        out.flush()
        return
    out.write(json.dumps({"ready": True}) + "\n")
    out.flush()
    for line in sys.stdin:
        out.write(json.dumps(_answer(json.loads(line))) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
