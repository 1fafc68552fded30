"""`check_env` / `check_tool`: Gymnasium's checker plus toolenv's own checks.

Modelled on `gymnasium.utils.env_checker`: a flat list of small `check_*`
functions, each raising `CheckFailed` with a precise message.
"""

from __future__ import annotations

import asyncio
import json
import re
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from toolenv._tool import Tool, ToolContext
from toolenv.env import ToolEnv
from toolenv.types import Task

__all__ = ["CheckFailed", "CheckResult", "check_env", "check_tool"]


class CheckFailed(AssertionError):
    """One check did not hold."""


@dataclass(frozen=True)
class CheckResult:
    """The outcome of one named check."""

    name: str
    ok: bool
    message: str = ""


def _walk(node: Any) -> list[dict[str, Any]]:
    if isinstance(node, dict):
        return [node, *(d for v in node.values() for d in _walk(v))]
    if isinstance(node, list):
        return [d for v in node for d in _walk(v)]
    return []


#: The function names the OpenAI API (and servers that follow it) accept.
_TOOL_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")


def check_tool_schema(tool: Tool) -> None:
    """The tool has a name, a description, and schemas that serialise and flatten."""
    if not _TOOL_NAME.fullmatch(tool.name or ""):
        raise CheckFailed(
            f"tool name {tool.name!r} must be 1 to 64 ASCII letters, digits, '_' or '-' (the OpenAI API's pattern)"
        )
    if not tool.description.strip():
        raise CheckFailed(f"tool {tool.name!r} has no description (set `description` or a docstring)")
    schema = tool.schema()
    json.dumps(schema)
    params = schema["function"]["parameters"]
    if params.get("type") != "object":
        raise CheckFailed(f"tool {tool.name!r}: parameters must be a JSON object schema")
    flat = tool.flat_schema()
    bad = [d for d in _walk(flat["function"]["parameters"]) if "$ref" in d or "anyOf" in d or "oneOf" in d]
    if bad:
        raise CheckFailed(f"tool {tool.name!r}: flat schema still has $ref/anyOf: {json.dumps(bad[0])[:200]}")


def check_tool_rejects_bad_arguments(tool: Tool) -> None:
    """Calling the tool with junk arguments gives an error result, not an exception."""
    from toolenv.caller import ToolCaller
    from toolenv.types import ToolCall

    async def go() -> None:
        caller = ToolCaller([tool])
        results, _ = await caller.invoke(
            [ToolCall(name=tool.name, arguments={"__not_an_argument__": [1, {"x": None}]}, id="c0")],
            ToolContext(task=Task(id="check")),
        )
        if not results[0].is_error:
            raise CheckFailed(f"tool {tool.name!r} accepted an unknown argument; its Args model should forbid extras")

    asyncio.run(go())


#: Terminal colour codes (Gymnasium colours its warnings).
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def check_gymnasium(env: ToolEnv) -> None:
    """Gymnasium's own `check_env`. It reports some problems only as warnings (`close()` that
    raises when called again, an observation outside its space); each is a failure here."""
    from pathlib import Path

    from gymnasium.utils.env_checker import check_env as gym_check_env

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        gym_check_env(env, skip_render_check=True)
    said: list[str] = []
    for w in caught:
        if "gymnasium" in Path(w.filename).parts:
            said.append(_ANSI.sub("", str(w.message)).removeprefix("WARN: "))
        else:  # the env's own warnings are not the checker's: shown as usual
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    if said:
        raise CheckFailed("; ".join(dict.fromkeys(said)))


def check_reset_gives_prompt(env: ToolEnv) -> None:
    """Reset returns a non-empty text prompt and typed messages."""
    obs, info = env.reset(seed=0)
    if not isinstance(obs, str) or not obs.strip():
        raise CheckFailed("reset() must return a non-empty prompt")
    if not info.get("messages"):
        raise CheckFailed("reset() info must carry 'messages' (the prompt as chat messages)")


def check_error_paths(env: ToolEnv) -> None:
    """Malformed output, unknown tools and bad arguments come back as error observations."""
    probes = ["", "\x00<tool_call>{broken", "<answer", "<" * 1000]
    # Calls the parser can write (`format_call`): an unknown tool, and real tools with an unknown argument.
    calls: list[tuple[str, dict[str, Any]]] = [("__no_such_tool__", {})]
    calls += [(t.name, {"__junk__": 1}) for t in env.tools[:3]]
    probes += [text for name, args in calls if (text := env.parser.format_call(name, args)) is not None]
    for probe in probes:
        env.reset(seed=0)
        try:
            obs, _, _, _, info = env.step(probe)
        except Exception as exc:
            raise CheckFailed(f"step({probe[:40]!r}) raised {type(exc).__name__}: {exc}") from exc
        if not any(r.is_error for r in info["tool_results"]):
            raise CheckFailed(f"step({probe[:40]!r}) gave no error observation: {obs[:120]!r}")


def check_determinism(env: ToolEnv) -> None:
    """The same seed and actions give the same observations and rewards."""
    actions = ["<answer>x</answer>"] if not env.tools else ["hello", "<answer>x</answer>"]
    runs = []
    for _ in range(2):
        obs, _ = env.reset(seed=123)
        trace: list[Any] = [obs]
        for a in actions:
            o, r, term, trunc, _ = env.step(a)
            trace.append((o, float(r), term, trunc))
            if term or trunc:
                break
        runs.append(trace)
    if runs[0] != runs[1]:
        raise CheckFailed("two runs with seed=123 and the same actions differ")


def check_async_twins(env: ToolEnv) -> None:
    """`areset`/`astep` agree with `reset`/`step`."""
    sync_obs, _ = env.reset(seed=5)
    sync_step = env.step("<answer>x</answer>")

    async def go() -> tuple[str, Any]:
        obs, _ = await env.areset(seed=5)
        return obs, await env.astep("<answer>x</answer>")

    # run the async twin in a fresh thread-free loop: the env's private loop is idle here
    a_obs, a_step = asyncio.run(go())
    if a_obs != sync_obs or a_step[:4] != sync_step[:4]:
        raise CheckFailed("areset/astep disagree with reset/step for the same seed and action")


def check_chat_template(env: ToolEnv, tokenizer: Any) -> str:
    """The env's parser reads tool calls as the model's chat template writes them (for a model
    family's own formats; a prompted format such as `tags` is taught by the env's instructions)."""
    from toolenv.parsers import template_mismatch

    if not env.parser.tool_messages:
        return f"{env.parser.name!r} is a prompted format: the env's instructions teach it"
    problem = template_mismatch(env.parser, tokenizer)
    if problem is not None:
        raise ValueError(problem)
    return f"{env.parser.name!r} reads the calls the chat template writes"


ENV_CHECKS: list[Callable[[ToolEnv], None]] = [
    check_reset_gives_prompt,
    check_gymnasium,
    check_error_paths,
    check_determinism,
    check_async_twins,
]


def _run(name: str, fn: Callable[[], object]) -> CheckResult:
    try:
        note = fn()
    except Exception as exc:  # noqa: BLE001 - a checker reports every failure
        from toolenv.cli import error_line  # one line that keeps a ValidationError's fields

        return CheckResult(name, False, error_line(exc))
    return CheckResult(name, True, note if isinstance(note, str) else "")


def check_tool(tool: Tool) -> list[CheckResult]:
    """Run every tool check."""
    return [
        _run("tool_schema", lambda: check_tool_schema(tool)),
        _run("tool_rejects_bad_arguments", lambda: check_tool_rejects_bad_arguments(tool)),
    ]


def check_env(env: ToolEnv, tokenizer: Any = None) -> list[CheckResult]:
    """Run every env check, then the tool checks of its tools; with a Hugging Face `tokenizer`,
    also whether the env's parser reads the calls its chat template writes."""
    results = [_run(fn.__name__.removeprefix("check_"), lambda fn=fn: fn(env)) for fn in ENV_CHECKS]  # type: ignore[misc]
    if tokenizer is not None:
        results.append(_run("chat_template", lambda: check_chat_template(env, tokenizer)))
    for t in env.tools:
        results += [CheckResult(f"{r.name}[{t.name}]", r.ok, r.message) for r in check_tool(t)]
    return results
