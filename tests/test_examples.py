"""The core's examples run as a user would run them."""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def run(*args: str, **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=300, **kw)  # type: ignore[call-overload, no-any-return]


def _major_version(dist: str) -> int:
    """The installed major version of `dist`, 0 when it is not installed."""
    try:
        return int(importlib.metadata.version(dist).split(".")[0])
    except importlib.metadata.PackageNotFoundError:
        return 0


def test_quickstart() -> None:
    out = run(str(EXAMPLES / "quickstart.py"))
    assert out.returncode == 0, out.stderr
    assert "reward=1.0 terminated=True" in out.stdout


def test_training_loop() -> None:
    out = run(str(EXAMPLES / "training_loop.py"))
    assert out.returncode == 0, out.stderr
    assert "mean return=1.00" in out.stdout


def test_custom_plugin_installs_and_is_discovered(tmp_path: Path) -> None:
    # --no-build-isolation builds with this environment's setuptools (dev.py installs >=77, as
    # PEP 639's `license = "Apache-2.0"` needs); a bare venv has an older one, or none on 3.12+.
    if _major_version("setuptools") < 77:
        pytest.skip("building the example plugin needs setuptools>=77 in this environment")
    target = tmp_path / "site"
    # Built from a copy: setuptools writes build/ and *.egg-info beside the sources, and a
    # checkout may be read-only to the user running the tests.
    source = shutil.copytree(EXAMPLES / "custom_plugin", tmp_path / "custom_plugin")
    pip = run(
        "-m",
        "pip",
        "install",
        "-q",
        "--no-deps",
        "--no-build-isolation",
        "--target",
        str(target),
        str(source),
    )
    assert pip.returncode == 0, pip.stderr
    code = (
        "import json, gymnasium as gym, toolenv\n"
        "from toolenv.commands.list_cmd import collect\n"
        "env = gym.make('toolenv/WordCount-v0')\n"
        "env.reset(options={'task_id': '1'})\n"
        'obs, *_ = env.step(\'<tool_call>{"name": "word_count", "arguments": {"text": "a b c"}}</tool_call>\')\n'
        "r = env.step('<answer>6</answer>')[1]\n"
        "print(json.dumps({'obs': obs, 'reward': r, 'tools': [t['name'] for t in collect()['tools']]}))\n"
    )
    out = run("-c", code, env={**os.environ, "PYTHONPATH": str(target)})
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["obs"] == "<tool_response>\n3\n</tool_response>"
    assert res["reward"] == 1.0 and "word_count" in res["tools"]
    check = subprocess.run(
        [str(Path(sys.executable).parent / "toolenv"), "check", "toolenv/WordCount-v0"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(target)},
    )
    assert check.returncode == 0, check.stdout + check.stderr
    assert "0 failed" in check.stdout


def test_many_episodes_in_tuned_gc() -> None:
    out = run(str(EXAMPLES / "many_episodes.py"), "32")
    assert out.returncode == 0, out.stderr
    assert "32 episodes x 4 turns:" in out.stdout and "x the ideal 200 ms" in out.stdout
    assert "tuned for the run: True; settings restored: True" in out.stdout


def test_harmony_example() -> None:
    out = run(str(EXAMPLES / "harmony_example.py"))
    assert out.returncode == 0, out.stderr
    assert "type convert = (_: {" in out.stdout  # the Harmony tool list
    assert "<|start|>functions.convert to=assistant<|channel|>commentary<|message|>212 F<|end|>" in out.stdout
    assert "reward=1.0 terminated=True answer='212'" in out.stdout


def test_qwen3_xml_example() -> None:
    out = run(str(EXAMPLES / "qwen3_xml_example.py"))
    assert out.returncode == 0, out.stderr
    assert "<name>run_sql</name>" in out.stdout  # the tool list in the prompt
    assert (
        "'query': \"SELECT name FROM singer\\nWHERE age > 30 AND name <> 'Bo'\\nORDER BY name\", 'limit': 5"
        in out.stdout
    )
    assert "'<tool_response>\\nAnn\\nCy\\n</tool_response>'" in out.stdout
    assert "reward=1.0 terminated=True" in out.stdout


def test_llama3_json_example() -> None:
    out = run(str(EXAMPLES / "llama3_json_example.py"))
    assert out.returncode == 0, out.stderr
    assert "You have access to the following functions." in out.stdout  # Meta's tool prompt
    assert "--- call_1 get_weather({'city': 'Oslo'})" in out.stdout
    assert '\'{"output": "21 C"}\\n{"output": "9 C"}\'' in out.stdout
    assert "reward=1.0 terminated=True answer='12'" in out.stdout


def test_pythonic_example() -> None:
    out = run(str(EXAMPLES / "pythonic_example.py"))
    assert out.returncode == 0, out.stderr
    assert "[func_name1(params_name1=params_value1" in out.stdout  # the Llama format line
    assert "--- call_1: population({'city': 'Lyon'})" in out.stdout
    assert "reward=1.0 terminated=True answer='2615925'" in out.stdout


def test_mistral_example() -> None:
    out = run(str(EXAMPLES / "mistral_example.py"))
    assert out.returncode == 0, out.stderr
    assert '[AVAILABLE_TOOLS][{"type": "function"' in out.stdout
    assert "'[TOOL_RESULTS]call00000[TOOL_CONTENT]212 F[/TOOL_RESULTS]'" in out.stdout
    assert "'[TOOL_RESULTS]a1b2c3d4e[TOOL_CONTENT]100 C[/TOOL_RESULTS]'" in out.stdout
    assert "reward=1.0 terminated=True answer='212'" in out.stdout


def test_glm45_example() -> None:
    out = run(str(EXAMPLES / "glm45_example.py"))
    assert out.returncode == 0, out.stderr
    assert "<arg_key>{arg-key-1}</arg_key>" in out.stdout  # GLM's own tool prompt
    assert "--- call_0 run_sql({'query': \"SELECT name FROM singer\\nWHERE age > 30" in out.stdout
    assert "'<tool_response>\\nAnn\\nCy\\n</tool_response>'" in out.stdout
    assert "reward=1.0 terminated=True answer='2'" in out.stdout


def test_deepseek_example() -> None:
    # The markers are full-width characters: a console without UTF-8 could not print them.
    out = run(str(EXAMPLES / "deepseek_example.py"), env={**os.environ, "PYTHONIOENCODING": "utf-8"}, encoding="utf-8")
    assert out.returncode == 0, out.stderr
    assert "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>tool_call_name" in out.stdout
    assert "[('convert', {'value': 100, 'to': 'F'}, 'call_0')]" in out.stdout
    assert "<｜tool▁output▁begin｜>212 F<｜tool▁output▁end｜>" in out.stdout
    assert "reward=1.0 terminated=True answer='212'" in out.stdout


def test_gemma4_example() -> None:
    out = run(str(EXAMPLES / "gemma4_example.py"))
    assert out.returncode == 0, out.stderr
    assert "<|tool>declaration:population{" in out.stdout
    assert "--- call_1: population({'city': 'Lyon'})" in out.stdout
    assert 'response:population{value:<|"|>513275<|"|>}<tool_response|>' in out.stdout
    assert "reward=1.0 terminated=True answer='2615925'" in out.stdout


def test_kimi_k2_example() -> None:
    out = run(str(EXAMPLES / "kimi_k2_example.py"))
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith('# Tools\n[{"type": "function", "function": {"name": "convert"')
    assert "[('convert', {'value': 100, 'to': 'F'}, 'functions.convert:0')]" in out.stdout
    assert "'<|im_system|>convert<|im_middle|>## Return of functions.convert:0\\n212 F<|im_end|>'" in out.stdout
    assert "reward=1.0 terminated=True answer='212'" in out.stdout


def test_muse_glimmer_example() -> None:
    out = run(str(EXAMPLES / "muse_glimmer_example.py"))
    assert out.returncode == 0, out.stderr
    assert '# Valid recipients: "self", "forecast.*", "max_of.*", "user".' in out.stdout  # the template's prompt
    assert "--- call_0: forecast({'city': 'Paris', 'days': 2})" in out.stdout
    assert "--- call_0: max_of({'values': [18, 21]})" in out.stdout  # max_of.max_of, read as the env's tool
    assert '<|start|>tool forecast<|message|><tool_output name="forecast">\\n18, 21\\n</tool_output>' in out.stdout
    assert "reward=1.0 terminated=True answer='21'" in out.stdout


def test_remote_example() -> None:
    pytest.importorskip("starlette", reason="the remote example needs the serve extra: pip install 'toolenv[serve]'")
    pytest.importorskip("uvicorn", reason="the remote example needs the serve extra: pip install 'toolenv[serve]'")
    out = run(str(EXAMPLES / "remote_example.py"))
    assert out.returncode == 0, out.stderr
    assert "parser=hermes tools=['add']" in out.stdout
    assert "reward=1.0 terminated=True turns=2" in out.stdout


def test_export_example() -> None:
    out = run(str(EXAMPLES / "export_example.py"))
    assert out.returncode == 0, out.stderr
    assert "episodes: [('product', False), ('sum', True)]" in out.stdout
    assert "kept 1 of 2: task sum" in out.stdout
    # The agent wrote its call as text: the reply is the observation it read, as a user message.
    assert "user: '<tool_response>\\n42\\n</tool_response>'" in out.stdout
    assert "assistant: 'The answer is <answer>42</answer>'" in out.stdout


def test_cache_example() -> None:
    out = run(str(EXAMPLES / "cache_example.py"))
    assert out.returncode == 0, out.stderr
    assert "group 1: mean reward 1.0" in out.stdout and "group 2: mean reward 1.0" in out.stdout
    assert "16 searches: 1 ran, 7 joined a running one, 8 answered from the cache" in out.stdout


def test_breaker_example() -> None:
    out = run(str(EXAMPLES / "breaker_example.py"))
    assert out.returncode == 0, out.stderr
    assert "no breaker: 12 calls, 12 timed out, 0 refused at once, 12 reached the server" in out.stdout
    assert "breaker_threshold=3: 12 calls, 3 timed out, 9 refused at once, 3 reached the server" in out.stdout
    assert "Traceback" not in out.stderr


def test_trl_grpo_example_smoke_run() -> None:
    pytest.importorskip("trl", reason="the TRL example needs the trl extra: pip install 'toolenv[trl]'")
    pytest.importorskip("toolenv_sql", reason="the TRL example's default env is Spider (toolenv-sql)")
    out = run(str(EXAMPLES / "trl_grpo.py"), env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert out.returncode == 0, out.stderr
    assert "step 1: reward " in out.stdout
    assert out.stdout.count("  task spider-dev-0000: ") == 2  # a group of two rollouts, each its own episode


def test_skyrl_example() -> None:
    pytest.importorskip("skyrl_gym", reason="the SkyRL example needs the skyrl extra: pip install 'toolenv[skyrl]'")
    pytest.importorskip("toolenv_sql", reason="the SkyRL example's env is Spider (toolenv-sql)")
    out = run(str(EXAMPLES / "skyrl_example.py"))
    assert out.returncode == 0, out.stderr
    assert "2 rows; columns: ['data_source', 'env_class', 'extra_info', 'prompt', 'reward_spec']" in out.stdout
    assert "question: How many singers do we have?" in out.stdout
    assert (
        "step 1: reward=0.0 done=False\n  [user] '<information>count(*)\\n--------\\n6\\n(1 row)</information>'\n"
        in out.stdout
    )
    assert "step 2: reward=1.0 done=True\nmetrics: {'return': 1.0, 'turns': 2, 'tool_calls': 1," in out.stdout
