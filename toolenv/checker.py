"""`check_env` / `check_tool`: Gymnasium's checker plus toolenv's own checks.

Modelled on `gymnasium.utils.env_checker`: a flat list of small `check_*`
functions, each raising `CheckFailed` with a precise message.
"""

from __future__ import annotations

import json
import math
import re
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from toolenv import _aio
from toolenv._schema import local_ref_target
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


#: The function names the OpenAI API (and servers that follow it) accept.
_TOOL_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")


#: Keywords whose values are data, not schemas: a `$ref` key inside them is the data's own.
_DATA_KEYS = frozenset({"default", "const", "enum", "examples", "example"})

#: What `toolenv check` says when it cannot validate schemas, and how to make it.
SCHEMA_NOT_VALIDATED = "parameters not validated as JSON Schema: jsonschema is not installed (pip install jsonschema)"


def _schema_nodes(node: Any) -> list[dict[str, Any]]:
    """Every object of a JSON schema, except the data inside `default`, `enum` and the like."""
    if isinstance(node, list):
        return [d for v in node for d in _schema_nodes(v)]
    if not isinstance(node, dict):
        return []
    return [node, *(d for k, v in node.items() if k not in _DATA_KEYS for d in _schema_nodes(v))]


def _resolves(ref: str, root: dict[str, Any]) -> bool:
    """Whether `ref` points into `root` (`#`, a JSON pointer `#/...`, or an `$anchor`), the only
    references a server follows: it fetches nothing."""
    base, _, fragment = ref.partition("#")
    if base and base != root.get("$id"):
        return False
    return isinstance(local_ref_target(root, fragment), (dict, bool))


def _schema_error(params: dict[str, Any]) -> str | None:
    """What makes `params` an invalid JSON Schema, by its own `$schema` draft (2020-12 when it
    names none); None when it is valid. Raises ImportError without `jsonschema`, which is
    not a core dependency."""
    import jsonschema  # type: ignore[import-untyped, unused-ignore]  # stubs optional

    cls = jsonschema.validators.validator_for(params, default=jsonschema.Draft202012Validator)
    try:
        cls.check_schema(params)
    except jsonschema.SchemaError as exc:
        where = "/".join(map(str, exc.path))
        return f"{exc.message} (at {where or 'the top level'})"
    return None


def check_tool_schema(tool: Tool) -> str:
    """The tool has a name, a description, and a parameters schema that a server takes: JSON,
    an object schema, a valid JSON Schema (when `jsonschema` is installed) whose `$ref`s
    resolve inside it, and that flattens. Returns a note when it could not validate the schema."""
    if not _TOOL_NAME.fullmatch(tool.name or ""):
        raise CheckFailed(
            f"tool name {tool.name!r} must be 1 to 64 ASCII letters, digits, '_' or '-' (the OpenAI API's pattern)"
        )
    if not tool.description.strip():
        raise CheckFailed(f"tool {tool.name!r} has no description (set `description` or a docstring)")
    schema = tool.schema()
    try:
        json.dumps(schema, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise CheckFailed(f"tool {tool.name!r}: its schema is not JSON: {exc}") from None
    params = schema["function"]["parameters"]
    if not isinstance(params, dict) or params.get("type") != "object":
        raise CheckFailed(
            f'tool {tool.name!r}: parameters must be a JSON object schema ("type": "object" at the top), '
            f"got {json.dumps(params)[:200]}"
        )
    note = ""
    try:
        problem = _schema_error(params)
    except ImportError:
        note = SCHEMA_NOT_VALIDATED
    else:
        if problem is not None:
            raise CheckFailed(f"tool {tool.name!r}: parameters are not a valid JSON Schema: {problem}")
    refs = [d["$ref"] for d in _schema_nodes(params) if isinstance(d.get("$ref"), str)]
    unresolved = [r for r in refs if not _resolves(r, params)]
    if unresolved:
        raise CheckFailed(f"tool {tool.name!r}: parameters have a $ref that resolves nowhere: {unresolved[0]!r}")
    flat = tool.flat_schema()
    bad = [d for d in _schema_nodes(flat["function"]["parameters"]) if "$ref" in d or "anyOf" in d or "oneOf" in d]
    if bad:
        raise CheckFailed(f"tool {tool.name!r}: flat schema still has $ref/anyOf: {json.dumps(bad[0])[:200]}")
    return note


def _takes_any_argument(tool: Tool) -> bool:
    """Whether the tool's schema admits arguments of any name and value (`"additionalProperties":
    true`, as an MCP server may declare): junk arguments are then valid arguments."""
    params = tool.schema()["function"]["parameters"]
    return isinstance(params, dict) and params.get("additionalProperties") in (True, {})


def check_tool_rejects_bad_arguments(tool: Tool) -> str:
    """Calling the tool with junk arguments gives an error result, not an exception. A tool
    whose schema admits any argument is not called (a junk call would be a real call)."""
    from toolenv.caller import ToolCaller
    from toolenv.types import ToolCall

    if _takes_any_argument(tool):
        return "not tried: the schema admits any argument (additionalProperties: true)"

    async def go() -> None:
        caller = ToolCaller([tool])
        results, _ = await caller.invoke(
            [ToolCall(name=tool.name, arguments={"__not_an_argument__": [1, {"x": None}]}, id="c0")],
            ToolContext(task=Task(id="check")),
        )
        if not results[0].is_error:
            raise CheckFailed(f"tool {tool.name!r} accepted an unknown argument; its Args model should forbid extras")

    _aio.call_off_loop(_aio.run, go())  # a worker thread's loop inside a running one (a notebook)
    return ""


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
    """Malformed output, unknown tools and bad arguments come back as error observations (in an
    env with `no_call_is_answer`, text without a call may be the final answer instead)."""
    probes = ["", "\x00<tool_call>{broken", "<answer", "<" * 1000]
    # Calls the parser can write (`format_call`): an unknown tool, and real tools with an unknown argument.
    calls: list[tuple[str, dict[str, Any]]] = [("__no_such_tool__", {})]
    calls += [(t.name, {"__junk__": 1}) for t in [t for t in env.tools if not _takes_any_argument(t)][:3]]
    probes += [text for name, args in calls if (text := env.parser.format_call(name, args)) is not None]
    for probe in probes:
        env.reset(seed=0)
        try:
            obs, _, _, _, info = env.step(probe)
        except Exception as exc:
            raise CheckFailed(f"step({probe[:40]!r}) raised {type(exc).__name__}: {exc}") from exc
        answered = getattr(env, "no_call_is_answer", False) and info["action"].answer is not None
        if not answered and not any(r.is_error for r in info["tool_results"]):
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

    # on a loop of their own (a worker thread's, inside a running one): the env's private loop is idle here
    a_obs, a_step = _aio.call_off_loop(_aio.run, go())
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


# The sample arguments below are written here: hypothesis-jsonschema draws values from a JSON
# schema, but it is a test-time dependency, and a check needs only the plainest valid value.
class _NoSample(Exception):
    """A schema the sample arguments cannot be built for."""


def _sample_number(schema: dict[str, Any], integer: bool) -> float:
    """A number within the schema's bounds: 0 or 1 if allowed, else near a bound."""
    lo, hi = schema.get("minimum"), schema.get("maximum")
    xlo, xhi = schema.get("exclusiveMinimum"), schema.get("exclusiveMaximum")

    def fits(v: float) -> bool:
        return (
            (lo is None or v >= lo)
            and (hi is None or v <= hi)
            and (xlo is None or v > xlo)
            and (xhi is None or v < xhi)
        )

    bounds = [b for b in (lo, hi, xlo, xhi) if isinstance(b, int | float)]
    candidates: list[float] = [0, 1, *bounds, *(b + 1 for b in bounds), *(b - 1 for b in bounds)]
    if len(bounds) >= 2:
        candidates.append((min(bounds) + max(bounds)) / 2)
    for c in candidates:
        v = math.ceil(c) if integer else c
        if fits(v):
            return v
    raise _NoSample(f"no number fits {json.dumps(schema)[:80]}")


def _sample_value(schema: Any) -> Any:
    """The plainest value a (flattened) JSON schema admits: its default, const, first enum value
    or example, else a value of its type meeting its bounds (a non-empty string: an empty one is
    what a tool most often refuses before doing anything)."""
    if not isinstance(schema, dict):
        raise _NoSample("a schema that is no object")
    for key in ("default", "const"):
        if key in schema:
            return schema[key]
    for key in ("enum", "examples"):
        if isinstance(schema.get(key), list) and schema[key]:
            return schema[key][0]
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "string":
        return "x" * max(int(schema.get("minLength", 1)), 1)
    if kind in ("integer", "number"):
        return _sample_number(schema, kind == "integer")
    if kind == "boolean":
        return False
    if kind == "null":
        return None
    if kind == "array":
        return [_sample_value(schema.get("items", {})) for _ in range(int(schema.get("minItems", 0)))]
    if kind == "object" or "properties" in schema:
        return _sample_object(schema)
    raise _NoSample(f"no value for {json.dumps(schema)[:80]}")


def _sample_object(schema: dict[str, Any]) -> dict[str, Any]:
    """The object's required properties, each with its sample value (the rest take their defaults)."""
    props = schema.get("properties", {})
    return {name: _sample_value(props.get(name, {})) for name in schema.get("required", [])}


#: The error results the caller makes for a tool's own bug (a `run` that returns a str, or is
#: no `async def`, a ToolResult of the wrong types), as opposed to an error the tool reports.
_TOOL_BUG = re.compile(r"Tool '[^\n]*' (?:is broken: |returned .*\(a bug in the tool\)\.$)", re.S)


def check_tool_runs(env: ToolEnv, tool: Tool) -> str:
    """One call of the tool, as the model would write it with the plainest arguments its schema
    takes, gives no result that is the tool's own bug: a tool that returns a str fails every
    call, which the other checks (that never call it with valid arguments) did not notice. An
    error result is an observation (a backend down, a refusal) and passes, noted. A tool whose
    schema admits any argument is not called, as in `check_tool_rejects_bad_arguments`."""
    if _takes_any_argument(tool):
        return "not tried: the schema admits any argument (additionalProperties: true)"
    try:
        args = _sample_object(tool.flat_schema()["function"]["parameters"])
    except (_NoSample, TypeError, ValueError) as exc:
        return f"not tried: no sample arguments from its schema ({exc})"
    text = env.parser.format_call(tool.name, args)
    if text is None:
        return f"not tried: the {env.parser.name!r} parser cannot write this call"
    env.reset(seed=0)
    info = env.step(text)[4]
    said = json.dumps(args)
    results = [r for r in info["tool_results"] if r.name == tool.name]
    if not results:
        return f"not tried: the parser did not read the call it wrote ({text[:60]!r})"
    for r in results:
        if r.is_error and _TOOL_BUG.match(r.text):
            raise CheckFailed(f"tool {tool.name!r} has a bug: called with {said}, it gave: {r.text}")
    errors = [r.text.split("\n", 1)[0][:120] for r in results if r.is_error]
    return f"called with {said}: an error result: {errors[0]}" if errors else ""


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
    """Run every tool check (on a worker thread when called inside a running event loop, as in
    a notebook, since the checks drive the tool's coroutines to completion)."""
    return _aio.call_off_loop(_check_tool, tool)


def _check_tool(tool: Tool) -> list[CheckResult]:
    return [
        _run("tool_schema", lambda: check_tool_schema(tool)),
        _run("tool_rejects_bad_arguments", lambda: check_tool_rejects_bad_arguments(tool)),
    ]


def check_env(env: ToolEnv, tokenizer: Any = None) -> list[CheckResult]:
    """Run every env check, then the tool checks of its tools; with a Hugging Face `tokenizer`,
    also whether the env's parser reads the calls its chat template writes.

    Inside a running event loop (a notebook, an async test) the checks run on a worker
    thread, as `reset`/`step` cannot run there; the env is not used concurrently meanwhile.
    """
    return _aio.call_off_loop(_check_env, env, tokenizer)


def _check_env(env: ToolEnv, tokenizer: Any) -> list[CheckResult]:
    results = [_run(fn.__name__.removeprefix("check_"), lambda fn=fn: fn(env)) for fn in ENV_CHECKS]  # type: ignore[misc]
    if tokenizer is not None:
        results.append(_run("chat_template", lambda: check_chat_template(env, tokenizer)))
    for t in env.tools:
        results += [CheckResult(f"{r.name}[{t.name}]", r.ok, r.message) for r in _check_tool(t)]
        results.append(_run(f"tool_runs[{t.name}]", lambda t=t: check_tool_runs(env, t)))  # type: ignore[misc]
    return results
