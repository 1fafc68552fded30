from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from toolenv.cli import main

TOOLENV = str(Path(sys.executable).parent / "toolenv")


def test_list_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["list", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert {"name": "toolenv/ToolEnv-v0", "dist": "toolenv (core)", "target": "toolenv.env:ToolEnv"} in data["envs"]
    assert {"hermes", "tags", "codeblock"} <= {p["name"] for p in data["parsers"]}
    assert {"exact_match", "f1"} <= {r["name"] for r in data["rewards"]}


def test_check_env_with_kwargs_passes(capsys: pytest.CaptureFixture[str]) -> None:
    kwargs = json.dumps({"tasks": [{"question": "q", "answer": "a"}]})
    assert main(["check", "toolenv/ToolEnv-v0", "--kwargs", kwargs]) == 0
    out = capsys.readouterr().out
    assert "ok  gymnasium" in out and "0 failed" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["check", "toolenv/Nope-v0"], "toolenv check: error: Environment `Nope` doesn't exist"),
        (["check", "no_such_tool"], "toolenv check: error: no tool named 'no_such_tool'"),
        (["check", "toolenv/ToolEnv-v0", "--kwargs", "{bad"], "toolenv check: error: --kwargs is not valid JSON"),
    ],
)
def test_errors_are_one_line_and_nonzero(argv: list[str], message: str) -> None:
    out = subprocess.run([TOOLENV, *argv], capture_output=True, text=True)
    assert out.returncode == 2
    assert out.stderr.startswith(message)
    assert len(out.stderr.strip().splitlines()) == 1
    assert "Traceback" not in out.stderr


def test_check_reports_failures_with_exit_1() -> None:
    # ToolEnv-v0 without tasks cannot reset: every env check fails, cleanly
    out = subprocess.run([TOOLENV, "check", "toolenv/ToolEnv-v0"], capture_output=True, text=True)
    assert out.returncode == 1
    assert "FAIL reset_gives_prompt" in out.stdout and "this env has no tasks" in out.stdout


@pytest.fixture(scope="module")
def qwen_tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real (tiny) Qwen2 tokenizer folder, chat template included, built offline."""
    pytest.importorskip("transformers", reason="--tokenizer needs transformers (CI installs it with verl)")
    from toolenv.integrations.verl.tiny import build_tiny_qwen2

    return build_tiny_qwen2(tmp_path_factory.mktemp("qwen"))


@pytest.mark.parametrize(
    ("parser", "code", "line"),
    [
        ("hermes", 0, "ok  chat_template"),
        ("mistral", 1, "FAIL chat_template"),
        ("tags", 0, "'tags' is a prompted format"),
    ],
)
def test_check_compares_the_parser_with_the_models_chat_template(
    qwen_tokenizer_dir: Path, capsys: pytest.CaptureFixture[str], parser: str, code: int, line: str
) -> None:
    kwargs = json.dumps({"tasks": [{"question": "q", "answer": "a"}], "parser": parser})
    assert main(["check", "toolenv/ToolEnv-v0", "--kwargs", kwargs, "--tokenizer", str(qwen_tokenizer_dir)]) == code
    out = capsys.readouterr().out
    assert line in out
    if code:
        assert "the model's chat template writes a tool call as '<tool_call>" in out


def test_check_tokenizer_needs_an_env(qwen_tokenizer_dir: Path) -> None:
    out = subprocess.run(
        [TOOLENV, "check", "sql", "--tokenizer", str(qwen_tokenizer_dir)], capture_output=True, text=True
    )
    assert out.returncode == 2 and out.stderr.startswith("toolenv check: error: --tokenizer checks an env's parser")


def test_doctor_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["doctor", "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["toolenv"] and rep["python"].startswith("3.")
    import importlib.metadata

    for dist, version in rep["training"].items():  # what a bug report about training needs
        try:
            assert version == importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            assert version is None


def test_no_command_prints_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert "toolenv COMMAND --help" in capsys.readouterr().out


def test_version_prints_the_installed_version() -> None:
    """`toolenv --version`, as pip, uvicorn or vllm answer it: the version, exit 0, no command needed."""
    from importlib.metadata import version

    out = subprocess.run([TOOLENV, "--version"], capture_output=True, text=True)
    assert (out.returncode, out.stdout, out.stderr) == (0, f"toolenv {version('toolenv')}\n", "")


def test_help_lists_every_command_with_its_help_line(capsys: pytest.CaptureFixture[str]) -> None:
    # Built-in commands and plugins' (toolenv-search's serve-search), each with the HELP its
    # module defines, though `--help` imports none of them.
    import importlib

    from toolenv.cli import _modules

    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    out = " ".join(capsys.readouterr().out.split())  # argparse wraps the lines
    modules = _modules()
    assert {"rollout", "check", "view", "verl-data", "serve-search"} <= set(modules)
    for name, target in modules.items():
        help_line = importlib.import_module(target.split(":")[0]).HELP
        assert f"{name} {' '.join(help_line.split())}" in out, name


def test_help_imports_no_command_module() -> None:
    code = (
        "import contextlib, io, sys\n"
        "from toolenv.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
        "    main(['--help'])\n"
        "print(sorted(m for m in sys.modules if m.endswith('_cmd')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("argv", [["list"], ["list", "--json"], ["doctor"]])
def test_output_into_a_closed_pipe_is_quiet(argv: list[str]) -> None:
    """`toolenv list | head -1`: the reader goes away before the output is written. The
    command stops quietly with the shell's SIGPIPE status (141), as `ls | head` does, rather
    than printing `error: [Errno 32] Broken pipe` or a traceback at exit."""
    read, write = os.pipe()
    os.close(read)  # the reader is gone: every write fails with EPIPE
    try:
        out = subprocess.run([TOOLENV, *argv], stdout=write, stderr=subprocess.PIPE, text=True)
    finally:
        os.close(write)
    assert out.stderr == ""
    assert out.returncode == 141


def test_a_broken_pipe_that_is_not_stdout_is_still_an_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Only a closed stdout ends a command quietly: a BrokenPipeError of a socket or another
    pipe (a server gone mid-request) is reported as any error is."""
    import toolenv.commands.list_cmd as list_cmd

    def run(args: object) -> int:
        raise BrokenPipeError(32, "Broken pipe (a socket)")

    monkeypatch.setattr(list_cmd, "run", run)
    assert main(["list"]) == 2
    assert capsys.readouterr().err == "toolenv list: error: [Errno 32] Broken pipe (a socket)\n"


def test_doctor_reports_a_plugin_whose_report_is_not_a_dict(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A `toolenv.doctor` plugin that returns something other than a dict (it forgot its `return`)
    is reported as broken, as one that raises is; the other reports are still shown."""
    (tmp_path / "doctor_plug.py").write_text("def none():\n    pass\n\ndef good():\n    return {'isolation': 'ok'}\n")
    info = tmp_path / "doctor_plug-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: doctor-plug\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[toolenv.doctor]\nforgetful = doctor_plug:none\nfine = doctor_plug:good\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert "forgetful:\n  error: the report is NoneType, not a dict\n" in out
    assert "fine:\n  isolation: ok\n" in out


def test_verl_data_into_a_pipe_writes_the_parquet_alone(tmp_path: Path) -> None:
    """`--out /dev/stdout | ...` (as `toolenv export` allows): the parquet goes into the pipe whole,
    and the `wrote N rows` line to stderr, not after the parquet's footer."""
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa

    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(
        '{"id": "t1", "question": "2+3?", "answer": "5"}\n{"id": "t2", "question": "4*5?", "answer": "20"}\n'
    )
    kwargs = json.dumps({"tools": ["toolenv.integrations.verl.demo:Calculator"], "tasks": str(tasks)})
    out = subprocess.run(
        [TOOLENV, "verl-data", "toolenv/ToolEnv-v0", "--out", "/dev/stdout", "--env-kwargs", kwargs],
        capture_output=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert pq.read_table(pa.BufferReader(out.stdout)).num_rows == 2
    assert out.stderr.decode().strip() == "wrote 2 rows for toolenv/ToolEnv-v0 to /dev/stdout"
