from __future__ import annotations

from pydantic import BaseModel

import toolenv
from toolenv import ToolContext
from toolenv.checker import check_env, check_tool
from toolenv.env import ToolEnv
from toolenv.types import ToolResult

from .conftest import TASKS, Add


def test_good_env_passes_every_check() -> None:
    results = check_env(ToolEnv(tools=[Add()], tasks=TASKS))
    assert results and all(r.ok for r in results), [r for r in results if not r.ok]
    names = {r.name for r in results}
    assert {"gymnasium", "error_paths", "determinism", "async_twins", "tool_schema[add]"} <= names


def test_an_env_whose_reply_without_a_call_is_the_answer_passes() -> None:
    """With `no_call_is_answer` (ReTool), junk text is the final answer by design: not a missing
    error observation. Unknown tools and bad arguments must still be errors."""
    for parser in ("hermes", "codeblock"):
        env = ToolEnv(tools=[Add()], tasks=TASKS, parser=parser, no_call_is_answer=True)
        results = check_env(env)
        assert all(r.ok for r in results), [r for r in results if not r.ok]


class Nondeterministic(toolenv.Tool):
    """Returns a different value each call."""

    name = "counter"
    n = 0

    class Args(BaseModel):
        pass

    async def run(self, args: BaseModel, ctx: ToolContext) -> ToolResult:
        Nondeterministic.n += 1
        return ToolResult(text=str(Nondeterministic.n))


def test_nondeterministic_env_fails_determinism() -> None:
    env = ToolEnv(
        tools=[Nondeterministic()], tasks=TASKS, parser="tags", parser_kwargs={"tags": {"c": ("counter", "x")}}
    )
    # the tags parser passes {"x": ...}, which counter does not accept: an error, deterministic
    by_name = {r.name: r for r in check_env(env)}
    assert by_name["determinism"].ok

    class Rand(toolenv.ActionParser):
        name = "rand"

        def parse(self, text: str) -> toolenv.ParsedAction:
            return toolenv.ParsedAction(tool_calls=[toolenv.ToolCall(name="counter", id="c")])

        def instructions(self, tools: object) -> str:
            return "call counter"

        def format_results(self, results: object) -> str:
            return "\n".join(r.text for r in results)  # type: ignore[attr-defined]

    env2 = ToolEnv(tools=[Nondeterministic()], tasks=TASKS, parser=Rand())
    by_name = {r.name: r for r in check_env(env2)}
    assert not by_name["determinism"].ok and "differ" in by_name["determinism"].message
    assert not by_name["error_paths"].ok  # a parser that never reports errors fails this check


def test_tool_without_description_fails_schema_check() -> None:
    class Nameless(toolenv.Tool):
        name = "bad name!"

        class Args(BaseModel):
            pass

    (schema, bad_args) = check_tool(Nameless())
    assert not schema.ok and "must be 1 to 64 ASCII letters" in schema.message
    assert bad_args.ok  # unknown arguments are rejected by the caller


def test_tool_names_the_openai_api_refuses_fail_the_schema_check() -> None:
    """OpenAI's function names match `^[a-zA-Z0-9_-]{1,64}$`: a non-ASCII letter or a 65th
    character is refused by the API (and by vLLM's OpenAI server), so the check says so."""

    def named(name: str) -> toolenv.Tool:
        class Named(toolenv.Tool):
            """A tool."""

            class Args(BaseModel):
                pass

        Named.name = name
        return Named()

    for bad in ("raíz_cuadrada", "x" * 65, "²"):
        (schema, _) = check_tool(named(bad))
        assert not schema.ok and "must be 1 to 64 ASCII letters, digits, '_' or '-'" in schema.message, bad
    (schema, _) = check_tool(named("get-weather_2" + "x" * 51))  # 64 characters
    assert schema.ok, schema.message


def test_a_failed_checks_message_keeps_the_cause_of_a_validation_error() -> None:
    """A check that fails on a pydantic ValidationError says which field and why, not only the
    error's header line (`1 validation error for Settings`)."""
    from typing import Any

    class Settings(BaseModel):
        max_turns: int

    class Misconfigured(ToolEnv):
        def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
            Settings.model_validate({"max_turns": "many"})
            return super().reset(seed=seed, options=options)

    by_name = {r.name: r for r in check_env(Misconfigured(tools=[Add()], tasks=TASKS))}
    message = by_name["reset_gives_prompt"].message
    assert "max_turns: Input should be a valid integer" in message, message
    assert "\n" not in message
