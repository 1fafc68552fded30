"""Images kept as files beside the trajectories (`images="files"`), read back by `read_trajectories`."""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path

import pytest
from _examples import load_example
from pydantic import ValidationError

from toolenv.image_store import IMAGE_STORE, ImageStore
from toolenv.runner import rollout
from toolenv.trajectory import read_trajectories
from toolenv.types import Message, ToolImage

ROOT = Path(__file__).resolve().parents[1]
example = load_example("rollout_example")

PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256))  # not decoded by the store: any bytes do


def _images(run: Path) -> list[ToolImage]:
    trajs = read_trajectories(run / "trajectories.jsonl", strict=True)
    return [im for t in trajs for turn in t.turns for r in turn.results for im in r.images]


def test_files_mode_writes_each_image_once_and_reads_back_the_same(tmp_path: Path) -> None:
    rollout(example.ENV_ID, example.ScriptedAgent(), samples=2, out=tmp_path / "inline")
    rollout(example.ENV_ID, example.ScriptedAgent(), samples=2, out=tmp_path / "files", images="files")
    assert not (tmp_path / "inline" / "images").exists()
    images = _images(tmp_path / "files")
    assert len(images) == 2 and images == _images(tmp_path / "inline")  # the swatch, once per sample
    stored = sorted((tmp_path / "files" / "images").iterdir())
    assert [p.name for p in stored] == [f"{hashlib.sha256(images[0].data).hexdigest()}.png"]  # written once
    assert stored[0].read_bytes() == images[0].data
    text = (tmp_path / "files" / "trajectories.jsonl").read_text()
    written = [
        im
        for line in text.splitlines()
        for turn in json.loads(line)["turns"]
        for r in turn["results"]
        for im in r["images"]
    ]
    assert (
        written
        == [{"file": stored[0].name, "mime": "image/png", "width": images[0].width, "height": images[0].height}] * 2
    )
    assert len(text) < len((tmp_path / "inline" / "trajectories.jsonl").read_text())
    assert json.loads((tmp_path / "files" / "run.json").read_text())["images"] == "files"


def test_a_files_run_resumes(tmp_path: Path) -> None:
    rollout(example.ENV_ID, example.ScriptedAgent(), n=2, out=tmp_path, images="files")
    again = rollout(example.ENV_ID, example.ScriptedAgent(), out=tmp_path, images="files")
    assert again.skipped == 2 and again.new == 2 and again.summary.episodes == 4


def test_a_line_cannot_point_outside_the_store(tmp_path: Path) -> None:
    secret = tmp_path / "secret.png"
    secret.write_bytes(PNG)
    store = ImageStore(tmp_path / "images")
    for name in ("../secret.png", str(secret), "a" * 64 + ".png/../../secret.png", 7):
        with pytest.raises(ValidationError, match="not an image store file name"):
            ToolImage.model_validate({"file": name, "width": 1, "height": 1}, context={IMAGE_STORE: store})


def test_missing_image_file_names_the_line_and_the_file(tmp_path: Path) -> None:
    rollout(example.ENV_ID, example.ScriptedAgent(), out=tmp_path, images="files")
    (stored,) = (tmp_path / "images").iterdir()
    stored.unlink()
    with pytest.raises(ValueError, match=rf"trajectories.jsonl:\d+: not a valid trajectory .*{stored.name} is missing"):
        read_trajectories(tmp_path / "trajectories.jsonl", strict=True)
    assert len(read_trajectories(tmp_path / "trajectories.jsonl")) == 3  # the others still read


def test_a_stored_image_without_its_store_is_a_clear_error(tmp_path: Path) -> None:
    store = ImageStore(tmp_path)
    line = Message(role="tool", content="x", images=[ToolImage(data=PNG, width=1, height=1)]).model_dump_json(
        context={IMAGE_STORE: store}
    )
    assert "file" in json.loads(line)["images"][0]
    with pytest.raises(ValidationError, match=r"stored in a file; read it with toolenv\.read_trajectories"):
        Message.model_validate_json(line)
    assert Message.model_validate_json(line, context={IMAGE_STORE: store}).images[0].data == PNG


def test_store_put_is_idempotent_and_atomic(tmp_path: Path) -> None:
    store = ImageStore(tmp_path / "images")
    a = store.put(PNG, "image/png")
    assert store.put(PNG, "image/png") == a and ImageStore(tmp_path / "images").put(PNG, "image/png") == a
    assert store.put(b"\xff\xd8jpeg", "image/jpeg").endswith(".jpg")
    assert sorted(p.name for p in (tmp_path / "images").iterdir()) == sorted(
        [a, store.put(b"\xff\xd8jpeg", "image/jpeg")]
    )
    assert store.get(a) == PNG


def test_bad_images_mode_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="images must be one of inline, files"):
        rollout(example.ENV_ID, example.ScriptedAgent(), out=tmp_path, images="s3")


def test_stored_images_are_as_readable_as_the_trajectories(tmp_path: Path) -> None:
    # Images were written through mkstemp, which makes files 0600 whatever the umask, while the
    # trajectories.jsonl beside them is 0644: another user (a viewer, a trainer in a container
    # running as someone else) read the lines and then failed on every image with EACCES.
    old = os.umask(0o022)
    try:
        name = ImageStore(tmp_path / "images").put(PNG, "image/png")
        (tmp_path / "plain").write_bytes(b"")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "images" / name).stat().st_mode) == 0o644
    assert stat.S_IMODE((tmp_path / "plain").stat().st_mode) == 0o644
    assert not [p for p in (tmp_path / "images").iterdir() if p.name != name]  # no temporary file left
