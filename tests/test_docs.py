"""The documentation site builds with every page linked (mkdocs --strict), its API page says
where each name imports from, and the README's example runs as written."""

from __future__ import annotations

import argparse
import ast
import importlib
import importlib.util
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest

import toolenv

ROOT = Path(__file__).resolve().parents[1]


def test_mkdocs_builds_strict(tmp_path: Path) -> None:
    mkdocs = shutil.which("mkdocs", path=str(Path(sys.executable).parent))
    if mkdocs is None:
        pytest.skip("mkdocs is not installed (it comes with the dev extra: pip install -e .[dev])")
    out = subprocess.run(
        [mkdocs, "build", "--strict", "--site-dir", str(tmp_path / "site")], cwd=ROOT, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert (tmp_path / "site" / "index.html").exists()


def test_every_docs_page_is_in_the_nav() -> None:
    nav = (ROOT / "mkdocs.yml").read_text()
    pages = [p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs").rglob("*.md")]
    missing = [p for p in pages if p not in nav]
    assert not missing, f"pages not in mkdocs.yml nav: {missing}"


def test_api_reference_covers_the_public_api() -> None:
    page = (ROOT / "docs" / "api.md").read_text()
    documented = set(re.findall(r"^::: ([\w.]+)$", page, re.M))
    covered = {d.rsplit(".", 1)[-1] for d in documented}
    for package in (d for d in documented if d.count(".") <= 1):  # a whole package: the names in its __all__
        covered.update(getattr(importlib.import_module(package), "__all__", ()))
    public = {
        package: importlib.import_module(package).__all__
        for package in (
            "toolenv",
            "toolenv.integrations.verl",
            "toolenv.integrations.trl",
            "toolenv.integrations.skyrl",
            "toolenv_search",
            "toolenv_sql",
            "toolenv_code",
            "toolenv_mcp",
        )
    }
    missing = [f"{p}.{n}" for p, names in public.items() for n in names if n != "__version__" and n not in covered]
    assert not missing, f"public names missing from docs/api.md: {missing}"
    from toolenv.registry import entries

    agents = {e.load().__name__ for e in entries("agents")}
    assert agents <= covered, f"agent plugins missing from docs/api.md: {sorted(agents - covered)}"


def test_api_reference_headings_say_where_to_import_from() -> None:
    """docs/api.md says its names import from `toolenv` unless the heading or the section names a
    module: an object that `toolenv` does not export must show its full path in its heading."""
    page = (ROOT / "docs" / "api.md").read_text()
    section, wrong = "", []
    for block in re.split(r"\n(?=## |::: )", page):
        if block.startswith("## "):
            section = block.splitlines()[0]
        if not block.startswith("::: toolenv.") or section in ("## verl", "## TRL", "## SkyRL", "## Plugins"):
            continue  # those sections name the package to import from
        path = block.split()[1]
        if _is_module(path):
            continue  # a module: its heading names it
        if path.rpartition(".")[2] not in toolenv.__all__ and "show_root_full_path: true" not in block:
            wrong.append(path)
    assert not wrong, f"shown as if importable from toolenv, but it is not: {wrong}"


def _is_module(path: str) -> bool:
    """Whether the dotted `path` names a module (else an object inside one)."""
    try:
        importlib.import_module(path)
    except ImportError:
        return False
    return True


def test_readme_snippet_runs_as_written() -> None:
    """The README's "In twenty lines" example runs against the current API and does what its
    comments say."""
    readme = (ROOT / "README.md").read_text()
    (code,) = re.findall(r"^```python\n(.*?)^```", readme, re.M | re.S)
    scope: dict[str, object] = {}
    exec(compile(code, "README.md", "exec"), scope)
    env = scope["env"]
    assert isinstance(env, gym.Env) and isinstance(env.unwrapped, toolenv.ToolEnv)
    try:
        assert scope["reward"] == 1.0 and scope["terminated"] is True and scope["truncated"] is False
        episode = env.unwrapped.episode
        assert episode is not None and episode.turns[0].observation == "<tool_response>\n5\n</tool_response>"
    finally:
        env.close()


# ----------------------------------------------------------------------------- docs snippets
# Each test below runs a page's example as a reader would paste it, and checks what its
# comments say it does. Snippets that are fragments (`tools=[...]`) get the names they
# assume in `scope`, nothing more.


def _python_blocks(page: str) -> list[str]:
    """The ```python blocks of docs/`page`, in order."""
    return re.findall(r"^```python\n(.*?)^```", (ROOT / "docs" / page).read_text(), re.M | re.S)


def _run(code: str, page: str, scope: dict[str, Any] | None = None) -> dict[str, Any]:
    scope = {} if scope is None else scope
    exec(compile(code, f"docs/{page}", "exec"), scope)
    return scope


def _commented(code: str, name: str) -> str:
    """The value a snippet's comment gives for `name`: `# name == 'value'`."""
    (literal,) = re.findall(rf"# {re.escape(name)} == ('.*'|\".*\")$", code, re.M)
    return str(ast.literal_eval(literal))


def _close(env: Any) -> None:
    close = getattr(env, "close", None)
    if close is not None:
        close()


def test_every_python_block_of_the_docs_is_python() -> None:
    """Every ```python block of the README and docs parses (a `>>>` session example by its
    statements): a fragment no test runs (`LLMJudge(...)`, `ToolVerified(...)`) still may
    not drift into text Python cannot read. Top-level `await` is allowed, as in a notebook."""
    import doctest

    wrong = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        for block in re.findall(r"^[ \t]*```python\n(.*?)^[ \t]*```", page.read_text(), re.M | re.S):
            code = textwrap.dedent(block)
            parts = [e.source for e in doctest.DocTestParser().get_examples(code)] if ">>> " in code else [code]
            for part in parts:
                try:
                    compile(part, str(page), "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT | ast.PyCF_ONLY_AST)
                except SyntaxError as exc:
                    wrong.append(f"{page.relative_to(ROOT)}: {exc.msg}: {part.splitlines()[(exc.lineno or 1) - 1]!r}")
    assert not wrong, f"python blocks that do not parse: {wrong}"


def test_docs_name_only_what_exists() -> None:
    """Every dotted name the README and docs give (`toolenv.runner.arollout`,
    `toolenv_search.make_hotpotqa_env`) imports as written."""
    groups = {"agents", "oracles", "tools", "envs", "doctor", "commands"}  # entry-point groups
    pattern = re.compile(r"\b((?:toolenv|toolenv_\w+)(?:\.[A-Za-z_]\w*)+)")
    wrong = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        for name in sorted(set(pattern.findall(page.read_text()))):
            parts = name.split(".")
            if (parts[0] == "toolenv" and parts[1] in groups) or parts[-1] in ("py", "yaml", "json", "md"):
                continue  # `toolenv.oracles` is a group, `toolenv_tools.yaml` a file
            if importlib.util.find_spec(parts[0]) is None:
                continue  # a made-up plugin of an example (`toolenv_x.serve`)
            if not _resolves(parts):
                wrong.append(f"{page.relative_to(ROOT)}: {name}")
    assert not wrong, f"names that do not import: {wrong}"


def _resolves(parts: list[str]) -> bool:
    """Whether `a.b.c` names a module or an attribute of one."""
    for i in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:i]))
        except ModuleNotFoundError as exc:
            if exc.name and exc.name.split(".")[0] not in (parts[0], "toolenv"):
                return True  # the module needs an optional dependency not installed here (verl, skyrl_gym)
            continue
        except ImportError:
            continue
        for attr in parts[i:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def test_docs_give_only_options_the_commands_have() -> None:
    """Every `--option` shown after `toolenv COMMAND` in the README and docs is one of that
    command's options."""
    from toolenv.cli import _modules

    modules = _modules()
    parsers: dict[str, argparse.ArgumentParser] = {}
    wrong = []
    commands = "|".join(re.escape(c) for c in sorted(modules, key=len, reverse=True))
    shown = re.compile(rf"toolenv ({commands})\b([^`\n]*)")
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        for command, rest in shown.findall(page.read_text().replace("\\\n", " ")):  # a shell line goes on
            if command not in parsers:
                parser = argparse.ArgumentParser(prog=f"toolenv {command}")
                importlib.import_module(modules[command].split(":")[0]).add_arguments(parser)
                parsers[command] = parser
            known = set(parsers[command]._option_string_actions)
            for option in re.findall(r"(?<![\w-])(--[a-z][\w-]*)", rest):
                if option not in known and option != "--bogus":  # cli.md's example of a usage error
                    wrong.append(f"{page.relative_to(ROOT)}: toolenv {command} {option}")
    assert not wrong, f"options the commands do not have: {sorted(set(wrong))}"


def test_tools_page_snippets_run() -> None:
    """docs/tools.md: the `Add` class, the `lookup` function tool and the cache examples,
    with the limits they set, in an env."""
    from toolenv_search import SearchTool
    from toolenv_sql import SQLTool

    blocks = _python_blocks("tools.md")
    scope = _run(blocks[0], "tools.md")
    _run(blocks[1], "tools.md", scope)
    add, lookup = scope["Add"](), scope["lookup"]
    assert add.limits.timeout == 5 and add.limits.max_concurrency == 64
    assert lookup.limits.timeout == 10 and lookup.limits.rate_limit == 5
    assert lookup.schema()["function"]["parameters"] == {
        "properties": {"key": {"description": "the key", "type": "string"}},
        "required": ["key"],
        "type": "object",
    }
    env = toolenv.ToolEnv(tools=[add, lookup], tasks=[{"question": "q", "context": {"table": {"k": "v"}}}])
    try:
        env.reset(seed=0)
        obs, *_ = env.step(
            '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'
            '<tool_call>{"name": "lookup", "arguments": {"key": "k"}}</tool_call>'
        )
        assert obs == "<tool_response>\n5\n</tool_response>\n<tool_response>\nv\n</tool_response>"
    finally:
        env.close()
    _run(blocks[2], "tools.md", scope)  # Browser: a release hook
    search = _run(blocks[3], "tools.md", {"SearchTool": SearchTool, "URL": "http://127.0.0.1:9"})["search"]
    assert (search.limits.timeout, search.limits.retries, search.limits.breaker_threshold) == (10, 2, 5)
    cached = _run(blocks[4], "tools.md", {**scope, "SQLTool": SQLTool})
    assert cached["Search"].cache.scope == "shared" and cached["sql"].cache.scope == "task"
    assert cached["lookup"].cache is not None


def test_rewards_page_specs_build() -> None:
    """docs/rewards.md: every reward spec it shows, in Python and in YAML, builds an env."""
    from toolenv.rewards import FormatReward, LLMJudge, TurnReward, reward_names

    tasks = [{"question": "q", "answer": "a"}]
    scope: dict[str, Any] = {"toolenv": toolenv, "LLMJudge": LLMJudge, "url": "http://127.0.0.1:9/v1"}
    specs = []
    for line in _python_blocks("rewards.md")[0].splitlines():
        specs.append(_run(line, "rewards.md", scope)["reward"])
    specs.append(_run(_python_blocks("rewards.md")[2], "rewards.md")["reward"])
    yaml = pytest.importorskip("yaml")
    (config,) = re.findall(r"^```yaml\n(.*?)^```", (ROOT / "docs" / "rewards.md").read_text(), re.M | re.S)
    for document in config.split("# or, as a list"):
        specs.append(yaml.safe_load(document)["reward"])
    assert len(specs) == 8
    for spec in specs:
        toolenv.ToolEnv(tools=[], tasks=tasks, reward=spec).close()
    _run(_python_blocks("rewards.md")[1], "rewards.md", {"FormatReward": FormatReward})
    from toolenv.rewards import DEFAULT_JUDGE_PROMPT, ToolVerified

    judge = eval(_python_blocks("rewards.md")[4], {"LLMJudge": LLMJudge, "DEFAULT_JUDGE_PROMPT": DEFAULT_JUDGE_PROMPT})
    assert judge.prompt == DEFAULT_JUDGE_PROMPT and judge.system is None  # every argument it shows is one
    verified = eval(_python_blocks("rewards.md")[5], {"ToolVerified": ToolVerified})
    assert verified.name == "tests" and verified.require_answer
    short = _run(_python_blocks("rewards.md")[3].splitlines()[0], "rewards.md", {"TurnReward": TurnReward})["short"]
    env = toolenv.ToolEnv(tools=[], tasks=tasks, reward=[(short, 1.0), ("exact_match", 1.0)])
    try:  # r includes −0.001 × len(text); info["reward_components"]["length"]
        env.reset(seed=0)
        _, r, *_, info = env.step("0123456789")
        assert r == pytest.approx(-0.01) and info["reward_components"]["length"] == pytest.approx(-0.01)
    finally:
        env.close()
    _run(_python_blocks("rewards.md")[6], "rewards.md", {"toolenv": toolenv})  # Brevity, registered
    assert "brevity" in reward_names()
    env = toolenv.ToolEnv(tools=[], tasks=tasks, reward="brevity")
    try:
        env.reset(seed=0)
        assert env.step("<answer>a</answer>")[1] == 1.0
    finally:
        env.close()


def test_agents_page_agent_rolls_out() -> None:
    """docs/agents.md: the `Echo` agent, written as shown, rolls out."""
    scope = _run(_python_blocks("agents.md")[0], "agents.md")
    tasks = [{"id": "t", "question": "echo me", "answer": "echo me"}]
    result = toolenv.rollout("toolenv/ToolEnv-v0", scope["Echo"](), env_kwargs={"tasks": tasks, "reward": "em"})
    (traj,) = result.trajectories
    assert traj.error is None and traj.turns[0].action == "<answer>echo me</answer>" and traj.reward == 1.0


def test_rollout_page_python_api_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/rollout.md: the Python API example, in a scratch directory."""
    monkeypatch.chdir(tmp_path)
    scope = _run(_python_blocks("rollout.md")[0], "rollout.md")
    result = scope["result"]
    assert result.summary.mean_reward == 1.0 and result.summary.success_rate == 1.0
    assert len(result.trajectories) == 20
    assert (tmp_path / "runs" / "spider" / "trajectories.jsonl").exists()


def test_vector_page_example_runs() -> None:
    """docs/vector.md: `gym.make_vec` gives toolenv's vector env; its outputs are as the
    comments say."""
    import numpy as np

    scope = _run(_python_blocks("vector.md")[0], "vector.md", {"gym": gym, "actions": ["<answer>x</answer>"] * 64})
    envs = scope["envs"]
    try:
        assert isinstance(scope["obs"], tuple) and len(scope["obs"]) == 64  # tuple of 64 prompts
        assert isinstance(scope["rewards"], np.ndarray) and isinstance(scope["terminated"], np.ndarray)
    finally:
        envs.close()


def test_parsers_page_snippets_run() -> None:
    """docs/parsers.md: the parser examples that need no model download."""
    from toolenv.parsers import CodeBlockParser, TagParser

    tasks = [{"question": "q"}]
    for i in (0, 3):  # `tools=[...], tasks=[...]` are the reader's
        code = _python_blocks("parsers.md")[i].replace("tools=[...], tasks=[...]", "tools=[], tasks=tasks")
        scope = _run(code, "parsers.md", {"toolenv": toolenv, "tasks": tasks})
        scope["env"].close()
    reasoning = _python_blocks("parsers.md")[3].splitlines()[-1]
    assert reasoning.endswith("# None")
    assert eval(reasoning.split("  #")[0], {"parser": scope["parser"]}) is None  # the docs' own line
    tags = _run("p = " + _python_blocks("parsers.md")[4], "parsers.md", {"TagParser": TagParser})["p"]
    assert tags.parse("<lookup>Paris</lookup>").tool_calls[0].arguments == {"title": "Paris"}
    code = _run("p = " + _python_blocks("parsers.md")[5], "parsers.md", {"CodeBlockParser": CodeBlockParser})["p"]
    assert code.parse("```js\n1\n```").tool_calls[0].name == "sandbox"


def test_search_page_example_runs() -> None:
    """docs/plugins/search.md: the HotpotQA example gives the observation and reward its
    comments show."""
    code = _python_blocks("plugins/search.md")[0]
    scope = _run(code, "plugins/search.md")
    env = scope["env"]
    try:
        shown = _commented(code, "obs").split(" ...")[0]
        assert env.unwrapped.episode.turns[0].observation.startswith(shown)
        assert scope["reward"] == 1.0 and scope["terminated"] is True
    finally:
        env.close()


def test_sql_page_example_runs(capsys: pytest.CaptureFixture[str]) -> None:
    """docs/plugins/sql.md: the Spider example prints what its comments show; the tool's
    documented defaults build a tool."""
    scope = _run(_python_blocks("plugins/sql.md")[0], "plugins/sql.md")
    try:
        out = capsys.readouterr().out
        assert out.startswith("<information>count(*)\n") and "(1 row)</information>" in out
        assert out.endswith("1.0 {'execution_match': 1.0}\n")
    finally:
        scope["env"].close()
    tool = _run(_python_blocks("plugins/sql.md")[1], "plugins/sql.md")["tool"]
    assert tool.name == "sql"


def test_mcp_page_example_runs() -> None:
    """docs/plugins/mcp.md: the `mcp_tools` example against the plugin's demo server."""
    code = _python_blocks("plugins/mcp.md")[0]
    scope = _run(code, "plugins/mcp.md")
    assert scope["obs"] == _commented(code, "obs")


def _command_parsers() -> dict[str, argparse.ArgumentParser]:
    """Each `toolenv` command's argument parser, as `toolenv COMMAND --help` shows it."""
    from toolenv.cli import _modules

    parsers = {}
    for command, target in _modules().items():
        parser = argparse.ArgumentParser(prog=f"toolenv {command}")
        importlib.import_module(target.split(":")[0]).add_arguments(parser)
        parsers[command] = parser
    return parsers


def _docs_text() -> str:
    return "\n".join(p.read_text() for p in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))])


def test_every_command_option_is_documented() -> None:
    """Every long option of every `toolenv` command is named somewhere in the README or docs (a
    new flag is findable, not only in `--help`)."""
    text = _docs_text()
    missing = [
        f"toolenv {command} {option}"
        for command, parser in _command_parsers().items()
        for option in parser._option_string_actions
        if option.startswith("--") and option != "--help" and not re.search(rf"{re.escape(option)}(?![\w-])", text)
    ]
    assert not missing, f"options no page names: {missing}"


def test_docs_show_the_commands_defaults() -> None:
    """A synopsis that shows an option with a value (`[--close-timeout 30]`, `[--host 127.0.0.1]`,
    not a placeholder such as `[--port P]`) shows that option's default."""
    parsers = _command_parsers()
    commands = "|".join(re.escape(c) for c in sorted(parsers, key=len, reverse=True))
    wrong = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        text = page.read_text().replace("\\\n", " ")
        for command, rest in re.findall(rf"toolenv ({commands})\b([^`\n]*)", text):
            for option, value in re.findall(r"\[(--[a-z][\w-]*) ([^\]\s|…]+)\]", rest):
                if value.isupper() or value.startswith(("K=", "{")):
                    continue  # a placeholder (SECONDS, K=V ...)
                action = parsers[command]._option_string_actions.get(option)
                if action is None or action.default is None:
                    continue  # an unknown option is the test above's; no default: an example value (f.html)
                default = action.default
                same = float(value) == default if isinstance(default, (int, float)) else str(default) == value
                if not same:
                    wrong.append(f"{page.relative_to(ROOT)}: toolenv {command} {option} {value} (default {default})")
    assert not wrong, f"defaults the docs show wrong: {wrong}"


def test_agents_page_gives_the_reference_agents_arguments() -> None:
    """docs/agents.md: the `openai` agent's table names exactly its constructor's arguments, with
    their defaults where the table gives one, and the `transformers` agent's text names all of its."""
    import inspect

    from toolenv_agents.openai_compat import OpenAIAgent

    page = (ROOT / "docs" / "agents.md").read_text()
    section = page.split("### `openai`")[1].split("| argument | default | meaning |")[1].split("\n\n")[0]
    params = {n: p.default for n, p in inspect.signature(OpenAIAgent).parameters.items()}
    rows = re.findall(r"^\| ((?:`\w+`(?:, )?)+) \| ([^|]*) \|", section, re.M)
    named, wrong = set(), []
    words = {"server": None, "off": False, "–": None}
    for names_cell, defaults_cell in rows:
        names = re.findall(r"`(\w+)`", names_cell)
        named.update(names)
        defaults = [d.strip() for d in defaults_cell.split(",")]
        if len(defaults) != len(names):
            defaults = defaults * len(names) if len(defaults) == 1 else [""] * len(names)
        for name, shown in zip(names, defaults):
            if name not in params:
                wrong.append(f"{name}: not an argument")
                continue
            if shown in words:
                expected: object = words[shown]
            elif re.fullmatch(r"[\d.]+", shown):
                expected = float(shown)
            elif re.fullmatch(r"`\w+`", shown):
                expected = shown.strip("`")
            else:
                continue  # prose (`$OPENAI_BASE_URL` or OpenAI)
            actual = params[name]
            if shown == "–" and actual is inspect.Parameter.empty:
                continue  # required
            if actual != expected and not (actual is None and expected is False):
                wrong.append(f"{name}: shown {shown!r}, default {actual!r}")
    assert not wrong and named == set(params), (wrong, sorted(set(params) - named))
    hf = pytest.importorskip("toolenv_agents.hf")
    section = page.split("### `transformers`")[1].split("### ")[0]
    unnamed = [
        n for n in inspect.signature(hf.TransformersAgent).parameters if n != "model" and f"`{n}`" not in section
    ]
    assert not unnamed, f"transformers agent arguments docs/agents.md does not name: {unnamed}"


def test_env_args_take_tool_references_in_rollout_and_check(tmp_path: Path) -> None:
    """docs/remote.md: `--env-arg` are `gym.make` keywords "as for `toolenv rollout`", and `tools`
    takes references (`module:Name` or a plugin name), since tool objects cannot be typed on a
    command line. `toolenv rollout --env-arg` and `toolenv check --kwargs` take them as
    `toolenv serve` does (they failed with "'str' object has no attribute 'name'")."""
    import json
    import os

    exe = str(Path(sys.executable).parent / "toolenv")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "examples")}
    tasks = [{"id": "s", "question": "2+3?", "answer": "5", "context": {"call": ["add", {"a": 2, "b": 3}]}}]
    tools = ["rollout_example:add", "rollout_example:Lookup"]  # a tool instance and a Tool class
    out = tmp_path / "run"
    env_args = ["--env-arg", f"tools={json.dumps(tools)}", "--env-arg", f"tasks={json.dumps(tasks)}", "--out", str(out)]
    rollout = subprocess.run(
        [exe, "rollout", "toolenv/ToolEnv-v0", "--agent", "rollout_example:ScriptedAgent", "--no-progress", *env_args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert rollout.returncode == 0, rollout.stderr
    (line,) = (out / "trajectories.jsonl").read_text().splitlines()
    traj = json.loads(line)
    assert traj["error"] is None and traj["reward"] == 1.0
    assert traj["turns"][0]["results"][0]["text"] == "5"
    assert json.loads((out / "run.json").read_text())["env_kwargs"]["tools"] == tools  # as given, for resuming
    check = subprocess.run(
        [exe, "check", "toolenv/ToolEnv-v0", "--kwargs", json.dumps({"tools": [*tools, "sql"], "tasks": tasks})],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert check.returncode == 0, check.stdout + check.stderr
    assert "tool_schema[lookup]" in check.stdout and "tool_schema[sql]" in check.stdout
    bad_ref = ["--env-arg", 'tools=["rollout_example:nope"]']
    bad = subprocess.run(
        [exe, "rollout", "toolenv/ToolEnv-v0", "--agent", "oracle", *bad_ref, "--out", str(tmp_path / "bad")],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1, bad.stderr
    assert "cannot import tool 'rollout_example:nope'" in bad.stderr


def test_every_reward_toolenv_list_shows_is_usable_by_name() -> None:
    """docs/cli.md: `toolenv list` shows plugins' rewards (found in their source, without
    importing them). Each name it lists works in `reward=` as it stands, in a fresh process
    where the plugin's env module was never imported (it was "unknown reward", with a list of
    known rewards that left it out)."""
    import json

    code = (
        "import json, sys, toolenv\n"
        "from toolenv.commands.list_cmd import collect\n"
        "names = [r['name'] for r in collect()['rewards']]\n"
        "assert 'toolenv_sql' not in sys.modules and 'toolenv_code' not in sys.modules\n"
        "for name in names:\n"
        "    toolenv.rewards.get_reward(name)\n"
        "env = toolenv.ToolEnv(tasks=[{'question': 'q', 'answer': 'a'}], reward={'tests_passed': 1.0})\n"
        "print(json.dumps(names))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    names = json.loads(out.stdout.splitlines()[-1])
    assert {"execution_match", "tests_passed"} <= set(names)
