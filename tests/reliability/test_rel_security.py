"""Hostile actions through the plugin envs: each attempt is refused and leaves no trace.

SQL: writes, schema changes, attached files, file-reading functions, stacked
statements and runaway queries against the Spider and Chinook databases, whose
files must be byte-identical afterwards. Code: reading secrets, writing outside
the sandbox, connecting to a listener on 127.0.0.1 in this process, fork and
memory bombs, inheriting this process's environment. Every attempt must come
back as an observation (never an exception) and must not succeed; the env keeps
answering afterwards.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from rel_support import child_pids, make_env, needs_proc

import toolenv

SQL_ATTACKS = [
    "DROP TABLE {table}",
    "DELETE FROM {table}",
    "UPDATE {table} SET rowid = rowid + 1",
    "INSERT INTO {table} DEFAULT VALUES",
    "CREATE TABLE pwned (x)",
    "ALTER TABLE {table} RENAME TO pwned",
    "ATTACH DATABASE 'pwned.db' AS pwned",
    "PRAGMA writable_schema = 1",
    "PRAGMA journal_mode = DELETE",
    "VACUUM INTO 'pwned.db'",
    "REINDEX",
    "SELECT load_extension('pwned')",
    "SELECT readfile('/etc/passwd')",
    "SELECT writefile('pwned.txt', 'x')",
    "SELECT 1; DROP TABLE {table}",
    "SELECT 1 -- harmless\n; DELETE FROM {table}",
]
RUNAWAY = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c"


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _db_file(env: toolenv.ToolEnv) -> Path | None:
    """The task's database file inside the installed plugin (None if it cannot be found)."""
    rel = env.tasks[0].context.get("db_path")
    if not rel:
        return None
    spec = importlib.util.find_spec("toolenv_sql")
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).parent / "data" / str(rel)
    return path if path.is_file() else None


def _table(env: toolenv.ToolEnv) -> str:
    obs, *_ = env.step("<sql>SELECT name FROM sqlite_master WHERE type = 'table' LIMIT 1</sql>")
    for line in obs.splitlines():
        word = line.strip().strip("|").strip()
        if word and word.isidentifier() and word.lower() not in {"name", "information"}:
            return word
    return "sqlite_master"


def sql_env(name: str) -> toolenv.ToolEnv:
    try:
        env = make_env(name, max_turns=1000)
    except toolenv.PluginError as exc:
        pytest.skip(f"toolenv-sql is not installed: {exc}")
    env.reset(options={"task_index": 0})
    return env


@pytest.mark.parametrize("name", ["Spider-v0", "Chinook-v0"])
def test_rel_sql_attacks_are_refused(name: str) -> None:
    env = sql_env(name)
    db = _db_file(env)
    before = _sha256(db) if db else None
    table = _table(env)
    blocked = 0
    for attack in SQL_ATTACKS:
        sql = attack.format(table=table)
        _, _, term, _, info = env.step(f"<sql>{sql}</sql>")
        (result,) = info["tool_results"]
        assert result.is_error, f"{sql!r} was not refused: {result.text[:200]}"
        assert not term
        blocked += 1
    obs, *_ = env.step(f"<sql>SELECT count(*) FROM {table}</sql>")
    assert "error" not in obs.lower(), obs
    env.close()
    if db is not None:
        assert _sha256(db) == before, "the database file changed"
    print(f"\n[security] {name}: {blocked} SQL attempts blocked")
    assert blocked == len(SQL_ATTACKS)


def test_rel_sql_runaway_query_is_stopped() -> None:
    """An endless recursive query is interrupted by the tool's own limit; the env goes on."""
    env = sql_env("Spider-v0")
    _, _, _, _, info = env.step(f"<sql>{RUNAWAY}</sql>")
    (result,) = info["tool_results"]
    # Stopped by the executor's own query limit (its message), not by the caller's tool timeout.
    assert result.is_error and "The query ran longer than" in result.text, result.text
    assert "timed out after" not in result.text
    obs, *_ = env.step("<sql>SELECT 1</sql>")
    assert "1" in obs
    env.close()


@contextlib.contextmanager
def loopback_listener() -> Iterator[tuple[int, list[str]]]:
    """A TCP listener on 127.0.0.1 that records every connection it accepts."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.1)
    accepted: list[str] = []
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, addr = server.accept()
            except OSError:
                continue
            accepted.append(str(addr))
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1], accepted
    finally:
        stop.set()
        thread.join()
        server.close()


def _run(env: toolenv.ToolEnv, code: str) -> toolenv.ToolResult:
    _, _, _, _, info = env.step(f"```python\n{code}\n```")
    (result,) = info["tool_results"]
    assert isinstance(result, toolenv.ToolResult)
    return result


@pytest.fixture
def code_env() -> Iterator[toolenv.ToolEnv]:
    try:
        env = make_env("HumanEval-v0", sandbox={"timeout": 3.0}, max_turns=1000)
    except toolenv.PluginError as exc:
        pytest.skip(f"toolenv-code is not installed: {exc}")
    env.reset(seed=0)
    yield env
    env.close()


@needs_proc
def test_rel_code_sandbox_attempts_are_contained(code_env: toolenv.ToolEnv, tmp_path: Path) -> None:
    outside = tmp_path / "pwned.txt"
    from toolenv_code.sandbox import get_pool

    _run(code_env, "print('warm')")
    get_pool().stats()  # starts every fork server now (each starts on first use), so none counts as stray
    kids = child_pids()
    blocked = 0
    with loopback_listener() as (port, accepted):
        attempts = {
            "read /etc/shadow": "print(open('/etc/shadow').read()[:10])",
            "write outside": f"open({str(outside)!r}, 'w').write('x')\nprint('wrote')",
            "write /etc": "open('/etc/pwned', 'w').write('x')\nprint('wrote')",
            "loopback connect": (
                f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)\nprint('connected')"
            ),
            "fork bomb": "import os\nfor _ in range(64):\n    os.fork()\nprint('forked')",
            "memory bomb": "x = bytearray(16 * 1024 ** 3)\nprint('allocated')",
            "infinite loop": "while True:\n    pass",
        }
        for label, code in attempts.items():
            result = _run(code_env, code)
            assert result.is_error or "Error" in result.text, f"{label}: {result.text[:200]}"
            assert "wrote" not in result.text and "connected" not in result.text, label
            assert "allocated" not in result.text, label
            blocked += 1
        assert accepted == [], "the sandbox reached a listener on this machine"
    assert not outside.exists() and not Path("/etc/pwned").exists()
    assert child_pids() <= kids, "no stray processes among this process's children"
    result = _run(code_env, "print(sum(range(10)))")
    assert not result.is_error and result.text.strip() == "45"
    print(f"\n[security] code sandbox: {blocked} attempts blocked")


def test_rel_code_sandbox_does_not_inherit_environment(code_env: toolenv.ToolEnv) -> None:
    """Variables of the host process (pytest's own, the venv's) are not visible to model code."""
    assert "PYTEST_CURRENT_TEST" in os.environ
    result = _run(code_env, "import os\nprint(sorted(os.environ))")
    assert not result.is_error
    assert "PYTEST_CURRENT_TEST" not in result.text and "VIRTUAL_ENV" not in result.text


_INTERPRETER_PROBE = r"""
import errno, json, os, sys
out = {"prefix": sys.prefix, "secrets": [p for p in SECRETS if os.path.exists(p)], "writes": {}}
for d in [sys.prefix, *(p for p in sys.path if p and os.path.isdir(p))]:
    try:
        with open(os.path.join(d, "rel-pwned.txt"), "w") as fh:
            fh.write("x")
        out["writes"][d] = "written"
    except OSError as exc:
        out["writes"][d] = errno.errorcode.get(exc.errno, str(exc.errno))
import pydantic
out["imported"] = pydantic.__file__
print(json.dumps(out))
"""


@needs_proc
def test_rel_code_sandbox_sees_its_interpreter_read_only_and_nothing_else_of_tmp(code_env: toolenv.ToolEnv) -> None:
    """Model code runs under a private /tmp and /dev/shm. The interpreter's own directories
    (its venv, bound back read-only when it lives under /tmp, as a CI clone's does) are there
    and importable, and every one refuses writes; host files beside them in /tmp, or in
    /dev/shm, are not visible."""
    import json
    import shutil
    import sys
    import tempfile

    homes = [Path("/tmp")]
    prefix = Path(sys.prefix).resolve()
    if Path("/tmp").resolve() in prefix.parents:
        homes.append(prefix.parent)
    made = [Path(tempfile.mkdtemp(prefix="rel-host-", dir=home)) for home in homes]
    secrets = [str(d / "secret.txt") for d in made]
    if Path("/dev/shm").is_dir():
        made.append(Path(tempfile.mkdtemp(prefix="rel-host-", dir="/dev/shm")))
        secrets.append(str(made[-1] / "secret.txt"))
    try:
        for secret in secrets:
            Path(secret).write_text("host only")
        result = _run(code_env, f"SECRETS = {secrets!r}\n{_INTERPRETER_PROBE}")
        assert not result.is_error, result.text
        seen = json.loads(result.text.strip().splitlines()[-1])
    finally:
        for d in made:
            shutil.rmtree(d, ignore_errors=True)
    assert Path(seen["prefix"]).resolve() == prefix
    assert seen["imported"].startswith(seen["prefix"]) or "site-packages" in seen["imported"]
    assert seen["secrets"] == [], f"the sandbox sees host files: {seen['secrets']}"
    assert seen["writes"] and all(v in ("EROFS", "EACCES", "EPERM") for v in seen["writes"].values()), seen["writes"]
    for d in seen["writes"]:
        assert not Path(d, "rel-pwned.txt").exists()
    hidden, readonly = len(secrets), len(seen["writes"])
    print(f"\n[security] code sandbox: {hidden} host files hidden, {readonly} interpreter dirs read-only")
