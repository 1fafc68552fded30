"""Task images as a person sees them: EXIF orientation, transparency, 16-bit, bounded caches."""

from __future__ import annotations

import asyncio
import io
import os
import struct
import threading
import time
from pathlib import Path

import pytest
from PIL import Image, ImageChops, ImageCms, ImageOps

from toolenv import Task, ToolCall, ToolCaller, ToolContext, ToolImage, ToolResult
from toolenv_vision import CropTool, images, task_image
from toolenv_vision.envs import overview_image


def crop(root: Path, name: str, bbox: list[float], **options: int | str) -> ToolResult:
    caller = ToolCaller([CropTool(root, **options)])
    call = ToolCall(name="crop", arguments={"bbox": bbox, "units": "pixels"}, id="c")
    results, _ = asyncio.run(caller.invoke([call], ToolContext(task=Task(context={"image": name}))))
    return results[0]


def pixel(result: ToolResult, x: int = 0, y: int = 0) -> tuple[int, ...]:
    assert not result.is_error, result.text
    value = result.images[0].to_pil().convert("RGB").getpixel((x, y))
    assert isinstance(value, tuple)
    return value


def test_exif_orientation_is_applied(tmp_path: Path) -> None:
    # A phone photo: stored 200x100 landscape, EXIF says "rotate 90° clockwise to show".
    stored = Image.new("RGB", (200, 100), (255, 255, 255))
    stored.paste((255, 0, 0), (0, 0, 40, 40))  # red in the stored top-left corner
    exif = Image.Exif()
    exif[0x0112] = 6
    stored.save(tmp_path / "phone.jpg", exif=exif.tobytes(), quality=95)
    shown = crop(tmp_path, "phone.jpg", [0, 0, 100, 200])
    assert shown.metadata["image_size"] == [100, 200]  # portrait, as any viewer shows it
    assert "The image is 100x200 px" in crop(tmp_path, "phone.jpg", [0, 0, 200, 100]).text
    r, g, b = pixel(crop(tmp_path, "phone.jpg", [60, 0, 100, 40]), 112, 112)  # red is now top-right
    assert r > 200 and g < 60 and b < 60
    overview = overview_image({"image": "phone.jpg"}, tmp_path, 448)
    assert (overview.width, overview.height) == (100, 200)


def _exif(*entries: tuple[int, int, int, bytes]) -> bytes:
    """A big-endian EXIF block of one IFD: (tag, type, count, 4 value bytes) per entry, as written."""
    ifd = struct.pack(">H", len(entries)) + b"".join(struct.pack(">HHI", t, k, n) + v for t, k, n, v in entries)
    return b"Exif\x00\x00MM\x00\x2a" + struct.pack(">I", 8) + ifd + struct.pack(">I", 0)


@pytest.mark.parametrize("fmt", ["jpg", "png", "webp"])
def test_an_odd_exif_tag_does_not_make_a_photo_unreadable(tmp_path: Path, fmt: str) -> None:
    # Cameras and editors write tags with types other than the standard's (here Threshholding,
    # a SHORT, as text). Pillow's exif_transpose re-encodes the EXIF block and raised
    # struct.error: the crop came back "Tool 'crop' failed: error: required argument is not an
    # integer" and generate_tasks over such a folder raised it, for a photo any viewer shows.
    stored = Image.new("RGB", (200, 100), (255, 255, 255))
    stored.paste((255, 0, 0), (0, 0, 40, 40))
    exif = _exif((0x0107, 2, 4, b"abc\x00"), (0x0112, 3, 1, struct.pack(">HH", 6, 0)))  # rotate 90° to show
    stored.save(tmp_path / f"odd.{fmt}", exif=exif, **({"lossless": True} if fmt == "webp" else {}))
    with Image.open(tmp_path / f"odd.{fmt}") as im:
        assert im.getexif()[0x0107] == "abc" and im.getexif()[0x0112] == 6
        before = im.copy()
    images.cache_clear()
    shown = crop(tmp_path, f"odd.{fmt}", [60, 0, 100, 40])
    assert shown.metadata["image_size"] == [100, 200]  # upright all the same
    r, g, b = pixel(shown, 112, 112)  # red, stored top-left, is now top-right
    assert r > 200 and g < 60 and b < 60
    upright = images.as_shown(before)
    assert upright.size == (100, 200)
    assert before.size == (200, 100)  # and the caller's image is left as it was
    assert ImageOps.exif_transpose(upright).size == (100, 200)  # no orientation left to apply twice


@pytest.mark.parametrize("mode", ["RGBA", "LA", "P"])
def test_transparent_pixels_are_shown_on_white(tmp_path: Path, mode: str) -> None:
    # Black text on a transparent background (a diagram, a screenshot): on black it is unreadable.
    im = Image.new("RGBA", (64, 64), (0, 0, 0, 0))
    im.paste((0, 0, 0, 255), (0, 0, 16, 16))
    im.convert(mode).save(tmp_path / "clear.png")
    assert pixel(crop(tmp_path, "clear.png", [32, 32, 64, 64])) == (255, 255, 255)
    assert pixel(crop(tmp_path, "clear.png", [0, 0, 16, 16], min_pixels=16 * 16)) == (0, 0, 0)


def test_16_bit_greyscale_keeps_its_tones(tmp_path: Path) -> None:
    grey = Image.new("I;16", (256, 16))
    for x in range(256):
        for y in range(16):
            grey.putpixel((x, y), x * 257)  # 0 … 65535 across
    grey.save(tmp_path / "grey16.png")
    assert Image.open(tmp_path / "grey16.png").mode.startswith("I;16")
    r = crop(tmp_path, "grey16.png", [0, 0, 256, 16], min_pixels=16, max_pixels=256 * 16, min_shown_side=16)
    assert [pixel(r, x)[0] for x in (0, 64, 128, 255)] == [0, 64, 128, 255]  # not white from 1 on


def test_an_extreme_aspect_ratio_is_an_error_not_a_processor_crash(tmp_path: Path) -> None:
    # Qwen-VL processors raise on images past 200:1, which would stop a verl or TRL rollout.
    Image.new("RGB", (3000, 100)).save(tmp_path / "wide.png")
    r = crop(tmp_path, "wide.png", [0, 0, 3000, 10])
    assert r.is_error and "aspect ratio 300:1" in r.text and "at most 100:1" in r.text, r.text
    ok = crop(tmp_path, "wide.png", [0, 0, 1000, 10])
    assert not ok.is_error, ok.text
    w, h = ok.metadata["size"]
    assert max(w, h) / min(w, h) < 200
    assert not crop(tmp_path, "wide.png", [0, 0, 3000, 10], max_aspect_ratio=400).is_error


def test_decoded_images_are_cached_within_a_byte_budget(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # 64 decoded 8K photos would be 6 GB in every rollout worker: the cache is bounded by bytes.
    for i in range(3):
        Image.new("RGB", (1000, 1000), (i, i, i)).save(tmp_path / f"{i}.png")  # 4 MB each in Pillow's memory
    monkeypatch.setattr(images, "DECODE_CACHE_BYTES", 9_000_000, raising=False)
    images.cache_clear()
    first = images.load_image(tmp_path / "0.png")
    assert images.load_image(tmp_path / "0.png") is first  # cached
    images.load_image(tmp_path / "1.png")
    images.load_image(tmp_path / "2.png")  # 12 MB: the oldest goes
    assert images.load_image(tmp_path / "0.png") is not first
    # an image bigger than the whole budget is still kept, alone, while it is the one in use
    monkeypatch.setattr(images, "DECODE_CACHE_BYTES", 1_000_000)
    big = images.load_image(tmp_path / "1.png")
    assert images.load_image(tmp_path / "1.png") is big
    images.cache_clear()


def test_a_replaced_photo_gives_a_new_overview(tmp_path: Path) -> None:
    # Crops decode a replaced file afresh (the caches key on its mtime); the overview must agree.
    Image.new("RGB", (64, 64), (255, 0, 0)).save(tmp_path / "p.png")
    before = overview_image({"image": "p.png"}, tmp_path, 448).to_pil().getpixel((5, 5))
    Image.new("RGB", (64, 64), (0, 0, 255)).save(tmp_path / "new.png")
    old = (tmp_path / "p.png").stat().st_mtime_ns
    (tmp_path / "new.png").replace(tmp_path / "p.png")
    os.utime(tmp_path / "p.png", ns=(old + 10**9, old + 10**9))  # a newer mtime, even on a coarse clock
    after = overview_image({"image": "p.png"}, tmp_path, 448).to_pil().getpixel((5, 5))
    assert isinstance(before, tuple) and isinstance(after, tuple)
    assert before[0] > 200 and after[2] > 200, (before, after)
    assert pixel(crop(tmp_path, "p.png", [0, 0, 64, 64]), 5, 5)[2] > 200


def test_an_adobe_rgb_photo_is_shown_in_srgb() -> None:
    # The bundled rocket.jpg embeds an Adobe RGB (1998) profile: its stored values, read as sRGB
    # (what models and image processors assume), are washed out; a colour-managed viewer converts.
    with Image.open(images.DATA_DIR / "rocket.jpg") as stored:
        stored.load()
        profile = ImageCms.ImageCmsProfile(io.BytesIO(stored.info["icc_profile"]))
        assert "Adobe RGB" in ImageCms.getProfileDescription(profile)
        viewer = ImageCms.profileToProfile(stored, profile, ImageCms.createProfile("sRGB"), outputMode="RGB")
        raw = stored.convert("RGB")
    assert isinstance(viewer, Image.Image)
    shown = task_image({"image": "rocket.jpg"})
    assert shown.size == raw.size and shown.mode == "RGB"
    assert ImageChops.difference(shown, viewer).getextrema() == ((0, 0), (0, 0), (0, 0))
    assert ImageChops.difference(shown, raw).getextrema()[0][1] > 30  # really not the stored values
    # sRGB photos, photos without a profile and a broken profile keep their stored pixels
    for name in ("astronaut.png", "coins.png"):
        with Image.open(images.DATA_DIR / name) as im:
            assert task_image({"image": name}).tobytes() == im.convert("RGB").tobytes()


def test_a_broken_colour_profile_is_ignored(tmp_path: Path) -> None:
    Image.new("RGB", (32, 32), (200, 30, 40)).save(tmp_path / "odd.png", icc_profile=b"not a profile")
    assert pixel(crop(tmp_path, "odd.png", [0, 0, 32, 32])) == (200, 30, 40)


def test_concurrent_first_uses_of_an_image_decode_it_once() -> None:
    # A GRPO group resets its samples of one task together: each reset used to decode (and render)
    # the same photo again, N copies in memory at once, while it was not yet cached.
    cache = images.ImageCache(8, lambda: 10**9)
    made: list[int] = []
    started, release = threading.Event(), threading.Event()

    def make() -> Image.Image:
        made.append(1)
        started.set()
        release.wait(10)
        return Image.new("RGB", (4, 4))

    got: list[Image.Image] = []
    threads = [threading.Thread(target=lambda: got.append(cache.get("photo", make))) for _ in range(8)]
    threads[0].start()
    assert started.wait(10)
    for t in threads[1:]:
        t.start()
    # The others ask while the first is still decoding (with the old code each began its own decode
    # at once; give them a moment to, without depending on it when they wait as they should).
    for _ in range(50):
        if len(made) == len(threads):
            break
        time.sleep(0.01)
    release.set()
    for t in threads:
        t.join(10)
    assert len(made) == 1 and len(got) == 8 and all(im is got[0] for im in got)


def test_a_failed_decode_is_not_shared_with_waiting_callers() -> None:
    cache = images.ImageCache(8, lambda: 10**9)

    def broken() -> Image.Image:
        raise OSError("truncated")

    for _ in range(2):  # not cached, and no caller is left waiting for it
        with pytest.raises(OSError):
            cache.get("bad", broken)
    assert cache.get("bad", lambda: Image.new("RGB", (2, 2))).size == (2, 2)


@pytest.mark.parametrize("name", ["rocket.jpg", "chelsea.png", "astronaut.png", "hubble_deep_field.jpg"])
def test_a_crop_is_its_pixels_alone_whatever_the_source_profile(name: str) -> None:
    """Photos with a colour profile are converted to sRGB, and the converted image carried the new
    sRGB profile, which lcms stamps with the time it was made: every crop PNG embedded it, so the
    same crop had other bytes in another process or after the decode cache dropped the photo (its
    hash, hence image-store files and caches, differed). The bytes are now the pixels' alone.
    (PNG here; a JPEG photo's crops are JPEG by default: test_vision_crop_format checks those.)"""
    images.cache_clear()
    r = crop(images.DATA_DIR, name, [0, 0, 64, 64], min_pixels=64 * 64, crop_format="png")
    assert not r.is_error, r.text
    shown = r.images[0].to_pil()
    assert "icc_profile" not in shown.info  # sRGB pixels, untagged: what every processor assumes
    bare = Image.frombytes(shown.mode, shown.size, shown.tobytes())
    assert r.images[0].data == ToolImage.from_pil(bare).data
    assert "icc_profile" not in task_image({"image": name}).info
