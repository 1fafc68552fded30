"""The http backend against real servers on 127.0.0.1: ours (uvicorn), and one that misbehaves."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from toolenv import Task, ToolCall, ToolCaller, ToolContext
from toolenv_search.backend import Passage, SearchError
from toolenv_search.bm25 import BM25Backend
from toolenv_search.envs import hotpotqa_oracle, make_hotpotqa_env
from toolenv_search.http_backend import HTTPBackend
from toolenv_search.protocol import parse_result
from toolenv_search.server import create_app
from toolenv_search.tool import SearchTool, format_passages


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_remote_results_equal_local_results(bm25_server: str, tmp_path: Path) -> None:
    local = BM25Backend(cache_dir=tmp_path)
    remote = HTTPBackend(bm25_server)
    queries = ["Constantin Medien", "VIVA Poland music channel", "the of a"]
    want = await local.search(queries, 4)
    got = await remote.search(queries, 4)
    assert [[(p.id, p.title, p.text) for p in row] for row in got] == [
        [(p.id, p.title, p.text) for p in row] for row in want
    ]
    assert got[0][0].score == pytest.approx(want[0][0].score)
    assert got[2] == []
    await remote.aclose()


async def test_server_speaks_search_r1_api(bm25_server: str) -> None:
    async with httpx.AsyncClient() as client:
        health = await client.get(bm25_server + "/health")
        assert health.json() == {"status": "ok", "backend": "bm25"}
        bare = await client.post(bm25_server + "/retrieve", json={"queries": ["Constantin Medien"], "topk": 1})
        [[doc]] = bare.json()["result"]
        assert doc["id"] == "hp-f93b09ca3d5f"
        assert doc["contents"].startswith('"Constantin Medien"\nConstantin Medien AG')
        scored = await client.post(bm25_server + "/retrieve", json={"queries": ["x y", "VIVA"], "return_scores": True})
        rows = scored.json()["result"]
        assert len(rows) == 2 and all(set(item) == {"document", "score"} for item in rows[1])
        assert len(rows[1]) == 3  # server default topk
        bad = await client.post(bm25_server + "/retrieve", json={"queries": "not a list"})
        assert bad.status_code == 422 and "queries" in bad.json()["error"]
        junk = await client.post(bm25_server + "/retrieve", content=b"not json")
        assert junk.status_code == 422


def _search_r1_batch_search(url: str, queries: list[str], topk: int = 3) -> list[str]:
    """Search-R1's own client (`LLMGenerationManager.batch_search`, `search_r1/llm_agent/generation.py`):
    it indexes `["result"]` and each item's `["document"]["contents"]` without checking the status."""
    payload = {"queries": queries, "topk": topk, "return_scores": True}
    results = httpx.post(url + "/retrieve", json=payload, timeout=30).json()["result"]
    out = []
    for result in results:
        ref = ""
        for idx, doc_item in enumerate(result):
            content = doc_item["document"]["contents"]
            title = content.split("\n")[0]
            text = "\n".join(content.split("\n")[1:])
            ref += f"Doc {idx + 1}(Title: {title}) {text}\n"
        out.append(ref)
    return out


def test_search_r1_trainer_runs_unchanged_against_the_server(bm25_server: str) -> None:
    # A turn in which no rollout searched: Search-R1 still calls batch_search([]), and its
    # own server answers {"result": []}.
    assert _search_r1_batch_search(bm25_server, []) == []
    # A large rollout batch (train_batch_size 1024 x 5 samples) goes out as one request.
    many = _search_r1_batch_search(bm25_server, ["VIVA Media"] * 5120, topk=1)
    assert len(many) == 5120 and many[0].startswith('Doc 1(Title: "VIVA Media") VIVA Media GmbH')
    # `topk: 0` means the server's default, as in Search-R1's server (`if not request.topk`).
    [three] = httpx.post(bm25_server + "/retrieve", json={"queries": ["VIVA"], "topk": 0}).json()["result"]
    assert len(three) == 3


async def test_the_model_sees_what_search_r1_shows(bm25_server: str) -> None:
    """The observation text is Search-R1's `_passages2string` of the same server answer."""
    tool = SearchTool("http", backend_options={"url": bm25_server}, topk=3)
    for query in ("Constantin Medien", "VIVA Poland music channel"):
        results, _ = await ToolCaller([tool]).invoke(
            [ToolCall(name="search", arguments={"query": query}, id="a")], ToolContext(task=Task())
        )
        [want] = await asyncio.to_thread(_search_r1_batch_search, bm25_server, [query])
        assert results[0].text == want.strip()
    await tool.close()


def test_wiki18_titles_keep_their_own_quotes() -> None:
    """wiki-18 `contents` is the title in quotes, a line break, the text; a title with quotes of its own keeps them."""
    docs = [
        {"id": "1", "contents": '""Weird Al" Yankovic"\nAlfred Matthew Yankovic is an American singer.'},
        {"id": "2", "contents": '"Paris"\nParis is the capital of France.'},
    ]
    [row] = parse_result({"result": [[{"document": d, "score": 1.0} for d in docs]]}, 1)
    assert [p.title for p in row] == ['"Weird Al" Yankovic', "Paris"]
    assert format_passages(row) == (
        'Doc 1(Title: ""Weird Al" Yankovic") Alfred Matthew Yankovic is an American singer.\n'
        'Doc 2(Title: "Paris") Paris is the capital of France.'
    )


async def test_search_tool_over_http(bm25_server: str) -> None:
    tool = SearchTool("http", backend_options={"url": bm25_server + "/retrieve"})
    results, _ = await ToolCaller([tool]).invoke(
        [ToolCall(name="search", arguments={"query": "Constantin Medien"}, id="a")], ToolContext(task=Task())
    )
    assert results[0].text.startswith('Doc 1(Title: "Constantin Medien")')
    await tool.close()


async def test_backends_in_one_loop_share_one_client(bm25_server: str) -> None:
    backends = [HTTPBackend(bm25_server) for _ in range(20)]
    clients = {id(b._client()) for b in backends}
    assert len(clients) == 1
    client = backends[0]._client()
    for b in backends[:-1]:
        await b.aclose()
    assert not client.is_closed
    await backends[-1].aclose()
    assert client.is_closed


async def test_server_errors_are_retried_then_reported(bad_server: Any) -> None:
    bad_server.modes = ["500"]
    backend = HTTPBackend(bad_server.url, retries=2, backoff=0.01)
    with pytest.raises(SearchError, match="HTTP 500") as info:
        await backend.search(["q"], 3)
    assert info.value.retryable
    assert bad_server.requests == 3


async def test_transient_500_recovers(bad_server: Any) -> None:
    bad_server.modes = ["500", "close", "ok"]
    backend = HTTPBackend(bad_server.url, retries=2, backoff=0.01)
    [[hit]] = await backend.search(["capital of France"], 1)
    assert (hit.id, hit.title, hit.text, hit.score) == ("d1", "Paris", "Paris is the capital of France.", 3.5)
    assert bad_server.bodies[-1] == {"queries": ["capital of France"], "topk": 1, "return_scores": True}


async def test_rate_limited_requests_are_retried(bad_server: Any) -> None:
    """429 Too Many Requests (a retriever behind a gateway, or one shedding load) is transient: retried
    like a 5xx, and reported as retryable when it persists, not as a refused request."""
    bad_server.modes = ["429", "ok"]
    backend = HTTPBackend(bad_server.url, retries=2, backoff=0.01)
    [[hit]] = await backend.search(["capital of France"], 1)
    assert hit.title == "Paris" and bad_server.requests == 2
    bad_server.modes = ["429"]
    with pytest.raises(SearchError, match=r"answered HTTP 429: rate limit exceeded$") as info:
        await backend.search(["capital of France"], 1)
    assert info.value.retryable and bad_server.requests == 5
    await backend.aclose()


@pytest.mark.parametrize(
    ("mode", "message"),
    [
        ("garbage", "not JSON"),
        ("badshape", "malformed response"),
        ("badgzip", "could not be decoded"),
        ("close", "could not reach the retrieval server"),
        ("hang", "did not answer within 0.3 s"),
    ],
)
async def test_misbehaving_server_gives_error_observation(bad_server: Any, mode: str, message: str) -> None:
    bad_server.modes = [mode]
    tool = SearchTool(HTTPBackend(bad_server.url, timeout=0.3, retries=1, backoff=0.01))
    results, records = await ToolCaller([tool]).invoke(
        [ToolCall(name="search", arguments={"query": "anything"}, id="a")], ToolContext(task=Task())
    )
    assert results[0].is_error
    assert results[0].text.startswith("Search failed: ")
    assert message in results[0].text
    assert records[0].error is not None
    await tool.close()


async def test_a_failing_retriever_opens_the_circuit_for_every_env(bad_server: Any) -> None:
    from toolenv.breaker import reset_breakers

    reset_breakers()
    bad_server.modes = ["500", "500", "500", "ok"]
    # Each env of a run makes its own tool over the same server: they share one circuit.
    tools = [
        SearchTool(HTTPBackend(bad_server.url, retries=0), breaker_threshold=3, breaker_cooldown=60) for _ in range(4)
    ]
    texts = []
    for tool in tools * 2:
        (res,), _ = await ToolCaller([tool]).invoke(
            [ToolCall(name="search", arguments={"query": "q"}, id="a")], ToolContext(task=Task())
        )
        texts.append(res.text)
    assert bad_server.requests == 3  # the server saw three failed requests, then nothing more
    assert all("HTTP 500" in t for t in texts[:3])
    assert all(t.startswith("Tool 'search' is unavailable: its last 3 calls failed") for t in texts[3:])
    other = SearchTool(BM25Backend(), breaker_threshold=3, breaker_cooldown=60)  # another backend: closed
    (res,), _ = await ToolCaller([other]).invoke(
        [ToolCall(name="search", arguments={"query": "Paris"}, id="a")], ToolContext(task=Task())
    )
    assert not res.is_error
    for tool in tools:
        await tool.close()
    reset_breakers()


async def test_waiting_for_a_pooled_connection_is_not_a_server_timeout(bad_server: Any) -> None:
    """`timeout` bounds connect, read and write, as documented: not the wait for a free connection.

    With more episodes searching than the pool has connections, requests queue in the
    client; httpx's pool timeout (the same `timeout`) failed the last ones as "did not
    answer" before they were ever sent, though the server answered every request in time.
    """
    bad_server.modes = ["slow"]  # each answer takes 0.6 s, well inside the 1.5 s timeout
    backend = HTTPBackend(bad_server.url, timeout=1.5, retries=0, max_connections=1)
    results = await asyncio.gather(*(backend.search([f"q{i}"], 1) for i in range(4)), return_exceptions=True)
    assert [r if isinstance(r, BaseException) else r[0][0].title for r in results] == ["Paris"] * 4
    assert bad_server.requests == 4
    await backend.aclose()


@pytest.mark.parametrize("url", ["127.0.0.1:8000", "localhost:8000/retrieve", "ftp://127.0.0.1/retrieve"])
def test_a_url_without_http_scheme_is_refused_when_made(url: str) -> None:
    """A config slip (no `http://`) fails making the env, not every search of the run as a
    "retryable" connection failure that retries, then opens the circuit."""
    with pytest.raises(ValueError, match=r"http:// or https://"):
        HTTPBackend(url)
    with pytest.raises(ValueError, match=r"http:// or https://"):
        make_hotpotqa_env(backend="http", backend_options={"url": url})


async def test_no_server_listening_is_an_error(tmp_path: Path) -> None:
    backend = HTTPBackend(f"http://127.0.0.1:{free_port()}", retries=1, backoff=0.01)
    with pytest.raises(SearchError, match="could not reach"):
        await backend.search(["q"], 3)
    await backend.aclose()


def test_serve_search_command_serves_the_env(tmp_path: Path) -> None:
    port = free_port()
    env = {**os.environ, "TOOLENV_CACHE_DIR": str(tmp_path)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "toolenv.cli", "serve-search", "--port", str(port), "--topk", "2"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            assert time.monotonic() < deadline, "serve-search did not come up"
            time.sleep(0.1)
        envs = make_hotpotqa_env(backend="http", backend_options={"url": url}, limit=5, task_order="sequential")
        for task in envs.tasks:
            envs.reset(options={"task_id": task.id})
            obs, *_ = envs.step(hotpotqa_oracle(task, 0, ""))
            assert obs.startswith("<information>Doc 1(Title: ") and obs.count("Doc ") == 3
            _, reward, terminated, _, _ = envs.step(hotpotqa_oracle(task, 1, obs))
            assert terminated and reward == 1.0
        envs.close()
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=20)
    assert "bm25 index of 1000 passages built" in err


def test_serve_search_bad_corpus_is_one_line(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "toolenv.cli", "serve-search", "--corpus", str(tmp_path / "nope.jsonl")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        f"toolenv serve-search: error: corpus not found: {tmp_path / 'nope.jsonl'}"
    ]


def test_serve_search_busy_port_is_one_line() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        out = subprocess.run(
            [sys.executable, "-m", "toolenv.cli", "serve-search", "--port", str(port)],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert out.returncode == 2
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("toolenv serve-search: error: [Errno 98] Address already in use")


def test_served_connections_do_not_wait_for_delayed_acks() -> None:
    from toolenv_search.serve_cmd import bind_socket

    with bind_socket("127.0.0.1", 0) as listener:
        port = listener.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port)):
            accepted, _ = listener.accept()
            with accepted:
                assert accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0


def test_nq_open_questions_are_answered_through_a_wikipedia_retriever(tmp_path: Path) -> None:
    """NQ-open's dev questions ship with the plugin; the bundled corpus cannot answer them, a
    retrieval server over Wikipedia passages can (here: a real server over three passages)."""
    import threading

    import uvicorn

    from toolenv_search import nq_open_tasks
    from toolenv_search.server import create_app

    tasks = nq_open_tasks()
    assert len(tasks) == 3610 and len({t.id for t in tasks}) == 3610
    moon = tasks[0]
    assert moon.id == "nq-open-dev-0000" and moon.answers == ["14 December 1972 UTC", "December 1972"]
    assert moon.context["question"] == "when was the last time anyone was on the moon"
    assert "<search> query </search>" in moon.prompt and moon.prompt.endswith(moon.context["question"] + "?\n")
    corpus = tmp_path / "wiki.jsonl"
    apollo = "Apollo 17 was the last mission in which humans walked on the Moon, in December 1972."
    passages = {
        "Apollo 17": apollo,
        "The Hollies": "The Hollies recorded a song by Bobby Scott and Bob Russell.",
        "Paris": "Paris is the capital of France.",
    }
    rows = [{"id": f"w{i}", "contents": f'"{title}"\n{text}'} for i, (title, text) in enumerate(passages.items())]
    corpus.write_text("".join(json.dumps(r) + "\n" for r in rows))
    port = free_port()
    app = create_app(BM25Backend(corpus, cache_dir=tmp_path / "cache"))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        while not server.started:
            assert thread.is_alive(), "retrieval server did not start"
            time.sleep(0.02)
        env = make_hotpotqa_env(
            tasks=tasks[:1], backend="http", backend_options={"url": f"http://127.0.0.1:{port}"}, topk=1
        )
        env.reset(seed=0)
        obs, *_ = env.step("<think> look it up </think><search> last humans on the moon </search>")
        assert obs == f'<information>Doc 1(Title: "Apollo 17") {apollo}</information>'
        _, reward, terminated, _, _ = env.step("<answer> December 1972 </answer>")
        assert terminated and reward == 1.0
        env.close()
    finally:
        server.should_exit = True
        thread.join(10)


def test_served_topk_is_what_the_request_asks_or_a_one_line_refusal(
    bm25_server: str, app_server: Any, tmp_path: Path
) -> None:
    """A `topk` the request model accepts (up to 1,000, as documented) is served in full, never cut to 100."""
    [hits] = httpx.post(bm25_server + "/retrieve", json={"queries": ["American film"], "topk": 150}).json()["result"]
    assert len(hits) == 150
    # A server capped lower says so in one line instead of answering with fewer passages.
    with app_server(create_app(BM25Backend(cache_dir=tmp_path), max_topk=5)) as url:
        ok = httpx.post(url + "/retrieve", json={"queries": ["American film"], "topk": 5})
        assert len(ok.json()["result"][0]) == 5
        refused = httpx.post(url + "/retrieve", json={"queries": ["American film"], "topk": 6})
        assert refused.status_code == 422
        assert refused.json() == {"error": "invalid request: topk: at most 5 on this server, got 6"}


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.skipif(not _ipv6_loopback(), reason="no IPv6 loopback on this machine")
def test_serve_search_binds_ipv6_hosts() -> None:
    """`--host ::1` (or `::`) binds as uvicorn would; it failed with "Address family for hostname not supported"."""
    from toolenv_search.serve_cmd import bind_socket

    with bind_socket("::1", 0) as listener:
        assert listener.family == socket.AF_INET6
        with socket.create_connection(("::1", listener.getsockname()[1])):
            accepted, _ = listener.accept()
            accepted.close()


def test_serve_search_port_0_reports_the_port_it_serves(tmp_path: Path) -> None:
    """`--port 0` picks a free port; the "serving ..." line gives that port, not 0."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "toolenv.cli", "serve-search", "--port", "0"],
        env={**os.environ, "TOOLENV_CACHE_DIR": str(tmp_path)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        line = ""
        while not line.startswith("serving "):
            line = proc.stderr.readline()
            assert line, "serve-search exited before serving"
        url = line.split(" on ", 1)[1].strip()
        assert url.startswith("http://127.0.0.1:") and url.endswith("/retrieve")
        assert not url.startswith("http://127.0.0.1:0/")
        deadline = time.monotonic() + 60
        while True:
            try:
                health = httpx.get(url.removesuffix("/retrieve") + "/health", timeout=1)
                break
            except httpx.TransportError:
                assert proc.poll() is None and time.monotonic() < deadline, "serve-search did not come up"
                time.sleep(0.1)
        assert health.json() == {"status": "ok", "backend": "bm25"}
    finally:
        proc.terminate()
        proc.communicate(timeout=20)


class _FailingBackend:
    name = "failing"

    async def search(self, queries: list[str], topk: int) -> list[list[Passage]]:
        raise SearchError("no cached web results for 'q' (offline mode)")

    async def aclose(self) -> None:
        pass


async def test_a_server_error_reports_the_servers_reason(app_server: Any, bad_server: Any) -> None:
    """A 5xx names the server and gives the reason its body carries (ours: `error`, FastAPI's: `detail`)."""
    with app_server(create_app(_FailingBackend())) as url:
        backend = HTTPBackend(url, retries=0)
        with pytest.raises(SearchError) as info:
            await backend.search(["q"], 3)
        await backend.aclose()
    assert str(info.value) == (
        f"the retrieval server at {url}/retrieve answered HTTP 500: no cached web results for 'q' (offline mode)"
    )
    bad_server.modes = ["500"]
    backend = HTTPBackend(bad_server.url, retries=0)
    with pytest.raises(SearchError, match=r"answered HTTP 500: index exploded$"):
        await backend.search(["q"], 3)
    await backend.aclose()


def test_serve_search_bad_log_level_is_refused_before_serving() -> None:
    """It printed "serving ..." and then `error: 'bogus'`: the level is checked with the arguments now."""
    out = subprocess.run(
        [sys.executable, "-m", "toolenv.cli", "serve-search", "--log-level", "bogus", "--port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2 and "serving" not in out.stdout
    assert out.stderr.strip().splitlines()[-1].startswith("toolenv serve-search: error: argument --log-level")


class _TopkIgnoringBackend:
    """A retriever that answers its own fixed number of passages whatever `topk` asks (as some forks do)."""

    name = "fixed"

    async def search(self, queries: list[str], topk: int) -> list[list[Passage]]:
        row = [Passage(id=f"d{i}", title=f"T{i}", text=f"text {i}", score=10.0 - i) for i in range(8)]
        return [row for _ in queries]

    async def aclose(self) -> None:
        pass


async def test_a_server_that_answers_more_than_topk_is_cut_to_topk(app_server: Any) -> None:
    """The model sees the `topk` passages it asked for, best first, not a server's longer list."""
    with app_server(create_app(_TopkIgnoringBackend())) as url:
        backend = HTTPBackend(url, retries=0)
        [hits] = await backend.search(["q"], 3)
        assert [h.id for h in hits] == ["d0", "d1", "d2"]
        batched = HTTPBackend(url, retries=0, batch_wait=0.01)
        rows = await asyncio.gather(batched.search(["a"], 2), batched.search(["b"], 2))
        assert [[h.id for h in row] for [row] in rows] == [["d0", "d1"], ["d0", "d1"]]
        tool = SearchTool(HTTPBackend(url, retries=0), topk=2)
        results, _ = await ToolCaller([tool]).invoke(
            [ToolCall(name="search", arguments={"query": "q"}, id="a")], ToolContext(task=Task())
        )
        assert results[0].text == 'Doc 1(Title: "T0") text 0\nDoc 2(Title: "T1") text 1'
        for closing in (backend, batched):
            await closing.aclose()
        await tool.close()
