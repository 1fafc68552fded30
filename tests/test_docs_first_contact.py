"""What a first-time user hits when following the docs, and the error lines that must say what to
type: an env id written as plugins name it (`Spider-v0`, not Gymnasium's guess `Swimmer`), an env
checked without tasks, a rollout count out of range, an agent built without its model."""

from __future__ import annotations

from pathlib import Path

import pytest

from toolenv.cli import main


def _error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """Run `toolenv ARGV`, expect an error (exit 2: argparse's usage errors exit from inside
    `main`), and return its one stderr line."""
    try:
        rc = main(list(argv))
    except SystemExit as exc:
        rc = exc.code
    assert rc == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


@pytest.mark.parametrize("command", ["check", "rollout"])
def test_an_env_id_without_its_namespace_names_the_registered_id(
    command: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    argv = ["check", "Spider-v0"] if command == "check" else ["rollout", "Spider-v0", "--agent", "oracle"]
    if command == "rollout":
        argv += ["--out", str(tmp_path / "run"), "--no-progress"]
    err = _error(capsys, *argv)
    assert err.startswith(f"toolenv {command}: error: Environment `Spider` doesn't exist"), err
    assert "toolenv/Spider-v0" in err, err
    assert "Swimmer" not in err, err  # Gymnasium's guess, a MuJoCo env that has nothing to do with it


def test_an_unknown_env_id_says_where_the_ids_are_listed(capsys: pytest.CaptureFixture[str]) -> None:
    err = _error(capsys, "check", "toolenv/Nope-v0")
    assert err.startswith("toolenv check: error: Environment `Nope` doesn't exist in namespace toolenv"), err
    assert "toolenv list" in err, err


def test_a_misspelt_env_id_keeps_gymnasiums_suggestion(capsys: pytest.CaptureFixture[str]) -> None:
    err = _error(capsys, "check", "toolenv/Spyder-v0")
    assert "Did you mean: `Spider`?" in err, err


def test_checking_an_env_without_tasks_says_how_to_give_them(capsys: pytest.CaptureFixture[str]) -> None:
    """`toolenv list` shows `toolenv/ToolEnv-v0`; checking it as listed fails every check for want
    of tasks, and the env's own message speaks Python (`pass tasks=...`): the command says which
    option gives them, and the option it names works."""
    assert main(["check", "toolenv/ToolEnv-v0"]) == 1
    out = capsys.readouterr()
    assert "0 passed" in out.out
    hint = out.err.strip()
    assert len(hint.splitlines()) == 1, hint
    assert hint.startswith("toolenv check: "), hint
    given = hint.split("--kwargs ", 1)[1].split("'")[1]  # the JSON the hint shows, between its quotes
    assert main(["check", "toolenv/ToolEnv-v0", "--kwargs", given]) == 0
    assert "0 failed" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("flag", "value"),
    [("-n", "0"), ("--samples", "0"), ("--concurrency", "0"), ("-c", "-2"), ("--episode-timeout", "-1")],
)
def test_a_rollout_count_out_of_range_names_the_flag(
    flag: str, value: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """docs/rollout.md gives flags (`-n N`, `--samples K`, `-c C`, `--episode-timeout SECONDS`): a
    value out of range is a usage error naming the flag as typed, not the runner's keyword
    (`samples must be at least 1`), and nothing is written."""
    out = tmp_path / "run"
    err = _error(capsys, "rollout", "toolenv/Spider-v0", "--agent", "oracle", "--out", str(out), flag, value)
    shown = "--concurrency/-c" if flag in ("-c", "--concurrency") else flag  # argparse's name for it
    assert err.startswith(f"toolenv rollout: error: argument {shown}:"), err
    assert value in err and "see toolenv rollout --help" in err, err
    assert not out.exists()


@pytest.mark.parametrize(
    ("agent", "flag"), [("openai", "--model"), ("transformers", "--model"), ("replay", "--agent-arg path=")]
)
def test_an_agent_missing_an_argument_names_the_flag_that_gives_it(
    agent: str, flag: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """docs/agents.md passes `model` as `--model` and other arguments as `--agent-arg KEY=VALUE`;
    an agent built without one says which flag gives it, not only its Python signature's words."""
    argv = ["rollout", "toolenv/Spider-v0", "--agent", agent, "-n", "1", "--no-progress"]
    err = _error(capsys, *argv, "--out", str(tmp_path / "run"))
    assert err.startswith(f"toolenv rollout: error: agent '{agent}' "), err
    assert flag in err, err
