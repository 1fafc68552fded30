"""What `toolenv rollout` reports when the model server fails.

A flaky server (503s, a 429 storm, a wrong URL) ends episodes with `error`, and a run must say
so in a way a user reads right: the metrics over the episodes that completed next to the
all-episodes ones, this run's first error (not an earlier run's), what to do next
(`--retry-errors`, a lower `max_concurrency`, free space on a full disk), and what the server
did to the turns that completed (retried requests, generations cut by `max_tokens`, replies
without usage). Real runs of the `openai` agent against a scripted server on 127.0.0.1.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from _examples import load_example

from toolenv.cli import main
from toolenv.report.console import format_summary, summary_rows
from toolenv.report.summary import Summary

ROOT = Path(__file__).resolve().parents[1]
example = load_example("rollout_example")

#: What the server does with its request number `i` (from 0): "ok", "length" (finish_reason
#: "length", as a cut by max_tokens), "nousage" (no `usage`), or an HTTP status to fail with ("503").
Plan = Callable[[int], str]


class ScriptedServer:
    """A chat-completions server whose every reply is `<answer>5</answer>` unless `plan` says otherwise."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.requests = 0
        lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers["Content-Length"]))
                with lock:
                    i, outer.requests = outer.requests, outer.requests + 1
                kind = outer.plan(i) if self.path == "/v1/chat/completions" else "404"
                status, payload = _reply(kind)
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"


def _reply(kind: str) -> tuple[int, dict[str, Any]]:
    """The status and body of a reply of `kind`."""
    if kind.isdigit():
        return int(kind), {"error": {"message": f"scripted {kind}"}}
    body: dict[str, Any] = {
        "id": "x",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "<answer>5</answer>"},
                "finish_reason": "length" if kind == "length" else "stop",
            }
        ],
    }
    if kind != "nousage":
        body["usage"] = {"prompt_tokens": 10, "completion_tokens": 3}
    return 200, body


@contextmanager
def serving(plan: Plan) -> Iterator[ScriptedServer]:
    server = ScriptedServer(plan)
    thread = threading.Thread(target=server.httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.httpd.shutdown()
        server.httpd.server_close()


def _tasks(tmp_path: Path, n: int) -> Path:
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps({"id": f"t{i}", "question": "2+3?", "answer": "5"}) + "\n" for i in range(n)))
    return path


def _rollout(
    out: Path, url: str, tasks: Path, *more: str, samples: int = 1, retries: int = 0, n: int | None = None
) -> int:
    """`toolenv rollout` of the openai agent (text mode, one episode at a time) on `tasks`."""
    argv = ["rollout", "toolenv/ToolEnv-v0", "--agent", "openai", "--model", "m", "--base-url", url]
    argv += ["--agent-arg", f"max_retries={retries}", "--agent-arg", "backoff=0.01", "--agent-arg", "tool_calling=text"]
    argv += ["--env-arg", "parser=hermes", "--env-arg", "reward=exact_match", "--tasks", str(tasks)]
    argv += ["--samples", str(samples), "-c", "1", "--out", str(out), "--no-progress", *more]
    if n is not None:
        argv += ["-n", str(n)]
    return main(argv)


def _summary(out: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((out / "summary.json").read_text())
    return data


def _rows(out: Path) -> dict[str, str]:
    return dict(summary_rows(Summary.model_validate(_summary(out))))


# ---------------------------------------------------------------------- 1. server failures apart
def test_metrics_over_the_completed_episodes_leave_out_the_servers_failures(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A model that always answers right, behind a server that fails every other request: the
    all-episodes numbers keep their meaning (0.5), the completed ones say the model is right."""
    out = tmp_path / "run"
    with serving(lambda i: "503" if i % 2 else "ok") as server:
        assert _rollout(out, server.url, _tasks(tmp_path, 5), samples=4) == 0
    s = _summary(out)
    assert (s["episodes"], s["episode_errors"], s["mean_reward"], s["success_rate"]) == (20, 10, 0.5, 0.5)
    assert s["completed_episodes"] == 10
    assert (s["completed_mean_reward"], s["completed_success_rate"]) == (1.0, 1.0)
    assert s["completed_pass_at_k"] == {"1": 1.0, "2": 1.0}  # each task: 2 of its 4 samples completed
    assert s["pass_at_k"]["1"] == 0.5
    rows = _rows(out)
    assert rows["episodes, completed"] == "10 (10 failed: rerun with --retry-errors)"
    assert rows["mean reward, completed"] == "1.0000"
    assert rows["success rate, completed"] == "100.0%"
    assert rows["pass@k, completed"] == "pass@1 100.0%, pass@2 100.0%"
    table = capsys.readouterr().out
    assert "episodes, completed" in table and "success rate, completed" in table


def test_without_failed_episodes_the_completed_numbers_are_the_same_and_not_shown(tmp_path: Path) -> None:
    out = tmp_path / "run"
    with serving(lambda i: "ok") as server:
        assert _rollout(out, server.url, _tasks(tmp_path, 3), samples=2) == 0
    s = _summary(out)
    assert s["completed_episodes"] == s["episodes"] == 6
    assert s["completed_mean_reward"] == s["mean_reward"] and s["completed_success_rate"] == s["success_rate"]
    assert s["completed_pass_at_k"] == s["pass_at_k"]
    assert not [k for k in _rows(out) if "completed" in k]


def test_a_run_with_no_completed_episode_has_no_completed_metrics(tmp_path: Path) -> None:
    out = tmp_path / "run"
    with serving(lambda i: "503") as server:
        assert _rollout(out, server.url, _tasks(tmp_path, 2)) == 1
    s = _summary(out)
    assert s["completed_episodes"] == 0
    assert s["completed_mean_reward"] is None and s["completed_success_rate"] is None
    rows = _rows(out)
    assert rows["episodes, completed"] == "0 (2 failed: rerun with --retry-errors)"
    assert "success rate, completed" not in rows


# ---------------------------------------------------------------------- 2. this run's first error
def test_the_error_quoted_is_this_runs_first_not_an_earlier_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, tasks = tmp_path / "run", _tasks(tmp_path, 4)
    with serving(lambda i: "500") as server:
        assert _rollout(out, server.url, tasks, n=2) == 1
        assert "HTTP 500" in capsys.readouterr().err
        wrong = server.url.removesuffix("/v1") + "/wrong"
        assert _rollout(out, wrong, tasks, n=4) == 1  # its 2 new episodes fail with a 404
    err = capsys.readouterr().err
    line = next(x for x in err.splitlines() if "ended with an error" in x)
    assert "HTTP 404" in line and "check base_url" in line and "HTTP 500" not in line


def test_a_partly_failed_run_quotes_its_own_first_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out, tasks = tmp_path / "run", _tasks(tmp_path, 4)
    with serving(lambda i: "500") as server:
        assert _rollout(out, server.url, tasks, n=2) == 1
    capsys.readouterr()
    with serving(lambda i: "503" if i == 0 else "ok") as server:  # of 2 new episodes, the first fails
        assert _rollout(out, server.url, tasks, n=4) == 0
    line = next(x for x in capsys.readouterr().err.splitlines() if "ended with an error" in x)
    assert line.startswith("3 episode(s) ended with an error") and "HTTP 503" in line and "HTTP 500" not in line


# ---------------------------------------------------------------------- 3. what to do next
def test_the_failure_line_names_retry_errors_and_a_plain_rerun_says_it_skips_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, tasks = tmp_path / "run", _tasks(tmp_path, 4)
    with serving(lambda i: "500" if i < 2 else "ok") as server:
        assert _rollout(out, server.url, tasks) == 0
        err = capsys.readouterr().err
        line = next(x for x in err.splitlines() if "ended with an error" in x)
        assert line.startswith("2 episode(s) ended with an error") and "--retry-errors" in line
        assert _rollout(out, server.url, tasks) == 0  # the same command: nothing new, the errors stay
        captured = capsys.readouterr()
        assert "0 new, 4 already done" in captured.out
        line = next(x for x in captured.err.splitlines() if "ended with an error" in x)
        assert "none of them in this run" in line and "--retry-errors" in line
        assert _rollout(out, server.url, tasks, "--retry-errors") == 0
    assert _summary(out)["episode_errors"] == 0


def test_mostly_429_suggests_a_lower_max_concurrency(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The first error is a 503, six of the seven a 429: one line says so, with what to lower."""
    plan = ["503", "ok", "429", "429", "429", "429", "429", "429"]
    with serving(lambda i: plan[i]) as server:
        assert _rollout(tmp_path / "run", server.url, _tasks(tmp_path, 8)) == 0
    err = capsys.readouterr().err
    assert "7 episode(s) ended with an error (rerun them with --retry-errors), e.g.: " in err
    hint = [x for x in err.splitlines() if "max_concurrency" in x]
    assert len(hint) == 1 and hint[0].startswith(
        "toolenv rollout: 6 of 7 failed episodes of this run ended on HTTP 429"
    )
    assert "--agent-arg max_concurrency=N" in hint[0]


def test_a_run_that_only_met_429s_says_what_to_lower_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Every episode ended on a 429: the advice is given once (the agent's own error may give it)."""
    with serving(lambda i: "429") as server:
        assert _rollout(tmp_path / "run", server.url, _tasks(tmp_path, 3)) == 1
    err = capsys.readouterr().err
    assert err.count("--agent-arg max_concurrency=N") == 1, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("toolenv rollout: every episode of this run ended with an error (3; ")


def test_errors_other_than_429_do_not_suggest_max_concurrency(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with serving(lambda i: "503" if i % 2 else "ok") as server:
        assert _rollout(tmp_path / "run", server.url, _tasks(tmp_path, 4)) == 0
    assert "max_concurrency" not in capsys.readouterr().err


def test_a_full_disk_says_what_was_kept_and_how_to_resume(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Every write fails with ENOSPC (the file is /dev/full): one line, exit 2, no hang reading it."""
    if not Path("/dev/full").exists():
        pytest.skip("needs /dev/full")
    out = tmp_path / "run"
    out.mkdir()
    (out / "trajectories.jsonl").symlink_to("/dev/full")
    rc = main(
        ["rollout", example.ENV_ID, "--agent", "rollout_example:ScriptedAgent", "--out", str(out), "--no-progress"]
    )
    assert rc == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1, lines
    assert "[Errno 28]" in lines[0] and f"0 trajectories kept in {out / 'trajectories.jsonl'}" in lines[0]
    assert lines[0].endswith("(free space and run the same command to resume)")


def test_a_file_size_limit_keeps_the_complete_lines_and_resumes(tmp_path: Path) -> None:
    """Writes past 10 KB fail (EFBIG, as a full disk would fail them): the line counts the whole
    trajectories in the file, and the same command then finishes the run."""
    out = tmp_path / "run"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "examples"), env.get("PYTHONPATH", "")])
    cmd = [sys.executable, "-m", "toolenv.cli", "rollout", f"rollout_example:{example.ENV_ID}"]
    cmd += ["--agent", "rollout_example:ScriptedAgent", "-c", "1", "--out", str(out), "--no-progress"]

    def limit() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails (EFBIG) instead of killing
        resource.setrlimit(resource.RLIMIT_FSIZE, (10_000, 10_000))

    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, preexec_fn=limit, timeout=120)
    assert proc.returncode == 2, proc.stderr
    path = out / "trajectories.jsonl"
    complete = path.read_bytes().count(b"\n")
    assert 0 < complete < 4
    line = proc.stderr.strip()
    assert "\n" not in line and "[Errno 27] File too large" in line
    assert f"{complete} trajectories kept in {path}" in line and "run the same command to resume" in line
    again = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert again.returncode == 0, again.stderr
    assert f"{4 - complete} new, {complete} already done" in again.stdout


# ---------------------------------------------------------------------- 5. the server's trouble
def test_retries_cut_generations_and_missing_usage_are_counted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Per request: 0 ok; 1 503, 2 503, 3 ok (a turn retried twice); 4 length; 5 nousage; 6 429, 7 ok."""
    kinds = ["ok", "503", "503", "ok", "length", "nousage", "429", "ok"]
    out = tmp_path / "run"
    with serving(lambda i: kinds[i] if i < len(kinds) else "ok") as server:
        assert _rollout(out, server.url, _tasks(tmp_path, 5), retries=2) == 0
    s = _summary(out)
    assert (s["episodes"], s["episode_errors"]) == (5, 0)
    assert (s["agent_retries"], s["retried_turns"]) == (3, 2)
    assert s["truncated_generations"] == 1
    assert s["turns_without_usage"] == 1
    assert (s["prompt_tokens"], s["completion_tokens"]) == (40, 12)
    rows = _rows(out)
    assert rows["model requests retried"] == "3 (in 2 turns)"
    assert rows["generations cut by max_tokens"] == "1"
    assert rows["tokens (prompt / completion)"] == "40 / 12 (1 turn without usage)"
    assert "generations cut by max_tokens" in capsys.readouterr().out


def test_a_healthy_server_adds_no_rows(tmp_path: Path) -> None:
    out = tmp_path / "run"
    with serving(lambda i: "ok") as server:
        assert _rollout(out, server.url, _tasks(tmp_path, 2)) == 0
    s = _summary(out)
    assert (s["agent_retries"], s["retried_turns"], s["truncated_generations"], s["turns_without_usage"]) == (
        0,
        0,
        0,
        0,
    )
    rows = _rows(out)
    assert "model requests retried" not in rows and "generations cut by max_tokens" not in rows
    assert rows["tokens (prompt / completion)"] == "20 / 6"


def test_an_agent_that_reports_no_usage_shows_no_usage_note(tmp_path: Path) -> None:
    """The scripted agent reports no tokens at all: no token row, and no note on every turn."""
    out = tmp_path / "run"
    argv = ["rollout", example.ENV_ID, "--agent", "rollout_example:ScriptedAgent", "--out", str(out), "--no-progress"]
    assert main(argv) == 0
    s = _summary(out)
    assert s["turns_without_usage"] == round(s["mean_turns"] * s["episodes"]) > 0
    assert not [k for k in _rows(out) if "token" in k or "usage" in k]


# ---------------------------------------------------------------------- 7. rates near 0 and 1
@pytest.mark.parametrize(
    ("rate", "shown"),
    [
        (1.0, "100.0%"),
        (0.0, "0.0%"),
        (0.5, "50.0%"),
        (0.9995, "99.95%"),
        (1999 / 2000, "99.95%"),
        (0.99999, "99.999%"),
        (1 - 1e-9, ">99.999%"),
        (0.0004, "0.04%"),
        (1e-9, "<0.001%"),
        (0.9996, "99.96%"),
    ],
)
def test_a_rate_short_of_1_never_shows_as_100_percent(rate: float, shown: str) -> None:
    rows = dict(summary_rows(Summary(episodes=2000, success_rate=rate, tool_error_rate=rate, truncated_rate=rate)))
    assert rows["success rate"] == rows["tool error rate"] == rows["truncated"] == shown


def test_the_summary_of_a_run_with_one_failed_episode_in_2000_is_not_100_percent() -> None:
    s = Summary(
        episodes=2000,
        success_rate=1999 / 2000,
        pass_at_k={"1": 1999 / 2000, "2": 1.0},
        episode_errors=1,
        completed_episodes=1999,
        completed_mean_reward=1.0,
        completed_success_rate=1.0,
    )
    text = format_summary(s)
    assert "100.0%" not in text.split("success rate")[1].splitlines()[0]
    assert "pass@1 99.95%, pass@2 100.0%" in text
