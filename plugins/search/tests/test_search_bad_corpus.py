"""A corpus the BM25 backend cannot read fails when the env (or the tool) is made, in one line
naming the file and line, rather than turning every search into "Search failed" for the policy."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import pytest

import toolenv  # noqa: F401 - registers the envs
from toolenv_search import bm25 as bm25_module
from toolenv_search.bm25 import BM25Backend
from toolenv_search.tool import SearchTool

GOOD = {"id": "a", "title": "Zorblax", "text": "The capital of Zorblax is Quenvar."}


def _write(path: Path, *lines: str) -> Path:
    path.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    return path


def _make(corpus: Path) -> gym.Env[str, str]:
    return gym.make("toolenv/HotpotQA-v0", backend="bm25", backend_options={"corpus": str(corpus)})


def test_a_missing_corpus_fails_gym_make(tmp_path: Path) -> None:
    missing = tmp_path / "corpsu.jsonl"
    with pytest.raises(FileNotFoundError, match=f"corpus not found: {missing}"):
        _make(missing)


def test_a_bad_line_fails_gym_make_naming_the_file_and_line(tmp_path: Path) -> None:
    corpus = _write(tmp_path / "corpus.jsonl", json.dumps(GOOD), "not json")
    with pytest.raises(ValueError, match=f"^{corpus}:2: ") as err:
        _make(corpus)
    assert "\n" not in str(err.value)
    no_text = _write(tmp_path / "no_text.jsonl", json.dumps(GOOD), "", json.dumps({"id": "b", "title": "t"}))
    with pytest.raises(ValueError, match=f'^{no_text}:3: .*"text"'):
        SearchTool("bm25", backend_options={"corpus": no_text})


@pytest.mark.parametrize(
    ("name", "content", "where"),
    [
        ("empty.jsonl", b"", "the corpus has no passages"),
        ("blank.jsonl", b"\n  \n", "the corpus has no passages"),
        ("array.json", json.dumps([GOOD]).encode(), ":1: "),
        ("tasks.jsonl", json.dumps({"id": "q1", "question": "?", "answer": "x"}).encode() + b"\n", ":1: "),
        ("corpus.parquet", b"PAR1\x15\x04\x15\xff\xfe\x00\x80", ":1: "),
        ("latin1.jsonl", json.dumps(GOOD).encode() + b"\n" + '{"text": "caf\xe9"}'.encode("latin-1"), ":2: "),
        ("cr.jsonl", (json.dumps(GOOD) + "\r").encode() * 2 + '{"text": "caf\xe9"}\r'.encode("latin-1"), ":3: "),
    ],
)
def test_the_wrong_kind_of_file_fails_gym_make(tmp_path: Path, name: str, content: bytes, where: str) -> None:
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(ValueError, match=f"^{path}") as err:
        _make(path)
    assert where in str(err.value) and "\n" not in str(err.value)


def test_a_directory_fails_gym_make(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=f"{tmp_path} is a directory"):
        _make(tmp_path)


def test_an_unknown_stemmer_fails_at_construction(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="stemmer"):
        BM25Backend(_write(tmp_path / "c.jsonl", json.dumps(GOOD)), stemmer="klingon")


@pytest.fixture
def corpus_reads(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """The corpora the backend reads through to check them (the real check, counted)."""
    reads: list[Path] = []
    real = bm25_module.check_corpus

    def counted(path: Path) -> int:
        reads.append(Path(path))
        return real(path)

    monkeypatch.setattr(bm25_module, "check_corpus", counted)
    return reads


def test_a_good_corpus_is_read_once_per_process_until_it_changes(tmp_path: Path, corpus_reads: list[Path]) -> None:
    """Every env of a rollout builds a backend: a corpus is read once, not once per env; a
    corpus fixed (or broken) since is read again."""
    corpus = _write(tmp_path / "c.jsonl", json.dumps(GOOD))
    for _ in range(5):
        BM25Backend(corpus)
    assert corpus_reads == [corpus]
    _write(corpus, json.dumps(GOOD), "{oops")
    for _ in range(2):  # a bad corpus is not remembered as good
        with pytest.raises(ValueError, match=f"{corpus}:2: "):
            BM25Backend(corpus)
    _write(corpus, json.dumps(GOOD), json.dumps({**GOOD, "id": "b"}))
    env = _make(corpus).unwrapped
    assert corpus_reads == [corpus] * 4
    env.reset(seed=0)
    obs, *_ = env.step("<search> Zorblax </search>")
    assert "Quenvar" in obs
    env.close()


def test_the_bundled_corpus_is_not_read_at_make_time(corpus_reads: list[Path]) -> None:
    """The default env's make stays as cheap as it was: the shipped corpus is checked by its tests."""
    for _ in range(3):
        gym.make("toolenv/HotpotQA-v0").close()
    assert corpus_reads == []


def test_rollout_with_a_bad_corpus_fails_in_one_line(tmp_path: Path) -> None:
    corpus = _write(tmp_path / "corpus.jsonl", json.dumps(GOOD), "not json")
    tasks = _write(
        tmp_path / "tasks.jsonl", json.dumps({"id": "q1", "question": "Capital of Zorblax?", "answer": "Quenvar"})
    )
    actions = _write(
        tmp_path / "actions.jsonl",
        json.dumps({"task_id": "q1", "actions": ["<search>Zorblax</search>", "<answer>Quenvar</answer>"]}),
    )
    out = subprocess.run(
        [
            sys.executable, "-m", "toolenv.cli", "rollout", "toolenv/HotpotQA-v0",
            "--agent", "replay", "--agent-arg", f"path={actions}",
            "--env-arg", f"tasks={tasks}", "--env-arg", "backend=bm25",
            "--env-arg", "backend_options=" + json.dumps({"corpus": str(corpus)}),
            "--out", str(tmp_path / "run"), "--no-progress",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )  # fmt: skip
    assert out.returncode != 0
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and f"{corpus}:2: " in lines[0], out.stderr


async def test_a_corpus_broken_after_the_backend_was_built_is_a_search_error(tmp_path: Path) -> None:
    """What the check at construction cannot see (the file changed since) still reaches the model
    as a search error naming the line, not an exception out of the step."""
    from toolenv_search.backend import SearchError

    corpus = _write(tmp_path / "c.jsonl", json.dumps(GOOD))
    backend = BM25Backend(corpus, cache_dir=tmp_path / "cache")
    _write(corpus, json.dumps(GOOD), "{oops")
    with pytest.raises(SearchError, match=f"unavailable: {corpus}:2: "):
        await backend.search(["Zorblax"], 1)
