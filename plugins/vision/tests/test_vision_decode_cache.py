"""The decoded-image cache's budget is configurable: 512 MB holds ten 12 MP photos, and more in flight
re-decoded a photo on every crop."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from PIL import Image

from toolenv import Task, ToolCall, ToolCaller, ToolContext
from toolenv_vision import CropTool, images, set_decode_cache


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Each full decode's path, in order; the cache's bounds are put back afterwards."""
    decoded: list[str] = []
    real = images._decode

    def decode(path: str) -> Image.Image:
        decoded.append(Path(path).name)
        return real(path)

    monkeypatch.setattr(images, "_decode", decode)
    bounds = images.DECODE_CACHE_BYTES, images._DECODED.max_items
    images.cache_clear()
    yield decoded
    set_decode_cache(bounds[0], max_items=bounds[1])
    images.cache_clear()


def _crop_each(root: Path, names: list[str], rounds: int) -> None:
    caller = ToolCaller([CropTool(root)])
    for _ in range(rounds):
        for name in names:
            call = ToolCall(name="crop", arguments={"bbox": [0, 0, 100, 100], "units": "pixels"}, id="c")
            (r,), _ = asyncio.run(caller.invoke([call], ToolContext(task=Task(context={"image": name}))))
            assert not r.is_error, r.text


def test_a_bigger_budget_stops_re_decoding_photos_in_flight(tmp_path: Path, counted: list[str]) -> None:
    names = [f"{i}.png" for i in range(4)]
    for i, name in enumerate(names):
        Image.new("RGB", (1000, 1000), (i, i, i)).save(tmp_path / name)  # 4 MB each decoded
    set_decode_cache(9_000_000)  # room for two of the four
    _crop_each(tmp_path, names, rounds=3)
    assert len(counted) == 12  # round-robin over more photos than fit: every crop decodes
    images.cache_clear()
    counted.clear()
    set_decode_cache(17_000_000)  # room for all four
    _crop_each(tmp_path, names, rounds=3)
    assert sorted(counted) == names  # each photo decoded once


def test_the_count_bound_is_configurable_too(tmp_path: Path, counted: list[str]) -> None:
    names = [f"{i}.png" for i in range(3)]
    for name in names:
        Image.new("RGB", (128, 128)).save(tmp_path / name)
    set_decode_cache(max_items=2)
    _crop_each(tmp_path, names, rounds=2)
    assert len(counted) == 6
    with pytest.raises(ValueError, match="max_bytes must be at least 1, got 0"):
        set_decode_cache(0)
    with pytest.raises(ValueError, match="max_items must be at least 1, got 0"):
        set_decode_cache(max_items=0)


def _budget_in_fresh_process(value: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != images.DECODE_CACHE_ENV}
    if value is not None:
        env[images.DECODE_CACHE_ENV] = value
    code = "import toolenv_vision.images as i; print(i.DECODE_CACHE_BYTES)"
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)


def test_the_budget_comes_from_the_environment_of_a_rollout_worker() -> None:
    assert images.DECODE_CACHE_ENV == "TOOLENV_VISION_DECODE_CACHE_MB"
    assert _budget_in_fresh_process("2048").stdout.strip() == str(2048 * 2**20)
    assert _budget_in_fresh_process(None).stdout.strip() == str(512 * 2**20)
    bad = _budget_in_fresh_process("2GB")
    assert bad.returncode != 0
    assert "TOOLENV_VISION_DECODE_CACHE_MB must be a whole number of MB (at least 1), got '2GB'" in bad.stderr
