from __future__ import annotations

import asyncio
import contextvars
import enum
import functools
import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Annotated, Any, Literal, Optional

import pytest
from pydantic import BaseModel, Field

import toolenv
from toolenv import ToolContext, ToolLimits, tool
from toolenv.caller import ToolCaller
from toolenv.types import Task, ToolCall, ToolResult


def ctx() -> ToolContext:
    return ToolContext(task=Task(id="t"))


def test_subclass_uses_docstring_and_exports_schema(add_tool: toolenv.Tool) -> None:
    s = add_tool.schema()
    assert s["type"] == "function"
    fn = s["function"]
    assert fn["name"] == "add" and fn["description"] == "Add two integers."
    assert fn["parameters"]["required"] == ["a", "b"]
    assert fn["parameters"]["properties"]["a"] == {"description": "first addend", "type": "integer"}


def test_tool_decorator_async_function() -> None:
    @tool
    async def greet(name: Annotated[str, Field(description="who")], times: int = 1) -> str:
        """Greet someone."""
        return " ".join(["hi " + name] * times)

    assert greet.name == "greet" and greet.description == "Greet someone."
    props = greet.schema()["function"]["parameters"]
    assert props["required"] == ["name"] and props["properties"]["name"]["description"] == "who"
    args = greet.Args.model_validate({"name": "bo", "times": 2})
    assert asyncio.run(greet.run(args, ctx())).text == "hi bo hi bo"


def test_tool_decorator_sync_runs_off_the_loop() -> None:
    seen: list[str] = []

    @tool(name="where", timeout=5)
    def where_am_i(ctx: ToolContext) -> str:
        seen.append(threading.current_thread().name)
        return ctx.task.id

    assert where_am_i.limits.timeout == 5
    assert "ctx" not in where_am_i.Args.model_fields
    out = asyncio.run(where_am_i.run(where_am_i.Args(), ctx()))
    assert out.text == "t"
    assert seen and seen[0] != threading.main_thread().name


def test_tool_decorator_rejects_varargs() -> None:
    with pytest.raises(TypeError, match="cannot be described"):

        @tool
        def bad(*xs: int) -> str:
            return ""


def test_tool_result_passthrough() -> None:
    @tool
    def img() -> ToolResult:
        return ToolResult(text="x", metadata={"k": 1})

    assert asyncio.run(img.run(img.Args(), ctx())).metadata == {"k": 1}


def test_limits_override_per_instance(add_tool: toolenv.Tool) -> None:
    t = type(add_tool)(timeout=2.5, retries=3)
    assert t.limits.timeout == 2.5 and t.limits.retries == 3
    assert type(add_tool).limits.timeout == 30.0
    with pytest.raises(ValueError):
        type(add_tool)(timeout=-1)
    assert ToolLimits(rate_limit=5).rate_limit == 5


class Nested(BaseModel):
    tags: list[str] = Field(description="labels")


class Search(toolenv.Tool):
    """Search with options."""

    name = "search2"

    class Args(BaseModel):
        query: str
        topk: int | None = Field(default=None, description="how many")
        mode: Literal["fast", "exact"] = "fast"
        filters: list[Nested] = Field(default_factory=list)

    async def run(self, args: Args, ctx: ToolContext) -> ToolResult:  # type: ignore[override]
        return ToolResult(text=args.query)


def test_flat_schema_keeps_items_enum_optional() -> None:
    s = Search().schema()["function"]["parameters"]
    assert "$defs" in s and "anyOf" in s["properties"]["topk"]
    flat = Search().flat_schema()["function"]["parameters"]
    assert "$defs" not in flat
    assert flat["properties"]["topk"]["type"] == ["integer", "null"]
    assert flat["properties"]["topk"]["description"] == "how many"
    assert flat["properties"]["mode"]["enum"] == ["fast", "exact"]
    items = flat["properties"]["filters"]["items"]
    assert items["properties"]["tags"] == {"description": "labels", "items": {"type": "string"}, "type": "array"}
    assert "anyOf" not in str(flat) and "$ref" not in str(flat)


def test_schema_is_built_once_per_args_model_and_handed_out_as_a_fresh_copy(add_tool: toolenv.Tool) -> None:
    from toolenv._schema import _parameters

    first = add_tool.schema()
    first["function"]["parameters"]["properties"].clear()  # a caller editing its copy...
    second = add_tool.schema()
    assert set(second["function"]["parameters"]["properties"]) == {"a", "b"}  # ...changes no other
    assert second["function"]["parameters"]["properties"]["a"]["description"] == "first addend"
    hits = _parameters.cache_info().hits
    type(add_tool)().schema()
    assert _parameters.cache_info().hits == hits + 1  # another instance, same Args: no rebuild


def test_a_sync_tool_stuck_past_its_timeout_does_not_keep_the_process_from_exiting(tmp_path: Path) -> None:
    """Sync tools ran on the loop's default executor, whose threads `asyncio.run` and the
    interpreter join on the way out: one call stuck past its timeout hung the process."""
    script = tmp_path / "stuck.py"
    script.write_text(
        textwrap.dedent(
            """
            import asyncio, threading
            import toolenv
            from toolenv.caller import ToolCaller

            never = threading.Event()

            @toolenv.tool(timeout=0.05)
            def stuck() -> str:
                never.wait()
                return "never"

            async def main() -> None:
                results, _ = await ToolCaller([stuck]).invoke(
                    [toolenv.ToolCall(name="stuck")], toolenv.ToolContext(task=toolenv.Task())
                )
                print(results[0].text, flush=True)

            asyncio.run(main())
            """
        )
    )
    try:
        done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the process did not exit: {exc.stdout!r}")
    assert done.returncode == 0, done.stderr
    assert "timed out after 0.05 s" in done.stdout


async def test_sync_calls_stuck_past_their_timeout_do_not_starve_later_calls() -> None:
    """The default executor has min(32, cpus + 4) threads: that many stuck calls made every
    later sync call wait in its queue until it timed out too."""
    release = threading.Event()

    @tool(timeout=0.05)
    def stuck() -> str:
        release.wait()
        return "late"

    @tool(timeout=10)
    def quick() -> str:
        return "quick"

    caller = ToolCaller([stuck, quick])
    try:
        results, _ = await caller.invoke([ToolCall(name="stuck", id=str(i)) for i in range(40)], ctx())
        assert all("timed out" in r.text for r in results)
        (answer,), _ = await caller.invoke([ToolCall(name="quick")], ctx())
        assert answer.text == "quick" and not answer.is_error
    finally:
        release.set()


_REQUEST_ID: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="none")


async def test_a_sync_tool_runs_in_a_copy_of_the_callers_context() -> None:
    """As `asyncio.to_thread`: the caller's context variables are seen in the thread, and what
    the tool sets there stays in its copy."""

    @tool
    def which() -> str:
        seen = _REQUEST_ID.get()
        _REQUEST_ID.set("set by the tool")
        return seen

    token = _REQUEST_ID.set("r1")
    try:
        (result,), _ = await ToolCaller([which]).invoke([ToolCall(name="which")], ctx())
        assert result.text == "r1" and not result.is_error
        assert _REQUEST_ID.get() == "r1"
    finally:
        _REQUEST_ID.reset(token)


async def test_a_sync_tool_raising_stopiteration_is_an_error_result() -> None:
    """An asyncio future refuses StopIteration (`next()` on an empty iterator in a tool): the
    call must end with an error, not wait for a result that never comes."""

    @tool(timeout=30)
    def first(items: list[int]) -> str:
        return str(next(iter(items)))

    (result,), _ = await ToolCaller([first]).invoke([ToolCall(name="first", arguments={"items": []})], ctx())
    assert result.is_error and "StopIteration" in result.text, result.text
    assert "timed out" not in result.text


async def test_a_sync_call_cancelled_before_a_thread_takes_it_is_not_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """A call cancelled (timed out) while it waited for a thread must not run later, out of turn."""
    from toolenv import _threads, _tool

    held: list[Any] = []

    class Held(_threads.DaemonThreads):
        def run(self, job: Any, what: Any) -> None:  # the thread takes the job only when the test says
            held.append(job)

    monkeypatch.setattr(_tool, "WORKERS", Held("held"))
    ran: list[str] = []

    @tool
    def effect() -> str:
        ran.append("ran")
        return "ran"

    call = asyncio.ensure_future(effect.run(effect.Args(), ctx()))
    while not held:
        await asyncio.sleep(0)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    held[0]()
    assert ran == []


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_sync_tools_run_in_a_forked_child() -> None:
    """A forked child (a DataLoader or Ray worker) has none of its parent's threads: a call
    handed to a parent's idle thread there would wait for ever."""
    from toolenv import _threads

    @tool
    def pid() -> str:
        return str(os.getpid())

    assert asyncio.run(pid.run(pid.Args(), ctx())).text == str(os.getpid())
    deadline = time.monotonic() + 30
    while not _threads.WORKERS.idle and time.monotonic() < deadline:  # the thread is idle once it is back
        time.sleep(0.01)
    assert _threads.WORKERS.idle
    child = os.fork()
    if child == 0:
        code = 1
        try:
            out = asyncio.run(asyncio.wait_for(pid.run(pid.Args(), ctx()), 30))
            code = 0 if out.text == str(os.getpid()) else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0


async def test_positional_only_parameters_are_passed_positionally() -> None:
    @tool
    def add(a: int, /, b: int = 1) -> int:
        return a + b

    (result,), _ = await ToolCaller([add]).invoke([ToolCall(name="add", arguments={"a": 2, "b": 3})], ctx())
    assert result.text == "5" and not result.is_error


async def test_a_default_given_in_an_annotated_field_makes_the_parameter_optional() -> None:
    """`Annotated[int, Field(default=3)]` is Pydantic's way to give a field its default: the
    parameter was required anyway (in the schema, and a call without it refused)."""

    @tool
    def page(
        n: Annotated[int, Field(default=3, description="rows")],
        tags: Annotated[list[str], Field(default_factory=list)],
        q: Annotated[str, Field(description="what")],
    ) -> str:
        return f"{q}:{n}:{tags}"

    params = page.schema()["function"]["parameters"]
    assert params["required"] == ["q"]
    assert params["properties"]["n"] == {"default": 3, "description": "rows", "type": "integer"}
    (result,), _ = await ToolCaller([page]).invoke([ToolCall(name="page", arguments={"q": "x"})], ctx())
    assert result.text == "x:3:[]" and not result.is_error


@pytest.mark.parametrize("annotation", ["ToolContext | None", "Optional[ToolContext]", "Annotated[ToolContext, 'ctx']"])
async def test_an_optional_or_annotated_context_parameter_is_injected_not_shown(annotation: str) -> None:
    """`ctx: ToolContext | None = None` (callable without a context in tests) was a model
    argument: shown in the schema, and None at run time."""
    namespace: dict[str, object] = {}
    exec(
        "def where(key: str, ctx: " + annotation + " = None) -> str:\n"
        "    return ctx.task.id + ':' + key if ctx is not None else 'no context'\n",
        {"ToolContext": ToolContext, "Optional": Optional, "Annotated": Annotated},
        namespace,
    )
    where = tool(namespace["where"])  # type: ignore[arg-type]
    assert list(where.schema()["function"]["parameters"]["properties"]) == ["key"]
    (result,), _ = await ToolCaller([where]).invoke([ToolCall(name="where", arguments={"key": "k"})], ctx())
    assert result.text == "t:k"


class Doc(BaseModel):
    title: str
    year: int = 2000


def test_schema_keeps_title_keys_inside_default_and_enum_values() -> None:
    """Only Pydantic's own `title`s are noise: a default value with a "title" key lost it,
    so the schema showed the model a default the tool does not use."""

    @tool
    def find(
        filters: dict[str, str] = {"title": "Dune", "lang": "en"},
        doc: Doc = Doc(title="Emma"),
        fields: Literal["title", "year"] = "title",
    ) -> str:
        return ""

    params = find.schema()["function"]["parameters"]
    assert params["properties"]["filters"]["default"] == {"title": "Dune", "lang": "en"}
    assert params["properties"]["doc"]["default"] == {"title": "Emma", "year": 2000}
    assert params["properties"]["fields"]["enum"] == ["title", "year"]
    assert params["$defs"]["Doc"]["required"] == ["title"] and "title" not in params["$defs"]["Doc"]
    assert "title" in params["$defs"]["Doc"]["properties"]
    assert "title" not in params["properties"]["filters"]


async def test_a_plain_wrapper_around_an_async_function_is_awaited() -> None:
    """A sync decorator over an async function returns a coroutine: the env sent the model
    "<coroutine object ...>" (and the call was never run), while calling the tool directly worked."""

    def logged(fn: Any) -> Any:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            return fn(*args, **kwargs)

        return wrapper

    @tool
    @logged
    async def shout(word: str) -> str:
        await asyncio.sleep(0)
        return word.upper()

    assert await shout(word="direct") == "DIRECT"
    (result,), _ = await ToolCaller([shout]).invoke([ToolCall(name="shout", arguments={"word": "hi"})], ctx())
    assert result.text == "HI" and not result.is_error


class Color(enum.Enum):
    red = "red"
    blue = "blue"


def test_flat_schema_of_an_optional_choice_allows_null() -> None:
    """Flattening `Optional[Literal[...]]` / `Optional[Enum]` kept the enum (or const) of the
    non-null branch: the schema then forbade null, its own default, which validation accepts."""
    jsonschema = pytest.importorskip("jsonschema")

    @tool
    def pick(one: Literal["x"] | None = None, two: Literal["x", "y"] | None = None, color: Color | None = None) -> str:
        return ""

    flat = pick.flat_schema()["function"]["parameters"]
    for name in ("one", "two", "color"):
        prop = flat["properties"][name]
        jsonschema.validate(None, prop)  # null, the default, is allowed
        assert "anyOf" not in prop and prop["type"] == ["string", "null"]
    jsonschema.validate({"one": "x", "two": "y", "color": "blue"}, flat)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"two": "z"}, flat)
    assert pick.Args.model_validate({"one": None, "two": None, "color": None})


def test_flat_schema_of_a_recursive_model_stops_at_the_recursion() -> None:
    """A tree-shaped argument: Pydantic refers to the model from inside itself. The flat schema
    (qwen3_xml, harmony, gemma4, verl, TRL read it) inlines it once and stops there; it raised
    'schema nests too deeply' before, so an env with such a tool could not be built."""

    class Node(BaseModel):
        name: str
        children: list[Node] = []

    class Tree(toolenv.Tool):
        """Count a tree's nodes."""

        name = "count"

        class Args(BaseModel):
            root: Node

        async def run(self, args: Any, ctx: toolenv.ToolContext) -> toolenv.ToolResult:
            return toolenv.ToolResult(text="1")

    Tree.Args.model_rebuild(_types_namespace={"Node": Node})
    params = Tree().flat_schema()["function"]["parameters"]
    assert "$defs" not in json.dumps(params) and "$ref" not in json.dumps(params)
    root = params["properties"]["root"]
    assert root["type"] == "object" and root["properties"]["name"] == {"type": "string"}
    assert root["properties"]["children"]["items"] == {"type": "object"}  # the recursion, cut
    env = toolenv.ToolEnv(tools=[Tree()], tasks=[{"question": "q"}], parser="qwen3_xml")
    assert "root" in env.reset(seed=0)[0]


@tool(timeout=7)
def scaled(x: int, factor: int = 2) -> int:
    """Multiply `x` by `factor` (a module-level function tool, as users write them)."""
    return x * factor


async def test_a_function_tool_pickles_as_trl_and_multiprocessing_send_it() -> None:
    """`@tool` puts the tool where the function was, so pickle, which sends a function by its
    module and name, found the tool there and refused: "Can't pickle <function scaled>: it's
    not the same object as ...scaled". TRL's async trainer pickles `env_kwargs` (tools included)
    into its rollout process. The copy must run the same function with the same settings."""
    import pickle

    from toolenv import ResultCache
    from toolenv._tool import with_limits

    (changed,) = with_limits([scaled], {"scaled": {"timeout": 3}})
    changed.cache = ResultCache(maxsize=9)
    for original in (scaled, changed):
        copy = pickle.loads(pickle.dumps(original))
        assert copy is not original
        assert (copy.name, copy.description, copy.limits) == (original.name, original.description, original.limits)
        assert copy.schema() == original.schema()
        (res,), _ = await ToolCaller([copy]).invoke([ToolCall(name="scaled", arguments={"x": 21})], ctx())
        assert res.text == "42"
    assert pickle.loads(pickle.dumps(changed)).cache.maxsize == 9  # type: ignore[union-attr]
    assert pickle.loads(pickle.dumps(scaled)).cache is None


def test_a_function_tool_of_a_local_function_says_it_cannot_be_pickled() -> None:
    import pickle

    @tool
    def local(x: int) -> int:
        """Not importable."""
        return x

    with pytest.raises((pickle.PicklingError, AttributeError), match="local"):
        pickle.dumps(local)


def test_a_scripts_function_tool_still_goes_to_another_process_by_value(tmp_path: Path) -> None:
    """A tool defined in the script being run (`__main__`) is not in the `__main__` of the
    process that loads it (a Ray worker): cloudpickle sends such a function by value, and
    must keep doing so rather than name `__main__.<function>` there."""
    pytest.importorskip("cloudpickle")
    script = tmp_path / "driver.py"
    script.write_text(
        textwrap.dedent(
            """
            import subprocess, sys
            import cloudpickle
            import toolenv

            @toolenv.tool(timeout=3)
            def add(a: int, b: int) -> int:
                \"\"\"Add.\"\"\"
                return a + b

            worker = (
                "import asyncio, pickle, sys, toolenv\\n"
                "from toolenv.caller import ToolCaller\\n"
                "t = pickle.loads(sys.stdin.buffer.read())\\n"
                "call = toolenv.ToolCall(name='add', arguments={'a': 2, 'b': 3})\\n"
                "out, _ = asyncio.run(ToolCaller([t]).invoke([call], toolenv.ToolContext(task=toolenv.Task())))\\n"
                "print(out[0].text, t.limits.timeout)\\n"
            )
            done = subprocess.run([sys.executable, "-c", worker], input=cloudpickle.dumps(add), capture_output=True)
            sys.stdout.write(done.stdout.decode() + done.stderr.decode())
            """
        )
    )
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "5 3.0", done.stdout


def test_a_subclass_is_described_by_its_own_docstring() -> None:
    """A subclass's docstring is its description, not the one its parent took from its own
    docstring; a description set in so many words is kept by subclasses without one of theirs."""

    class Search(toolenv.Tool):
        """Search the corpus."""

        name = "search"

    class MedicalSearch(Search):
        """Search the medical corpus."""

    class Plain(MedicalSearch):
        pass

    class Explicit(toolenv.Tool):
        """For developers: how it works."""

        name = "explicit"
        description = "What the model reads."

    class Tuned(Explicit):
        """For developers: what changed."""

    assert (Search.description, MedicalSearch.description) == ("Search the corpus.", "Search the medical corpus.")
    assert Plain.description == "Search the medical corpus."
    assert Explicit.description == Tuned.description == "What the model reads."
