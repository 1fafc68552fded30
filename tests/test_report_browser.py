"""The report in a real headless browser (Debian chromium driven by playwright)."""

from __future__ import annotations

import contextlib
import importlib.util
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _examples import load_example

from toolenv.report import build_report, render_report
from toolenv.runner import rollout
from toolenv.trajectory import read_trajectories

CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]

pytestmark = pytest.mark.browser


def _skip_reason() -> str | None:
    if not Path(CHROMIUM).exists() and shutil.which("chromium") is None:
        return "Debian chromium is not installed (apt-get install -y chromium)"
    if importlib.util.find_spec("playwright") is None:
        return "the playwright Python package is not installed"
    return None


@contextlib.contextmanager
def _browser_page() -> Iterator[tuple[Any, list[str]]]:
    """A chromium page, and the console errors, page errors and network requests it makes."""
    reason = _skip_reason()
    if reason:
        print(f"skipping: {reason}")
        pytest.skip(reason)
    from playwright.sync_api import sync_playwright

    problems: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM if Path(CHROMIUM).exists() else shutil.which("chromium"), args=ARGS
        )
        try:
            page = browser.new_page()
            page.on(
                "console", lambda m: problems.append(f"{m.type}: {m.text}") if m.type in ("error", "warning") else None
            )
            page.on("pageerror", lambda e: problems.append(f"pageerror: {e}"))
            page.on(
                "request",
                lambda r: problems.append(f"request: {r.url}") if not r.url.startswith(("file:", "data:")) else None,
            )
            yield page, problems
        finally:
            browser.close()


def test_report_in_chromium(tmp_path: Path) -> None:
    example = load_example("rollout_example")

    class HalfRight(example.ScriptedAgent):  # wrong answers on the sums: a mix of rewards to filter
        async def act(self, observation, messages, env_info):  # type: ignore[no-untyped-def]
            action = await super().act(observation, messages, env_info)
            if env_info.task.id.startswith("sum") and "<answer>" in action.text:
                action.text = "<answer>wrong</answer>"
            return action

    rollout(example.ENV_ID, HalfRight(), out=tmp_path)
    page_path = build_report(tmp_path)
    image = (
        next(t for t in read_trajectories(tmp_path / "trajectories.jsonl") if t.task.id == "color").turns[0].results[0]
    )
    # Pydantic writes URL-safe base64 and this swatch's encoding has - or _: the page must embed
    # the standard alphabet for the image to decode.
    assert set(image.model_dump(mode="json")["images"][0]["data"]) & {"-", "_"}
    with _browser_page() as (page, problems):
        page.goto(page_path.as_uri())
        rows = page.locator("#episode-list tbody tr")
        assert rows.count() == 4
        page.fill("#f-min", "1")
        assert rows.count() == 2
        page.fill("#f-min", "")
        page.select_option("#f-status", "fail")
        assert rows.count() == 2
        page.select_option("#f-status", "")
        page.fill("#f-text", "color")
        assert rows.count() == 1
        rows.first.click()
        detail = page.locator("#detail")
        assert "task color" in detail.inner_text()
        img = detail.locator("img.tool-image")
        assert img.count() == 1
        assert img.evaluate("i => i.complete && i.naturalWidth") == 24
        page.fill("#f-text", "price")
        rows.first.click()
        assert page.locator("#detail table.rows td", has_text="pear").count() == 1
    assert problems == []


def test_a_large_run_lists_the_first_thousand(tmp_path: Path) -> None:
    example = load_example("rollout_example")
    rollout(example.ENV_ID, example.ScriptedAgent(), out=tmp_path / "run")
    (one,) = [t for t in read_trajectories(tmp_path / "run" / "trajectories.jsonl") if t.task.id == "color"]
    many = [one.model_copy(update={"sample": i}) for i in range(1005)]
    page_path = tmp_path / "many.html"
    page_path.write_text(render_report(many))
    with _browser_page() as (page, problems):
        page.goto(page_path.as_uri())
        assert page.locator("#episode-list tbody tr").count() == 1000
        assert "1005 of 1005 match; the first 1000 listed" in page.inner_text("#count")
        page.fill("#f-max", "-1")  # nothing matches: the cap note goes away
        assert page.locator("#episode-list tbody tr").count() == 0
        assert page.inner_text("#count") == "(0 of 1005 shown)"
    assert problems == []


def test_a_page_in_many_data_chunks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The data of a big run comes in several scripts (a browser's strings cap one near 512 MiB):
    the page joins them in order, and an image sent once in the first shows in every episode."""
    import toolenv.report.html as html

    monkeypatch.setattr(html, "CHUNK_CHARS", 50_000)
    example = load_example("rollout_example")
    rollout(example.ENV_ID, example.ScriptedAgent(), out=tmp_path / "run")
    (one,) = [t for t in read_trajectories(tmp_path / "run" / "trajectories.jsonl") if t.task.id == "color"]
    many = [one.model_copy(update={"sample": i, "reward": float(i)}) for i in range(300)]
    page_path = tmp_path / "chunks.html"
    page_path.write_text(render_report(many))
    assert page_path.read_text().count('class="report-data"') > 10
    with _browser_page() as (page, problems):
        page.goto(page_path.as_uri())
        assert "(300 of 300 shown)" in page.inner_text("#count")
        page.fill("#f-min", "299")
        rows = page.locator("#episode-list tbody tr")
        assert rows.count() == 1
        rows.first.click()
        img = page.locator("#detail img.tool-image")
        assert img.count() == 1 and img.evaluate("i => i.complete && i.naturalWidth") == 24
    assert problems == []


def test_the_served_report_in_chromium(tmp_path: Path) -> None:
    """`toolenv view --serve`: the list comes from rows.json, an episode from its own URL when
    it is opened (its images with it); the filters work as in the self-contained page."""
    import threading

    from toolenv.commands.view_cmd import make_server
    from toolenv.report.served import RunIndex

    example = load_example("rollout_example")
    rollout(example.ENV_ID, example.ScriptedAgent(), out=tmp_path)
    server = make_server(RunIndex([tmp_path]), 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/"
    try:
        with _browser_page() as (page, problems):
            page.goto(url)
            rows = page.locator("#episode-list tbody tr")
            rows.first.wait_for()
            assert rows.count() == 4 and "(4 of 4 shown)" in page.inner_text("#count")
            page.fill("#f-text", "color")
            assert rows.count() == 1
            rows.first.click()
            detail = page.locator("#detail")
            detail.locator("h3", has_text="task color").wait_for()
            img = detail.locator("img.tool-image")
            assert img.count() == 1 and img.evaluate("i => i.complete && i.naturalWidth") == 24
            page.fill("#f-text", "price")
            rows.first.click()
            page.locator("#detail table.rows td", has_text="pear").wait_for()
    finally:
        server.shutdown()
        server.server_close()
    fetched = [p.removeprefix(f"request: {url}") for p in problems if p.startswith("request: ")]
    assert fetched[:2] == ["", "rows.json"] and len(fetched) == 4, fetched  # the page, its rows, two episodes
    assert all(re.fullmatch(r"episodes/[0-3]\.json", f) for f in fetched[2:]), fetched
    assert [p for p in problems if not p.startswith("request: ")] == []


def test_the_reward_filters_leave_out_a_nan_reward(tmp_path: Path) -> None:
    """A NaN reward (written "NaN", JSON having no number for it) is within no bound: the reward
    filters left it in, since the page compared the string; infinities compare as numbers."""
    example = load_example("rollout_example")
    rollout(example.ENV_ID, example.ScriptedAgent(), out=tmp_path / "run")
    (one,) = [t for t in read_trajectories(tmp_path / "run" / "trajectories.jsonl") if t.task.id == "color"]
    rewards = [float("nan"), float("inf"), float("-inf"), 0.5]
    page_path = tmp_path / "nan.html"
    page_path.write_text(
        render_report([one.model_copy(update={"sample": i, "reward": r}) for i, r in enumerate(rewards)])
    )
    with _browser_page() as (page, problems):
        page.goto(page_path.as_uri())
        rows = page.locator("#episode-list tbody tr")
        assert rows.count() == 4
        page.fill("#f-min", "0")
        assert [rows.nth(i).locator("td").nth(3).inner_text() for i in range(rows.count())] == ["Infinity", "0.500"]
        page.fill("#f-min", "")
        page.fill("#f-max", "1")
        assert [rows.nth(i).locator("td").nth(3).inner_text() for i in range(rows.count())] == ["-Infinity", "0.500"]
    assert problems == []
