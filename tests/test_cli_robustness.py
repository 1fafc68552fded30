"""The command line on bad input and signals, as a user meets it: a real `toolenv` process,
real run directories. Bad input is one line and a non-zero exit; a run stopped by a signal
keeps what it wrote and says so."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _examples import load_example

from toolenv.cli import MAX_ERROR_CHARS, error_line
from toolenv.runner import rollout

ROOT = Path(__file__).resolve().parents[1]
TOOLENV = str(Path(sys.executable).parent / "toolenv")
example = load_example("rollout_example")


def _env(*extra: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([*map(str, extra), str(ROOT / "examples"), env.get("PYTHONPATH", "")])
    return env


def _toolenv(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([TOOLENV, *args], capture_output=True, text=True, timeout=120, env=env or _env())


def _one_line_error(out: subprocess.CompletedProcess[str], start: str) -> str:
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert out.stderr.startswith(start), out.stderr
    return out.stderr.strip()


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    rollout(example.ENV_ID, example.ScriptedAgent(), out=tmp_path / "run")
    return tmp_path / "run"


# ---------------------------------------------------------------------- invalid lines
def test_view_and_export_stop_at_an_invalid_line(run_dir: Path, tmp_path: Path) -> None:
    path = run_dir / "trajectories.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    annotated = json.loads(lines[1])
    annotated["judge_note"] = "checked by hand"
    lines[1] = json.dumps(annotated) + "\n"
    path.write_text("".join(lines))
    why = f"{path}:2: not a valid trajectory (judge_note: Extra inputs are not permitted)"
    assert _one_line_error(_toolenv("view", str(run_dir)), "toolenv view: error: ").endswith(why)
    assert not (run_dir / "report.html").exists()
    sft = tmp_path / "sft.jsonl"
    assert _one_line_error(_toolenv("export", str(run_dir), "--out", str(sft)), "toolenv export: error: ").endswith(why)
    assert not sft.exists()


def test_view_and_export_leave_out_a_partial_last_line_with_a_warning(run_dir: Path, tmp_path: Path) -> None:
    path = run_dir / "trajectories.jsonl"
    path.write_text(path.read_text() + '{"schema_version": 1, "env_id": "rollout_ex')  # a killed write
    warning = f"{path}:5: left out a partial last line (a run killed mid-write; resuming reruns it)"
    out = _toolenv("view", str(run_dir))
    assert out.returncode == 0 and out.stderr.strip() == f"toolenv view: warning: {warning}"
    out = _toolenv("export", str(run_dir), "--out", str(tmp_path / "sft.jsonl"))
    assert out.returncode == 0 and out.stderr.strip() == f"toolenv export: warning: {warning}"
    assert "wrote 4 of 4 trajectories" in out.stdout


def test_a_missing_image_file_is_named(tmp_path: Path) -> None:
    rollout(example.ENV_ID, example.ScriptedAgent(), out=tmp_path, images="files")
    (stored,) = (tmp_path / "images").iterdir()
    stored.unlink()
    for command in ("view", "export"):
        args = [command, str(tmp_path)] + (["--out", str(tmp_path / "sft.jsonl")] if command == "export" else [])
        line = _one_line_error(_toolenv(*args), f"toolenv {command}: error: ")
        assert "not a valid trajectory" in line and f"{stored.name} is missing" in line


def test_export_into_a_fifo_writes_into_it(run_dir: Path, tmp_path: Path) -> None:
    """`--out` a FIFO (or /dev/stdout, /dev/null: not regular files) is written into, as `tee` or a
    shell's `>` would; renaming a temporary file over it would replace the FIFO (and, run as
    root, /dev/stdout or /dev/null themselves) with a regular file."""
    fifo = tmp_path / "sft.fifo"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # a reader is there: the writer's open goes through
    try:
        out = _toolenv("export", str(run_dir), "--out", str(fifo))
        data = b""
        while chunk := os.read(reader, 65536):  # the writer has closed: the rest, then EOF
            data += chunk
    finally:
        os.close(reader)
    assert out.returncode == 0, out.stderr
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode), "the FIFO was replaced by a regular file"
    assert len(data.decode().splitlines()) == 4 and "wrote 4 of 4 trajectories" in out.stdout
    assert not [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]  # no temporary file left


@pytest.mark.skipif(not Path("/dev/fd").is_dir(), reason="no /dev/fd")
@pytest.mark.parametrize("earlier", ["", '{"earlier": "export"}\n'])
def test_export_to_stdout_writes_the_data_alone(tmp_path: Path, earlier: str) -> None:
    """`--out /dev/stdout` (here /dev/fd/1: the same descriptor) writes the data into stdout as the
    shell opened it (`| jq`, `> f`, `>> f` keeps what f held), and the count goes to stderr, not
    into the data."""
    rollout(example.ENV_ID, example.ScriptedAgent(), out=tmp_path / "run", n=3)  # the 4th has an image
    dest = tmp_path / "all.jsonl"
    dest.write_text(earlier)

    def export(run: Path) -> subprocess.CompletedProcess[str]:
        with dest.open("a") as stdout:  # the shell's `>> all.jsonl`
            return subprocess.run(
                [TOOLENV, "export", str(run), "--out", "/dev/fd/1"],
                stdout=stdout, stderr=subprocess.PIPE, text=True, timeout=120, env=_env(),
            )  # fmt: skip

    out = export(tmp_path / "run")
    assert out.returncode == 0, out.stderr
    assert out.stderr.strip() == "wrote 3 of 3 trajectories to /dev/fd/1"
    text = dest.read_text()
    assert text.startswith(earlier)
    assert [sorted(json.loads(line)) for line in text[len(earlier) :].splitlines()] == [["messages", "metadata"]] * 3
    # images go to images/ beside the file: a stream has no such folder
    rollout(example.ENV_ID, example.ScriptedAgent(), out=tmp_path / "run")
    line = _one_line_error(export(tmp_path / "run"), "toolenv export: error: a trajectory has images")
    assert line.endswith("export to a file, not /dev/fd/1")
    assert not Path("/dev/fd/images").exists()


def test_export_through_a_symlink_writes_its_target(run_dir: Path, tmp_path: Path) -> None:
    """`--out` a symlink (data kept on another disk) writes the file it points to, whole, and
    keeps the link."""
    (tmp_path / "disk").mkdir()
    real = tmp_path / "disk" / "sft.jsonl"
    real.write_text("an earlier export\n")
    link = tmp_path / "sft.jsonl"
    link.symlink_to(real)
    out = _toolenv("export", str(run_dir), "--out", str(link))
    assert out.returncode == 0, out.stderr
    assert link.is_symlink() and link.resolve() == real.resolve()
    assert len(real.read_text().splitlines()) == 4


@pytest.mark.parametrize(
    ("content", "why"),
    [
        ("garbage\n", "trajectories.jsonl:1: not valid JSON (Expecting value)"),
        ('{"a": 1}\n[1, 2]\n', "trajectories.jsonl:1: not a valid trajectory (env_id: Field required"),
        ("[1, 2]\n", "trajectories.jsonl:1: not a valid trajectory (Input should be an object)"),
        ("", "trajectories.jsonl holds no trajectories"),
        ('{"schema_version": 1', "trajectories.jsonl holds no trajectories (only a partial line 1"),
    ],
)
def test_a_file_without_trajectories_is_an_error(tmp_path: Path, content: str, why: str) -> None:
    (tmp_path / "trajectories.jsonl").write_text(content)
    assert why in _one_line_error(_toolenv("view", str(tmp_path)), "toolenv view: error: ")
    out = _toolenv("export", str(tmp_path), "--out", str(tmp_path / "x.jsonl"))
    assert why in _one_line_error(out, "toolenv export: error: ")


# ---------------------------------------------------------------------- signals
SLOW = (
    "import asyncio\nfrom rollout_example import ScriptedAgent\n"
    "class Slow(ScriptedAgent):\n"
    "    quick = ('sum-2',)\n"
    "    async def act(self, o, m, i):\n"
    "        await asyncio.sleep(0.0 if i.task.id in self.quick else 60)\n"
    "        return await super().act(o, m, i)\n"
    "class Slower(Slow):\n"
    "    quick = ('price',)\n"
)


def _lines(path: Path) -> int:
    return path.read_text().count("\n") if path.exists() else 0


def _start_and_wait(cmd: list[str], env: dict[str, str], path: Path, lines: int) -> subprocess.Popen[str]:
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and _lines(path) < lines:
        time.sleep(0.1)
    assert _lines(path) == lines
    return proc


def test_sigterm_is_handled_like_ctrl_c_and_no_stale_summary_is_left(tmp_path: Path) -> None:
    (tmp_path / "slow_agent.py").write_text(SLOW)
    env = _env(tmp_path)
    out = tmp_path / "run"
    path, summary = out / "trajectories.jsonl", out / "summary.json"
    base = [TOOLENV, "rollout", f"rollout_example:{example.ENV_ID}", "-c", "4", "--out", str(out), "--no-progress"]
    first = subprocess.run([*base, "--agent", "rollout_example:ScriptedAgent", "-n", "1"], env=env, timeout=120)
    assert first.returncode == 0 and json.loads(summary.read_text())["episodes"] == 1

    # SIGTERM (kill, timeout, docker stop, a preempted job): the run ends as on Ctrl-C.
    proc = _start_and_wait([*base, "--agent", "slow_agent:Slow"], env, path, 2)  # sum-1 resumed, sum-2 new
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err
    assert err.strip() == (
        f"toolenv rollout: stopped by SIGTERM; 2 trajectories kept in {path} (run the same command to resume)"
    )
    written = json.loads(summary.read_text())
    assert written["interrupted"] is True and written["episodes"] == 2 == _lines(path)

    # SIGKILL cannot be handled: then there is no summary at all, never the last run's.
    proc = _start_and_wait([*base, "--agent", "slow_agent:Slower"], env, path, 3)
    proc.kill()
    proc.communicate(timeout=60)
    assert _lines(path) == 3 and not summary.exists()


SLOW_LOAD = (
    "import pathlib, time\nfrom rollout_example import ScriptedAgent\n"
    "class SlowLoad(ScriptedAgent):\n"
    "    def __init__(self, marker):\n"
    "        pathlib.Path(marker).write_text('loading')\n"
    "        time.sleep(20)  # a model's weights loading: a blocking call on the event loop\n"
    "        pathlib.Path(marker).write_text('loaded')\n"
)


def test_a_second_ctrl_c_stops_a_blocking_load_at_once(tmp_path: Path) -> None:
    """Loading an agent (a model's weights) or building an env blocks the event loop: the first
    Ctrl-C asks for a clean stop, which can come only when the load returns, and a second one
    acts as usual and interrupts the load itself (docs/rollout.md: "A second signal acts as usual")."""
    (tmp_path / "slow_load_agent.py").write_text(SLOW_LOAD)
    marker = tmp_path / "marker"
    cmd = [
        TOOLENV, "rollout", f"rollout_example:{example.ENV_ID}", "--agent", "slow_load_agent:SlowLoad",
        "--agent-arg", f"marker={marker}", "--out", str(tmp_path / "run"), "--no-progress",
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(tmp_path))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (marker.exists() and marker.read_text() == "loading"):
        time.sleep(0.05)
    assert marker.read_text() == "loading"
    while proc.poll() is None and marker.read_text() != "loaded":  # Ctrl-C, again, until it stops
        proc.send_signal(signal.SIGINT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=0.5)
    _, err = proc.communicate(timeout=60)
    assert marker.read_text() == "loading", "the load ran to its end: Ctrl-C could not stop it"
    assert proc.returncode == 130, err
    assert err.strip().startswith("toolenv rollout: interrupted;"), err


FAILING = (
    "from rollout_example import ScriptedAgent\n"
    "class Down(ScriptedAgent):\n"
    "    fails = None  # every task\n"
    "    async def act(self, o, m, i):\n"
    "        if self.fails is None or i.task.id in self.fails:\n"
    "            raise ConnectionError('the model server refused the connection')\n"
    "        return await super().act(o, m, i)\n"
    "class Flaky(Down):\n"
    "    fails = ('sum-2',)\n"
)


def test_a_run_whose_every_episode_failed_exits_non_zero(tmp_path: Path) -> None:
    """A server down or a wrong --base-url fails every episode: that is a failed run, not data, so
    `rollout && export` stops (exit 1, one line with the first error); some failures are data (exit 0)."""
    (tmp_path / "failing_agent.py").write_text(FAILING)
    env = _env(tmp_path)
    base = ["rollout", f"rollout_example:{example.ENV_ID}", "--no-progress", "-n", "3"]
    down = _toolenv(*base, "--agent", "failing_agent:Down", "--out", str(tmp_path / "down"), env=env)
    assert down.returncode == 1, down.stderr
    assert down.stderr.strip().splitlines()[-1] == (
        "toolenv rollout: every episode of this run ended with an error (3; fix the cause, then rerun them "
        "with --retry-errors), e.g.: "
        "agent failed on turn 0: ConnectionError: the model server refused the connection"
    )
    assert _lines(tmp_path / "down" / "trajectories.jsonl") == 3  # what was written stays
    flaky = _toolenv(*base, "--agent", "failing_agent:Flaky", "--out", str(tmp_path / "flaky"), env=env)
    assert flaky.returncode == 0, flaky.stderr
    assert flaky.stderr.strip().startswith("1 episode(s) ended with an error")
    again = _toolenv(*base, "--agent", "failing_agent:Flaky", "--out", str(tmp_path / "flaky"), env=env)
    assert again.returncode == 0, again.stderr  # nothing new to play: not a failed run


SERVER_ERROR = (
    "from rollout_example import ScriptedAgent\n"
    "class Body(ScriptedAgent):\n"
    "    async def act(self, o, m, i):\n"
    "        if i.task.id != 'sum-2' or BODY_ON_EVERY:\n"
    "            body = '{\\n  \"error\": {\\n    \"message\": \"' + 'x' * 3000 + '\"\\n  }\\n}'\n"
    "            raise RuntimeError('Error code: 500 - ' + body)\n"
    "        return await super().act(o, m, i)\n"
)


@pytest.mark.parametrize("every", [True, False])
def test_the_first_error_a_run_names_is_one_line(tmp_path: Path, every: bool) -> None:
    """An error with a server's response body in it (several lines, thousands of characters) was
    printed as it is: the failed run's one line was a page of JSON."""
    (tmp_path / "body_agent.py").write_text(f"BODY_ON_EVERY = {every}\n" + SERVER_ERROR)
    out = _toolenv(
        "rollout", f"rollout_example:{example.ENV_ID}", "--no-progress", "-n", "3", "--agent", "body_agent:Body",
        "--out", str(tmp_path / "run"), env=_env(tmp_path),
    )  # fmt: skip
    assert out.returncode == (1 if every else 0), out.stderr
    (line,) = out.stderr.strip().splitlines()
    said = "every episode of this run ended with an error (3; " if every else "2 episode(s) ended with an error"
    assert said in line
    error = 'agent failed on turn 0: RuntimeError: Error code: 500 - { "error": { "message": "'
    assert line.endswith(": " + error + "x" * (MAX_ERROR_CHARS - 1 - len(error)) + "…")  # clipped as error_line clips


# ---------------------------------------------------------------------- arguments and error lines
def test_negative_seed_is_a_usage_error(tmp_path: Path) -> None:
    out = _toolenv(
        "rollout", f"rollout_example:{example.ENV_ID}", "--agent", "rollout_example:ScriptedAgent",
        "--out", str(tmp_path / "run"), "--seed", "-2",
    )  # fmt: skip
    line = _one_line_error(out, "toolenv rollout: error: argument --seed: must be 0 or more")
    assert line.endswith("got -2 (see toolenv rollout --help)")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("max_turns=3", 3),
        ("name=007", "007"),  # not a JSON number: the string as typed
        ("strict=true", True),
        ("strict=True", "True"),
        ('tools=["sql"]', ["sql"]),
        ("model=Qwen/Qwen2.5-7B", "Qwen/Qwen2.5-7B"),
        ("stop=a=b", "a=b"),
        ("name=NaN", "NaN"),  # JSON has no NaN or Infinity: strings, not floats run.json cannot hold
        ("name=Infinity", "Infinity"),
        ("name=-Infinity", "-Infinity"),
    ],
)
def test_key_value_arguments_read_json_values_only(text: str, value: object) -> None:
    """`--env-arg` / `--agent-arg K=V`: V is read as JSON when it is JSON, else kept as typed."""
    from toolenv.commands.rollout_cmd import _kv

    key, parsed = _kv(text)
    assert (key, parsed, type(parsed)) == (text.partition("=")[0], value, type(value))


def test_unknown_option_is_reported_by_the_subcommand(tmp_path: Path) -> None:
    out = _toolenv("rollout", "toolenv/ToolEnv-v0", "--agent", "oracle", "--out", str(tmp_path), "--bogus")
    line = _one_line_error(out, "toolenv rollout: error: ")
    assert line == "toolenv rollout: error: unrecognized arguments: --bogus (see toolenv rollout --help)"


def test_a_validation_error_names_its_field(tmp_path: Path) -> None:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"foo": 1}\n')
    out = _toolenv(
        "rollout", f"rollout_example:{example.ENV_ID}", "--agent", "rollout_example:ScriptedAgent",
        "--out", str(tmp_path / "run"), "--tasks", str(tasks),
    )  # fmt: skip
    assert _one_line_error(out, "toolenv rollout: error: ") == (
        "toolenv rollout: error: task 0 is not valid: foo: Extra inputs are not permitted"
    )


def test_check_tool_kwargs_are_validated_in_one_line() -> None:
    pytest.importorskip("toolenv_sql", reason="the SQL plugin (toolenv-sql) is not installed")
    line = _one_line_error(_toolenv("check", "sql", "--kwargs", '{"timeout": "abc"}'), "toolenv check: error: ")
    assert line == (
        "toolenv check: error: tool 'sql' (SQLTool) limits: timeout: Input should be a valid number, "
        "unable to parse string as a number"
    )
    line = _one_line_error(_toolenv("check", "sql", "--kwargs", '{"timeot": 5}'), "toolenv check: error: ")
    assert "unknown tool limit 'timeot'; known limits: timeout, max_concurrency" in line


def test_error_line_keeps_the_cause() -> None:
    from pydantic import BaseModel, ValidationError

    class Task(BaseModel):
        id: str
        n: int = 0

    try:
        Task.model_validate({"n": "x"})
    except ValidationError as exc:
        assert error_line(exc) == (
            "Task: id: Field required; n: Input should be a valid integer, unable to parse string as an integer"
        )
        wrapped = ValueError(f"task 3 is not valid: {exc}")
        wrapped.__context__ = exc
        assert error_line(wrapped).startswith("task 3 is not valid: id: Field required; n: Input should be")
    hf = OSError("Couldn't instantiate the backend tokenizer from one of: \n(1) a file,\n(2) a slow tokenizer.")
    assert error_line(hf) == "Couldn't instantiate the backend tokenizer from one of: (1) a file, (2) a slow tokenizer."
    long = error_line(RuntimeError("x" * 5000))
    assert len(long) == MAX_ERROR_CHARS and long.endswith("…")
    assert error_line(KeyError()) == "KeyError"


def test_list_shows_plugin_rewards_without_importing_plugins() -> None:
    pytest.importorskip("toolenv_sql", reason="the SQL plugin (toolenv-sql) is not installed")
    code = (
        "import json, sys, io, contextlib\nfrom toolenv.cli import main\n"
        "buf = io.StringIO()\nwith contextlib.redirect_stdout(buf): main(['list', '--json'])\n"
        "print(json.dumps({'rewards': json.loads(buf.getvalue())['rewards'], "
        "'imported': sorted(m for m in sys.modules if m.startswith('toolenv_'))}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    data = json.loads(out.stdout)
    rewards = {r["name"]: r for r in data["rewards"]}
    assert rewards["execution_match"]["dist"].startswith("toolenv-sql ")
    assert rewards["execution_match"]["target"] == "toolenv_sql.reward"
    assert rewards["exact_match"]["dist"] == "toolenv (core)"
    assert data["imported"] == []


# ---------------------------------------------------------------------- outputs a command must not clobber
def test_ctrl_c_of_an_overwrite_run_says_to_resume_without_overwrite(tmp_path: Path) -> None:
    """The line after Ctrl-C tells how to resume; for a run started with --overwrite, running
    "the same command" would throw away the trajectories it just said were kept."""
    (tmp_path / "slow_agent.py").write_text(SLOW)
    out = tmp_path / "run"
    path = out / "trajectories.jsonl"
    cmd = [
        TOOLENV, "rollout", f"rollout_example:{example.ENV_ID}", "--agent", "slow_agent:Slow",
        "--out", str(out), "--no-progress", "--overwrite",
    ]  # fmt: skip
    proc = _start_and_wait(cmd, _env(tmp_path), path, 1)  # sum-2 is quick, the others wait
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert err.strip() == (
        f"toolenv rollout: interrupted; 1 trajectories kept in {path} (run it again without --overwrite to resume)"
    )


def test_view_refuses_to_write_the_report_over_a_runs_trajectories(run_dir: Path) -> None:
    """`toolenv export` refuses an --out that is a run's trajectories file; `toolenv view` wrote
    the HTML page over it, and the run was gone."""
    path = run_dir / "trajectories.jsonl"
    before = path.read_bytes()
    for run in (run_dir, path):
        out = _toolenv("view", str(run), "--out", str(path))
        line = _one_line_error(out, "toolenv view: error: ")
        assert line == f"toolenv view: error: --out {path} is the trajectories file of a run being reported on"
    assert path.read_bytes() == before


@pytest.mark.parametrize("command", ["rollout", "export", "view"])
def test_an_output_folder_that_is_a_file_is_named(run_dir: Path, tmp_path: Path, command: str) -> None:
    """An --out whose folder is a file was `[Errno 17] File exists: '...'`, which says nothing
    of what is wrong."""
    a_file = tmp_path / "notes.txt"
    a_file.write_text("mine\n")
    if command == "rollout":
        for out in (a_file, a_file / "run"):
            got = _toolenv(
                "rollout", f"rollout_example:{example.ENV_ID}", "--agent", "rollout_example:ScriptedAgent",
                "--out", str(out), "--no-progress",
            )  # fmt: skip
            line = _one_line_error(got, "toolenv rollout: error: ")
            assert line == f"toolenv rollout: error: --out {out}: {a_file} is a file, not a folder"
    else:
        out = a_file / "sub" / "x.out"
        line = _one_line_error(_toolenv(command, str(run_dir), "--out", str(out)), f"toolenv {command}: error: ")
        assert line == f"toolenv {command}: error: --out {out}: {a_file} is a file, not a folder"
    assert a_file.read_text() == "mine\n"


@pytest.mark.parametrize(("command", "name"), [("export", "sft.jsonl"), ("view", "report.html")])
def test_an_output_that_is_a_folder_is_named(run_dir: Path, tmp_path: Path, command: str, name: str) -> None:
    """An --out that is a folder (`--out out/`, meaning "put it there") was `[Errno 21] Is a
    directory: '...'`, and `toolenv view` said so only after reading the whole run."""
    folder = tmp_path / "out"
    folder.mkdir()
    line = _one_line_error(_toolenv(command, str(run_dir), "--out", str(folder)), f"toolenv {command}: error: ")
    assert line == f"toolenv {command}: error: --out {folder} is a folder: name the file to write, e.g. {folder / name}"
    assert list(folder.iterdir()) == []


@pytest.mark.parametrize("port", ["65536", "-1"])
def test_view_serve_on_a_port_out_of_range_is_a_usage_error(run_dir: Path, port: str) -> None:
    """A port no socket can have is refused with the options, before the report is written (it
    was `bind(): port must be 0-65535.`, once the page was written)."""
    out = _toolenv("view", str(run_dir), "--serve", "--port", port)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert out.stderr.strip() == (
        f"toolenv view: error: argument --port: must be 0 to 65535 (0 picks a free one), got {port} "
        "(see toolenv view --help)"
    )
    assert not (run_dir / "report.html").exists()


def test_view_serve_on_a_port_in_use_names_the_address(run_dir: Path) -> None:
    """As `toolenv serve` says it: `cannot listen on HOST:PORT: ...`, not a bare errno."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = _toolenv("view", str(run_dir), "--serve", "--port", str(port))
    assert out.returncode == 2, out.stderr
    assert out.stderr.strip() == f"toolenv view: error: cannot listen on 127.0.0.1:{port}: Address already in use"


TERM_MID_WRITE = (
    "import os, signal, sys\n"
    "from toolenv.cli import main\n"
    "from toolenv.commands import export_cmd\n"
    "# the warning for the partial last line comes while the export is being written: SIGTERM then\n"
    "export_cmd._warn = lambda message: os.kill(os.getpid(), signal.SIGTERM)\n"
    "sys.exit(main(sys.argv[1:]))\n"
)


def test_sigterm_mid_export_leaves_no_temporary_file(run_dir: Path, tmp_path: Path) -> None:
    """SIGTERM (`timeout`, `docker stop`, a preempted job) ends an export as Ctrl-C does: the file
    it was writing is not left behind (a hidden `.NAME.<hex>.tmp` as large as the export), the
    earlier export stays, one line says so, and the status is 143."""
    path = run_dir / "trajectories.jsonl"
    path.write_text(path.read_text() + '{"schema_version": 1, "env_id": "cut here')  # a killed run's last line
    out_dir = tmp_path / "sft"
    out_dir.mkdir()
    (out_dir / "x.jsonl").write_text("an earlier export\n")
    got = subprocess.run(
        [sys.executable, "-c", TERM_MID_WRITE, "export", str(run_dir), "--out", str(out_dir / "x.jsonl")],
        capture_output=True, text=True, timeout=120, env=_env(),
    )  # fmt: skip
    assert got.returncode == 128 + signal.SIGTERM, got.stderr
    assert got.stderr.strip() == "toolenv export: stopped by SIGTERM"
    assert [p.name for p in out_dir.iterdir() if p.is_file()] == ["x.jsonl"]  # (images/ holds whole images)
    assert (out_dir / "x.jsonl").read_text() == "an earlier export\n"
