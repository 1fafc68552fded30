"""The `openai` agent: any OpenAI-compatible server (vLLM, SGLang, OpenAI) over httpx.

Three ways to talk to the server:
- `api="chat", tool_calling="native"` (default): the env's tool schemas go out as `tools`;
  returned `tool_calls` are rendered as an action in the env parser's format
  (`hermes`: `<tool_call>{json}</tool_call>`; `tags`: `<tag>arg</tag>` for tools mapped to a
  tag; `codeblock`: a ```` ```python ```` block for its code tool; any other parser gets hermes).
  Later turns send the env's tool results back as `tool` messages with matching call ids.
- `api="chat", tool_calling="text"`: plain chat; the model writes the parser's format itself,
  each observation goes back as a user message, generation stops at the parser's stop strings
  (but see `stop`: not at the close of one call in a format that writes several a turn).
  A format written in special tokens (`parser.special_tokens`: Harmony, Mistral...) is asked
  for with `skip_special_tokens: false` (a vLLM/SGLang field), so its markers reach the env.
- `api="completions"`: one growing text prompt (the env's prompt, then action + observation);
  all of the parser's stop strings, and special tokens as in text mode. A text prompt holds no
  image: an episode whose messages carry images ends with an `AgentError` (use `api="chat"`).

In both chat modes a reasoning model's thinking (`reasoning` / `reasoning_content`, from a
server's reasoning parser) is kept in the action's `metadata["reasoning"]` and sent back on its
assistant message under the name the server gave it (vLLM reads `reasoning`, SGLang
`reasoning_content`; a server that gave both gets both).

A reply's lone UTF-16 surrogates (half an emoji a server cut, `"\\ud83d"` in its JSON) become
U+FFFD as the reply is read, in its text, reasoning and call arguments: the history goes back to
the server as UTF-8, which cannot hold them.

One `httpx.AsyncClient` (connection pool), one concurrency cap and the optional rate limit are
shared by every episode of a rollout; each turn's metadata says how long it waited for them
(`queue_s`), slept between retries (`backoff_s`) and spent in requests (`request_s`). `timeout`
bounds a whole attempt (httpx's bounds each read only). 408s, 409s, 429s, 5xx, timeouts,
dropped connections and malformed JSON are retried with exponential backoff (honouring
`Retry-After`); other 4xx and redirects (not followed) end the episode at once. The API key is read from an
environment variable (`OPENAI_API_KEY` unless `api_key_env` says otherwise) and is never
logged, recorded or shown in errors (a server's text is redacted before it is cut short and
folded to one line).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import email.utils
import itertools
import json
import os
import random
import re
import time
import urllib.parse
from typing import Any, Literal

import httpx

from toolenv._aio import within
from toolenv._text import encodable_value, fix_text
from toolenv._tls import tls_context
from toolenv.agent import Agent, AgentAction, AgentError, EnvInfo
from toolenv.caller import RateLimit  # tools' `rate_limit`: one rule for both
from toolenv.export import move_tool_images
from toolenv.parsers import HermesParser
from toolenv.parsers.base import ActionParser
from toolenv.types import Message, ParsedAction, Task, new_call, new_parsed
from toolenv_agents._limits import Spent, load_hint, timeout_message
from toolenv_agents._seeds import episode_seed
from toolenv_agents._stops import chat_stops

__all__ = ["OpenAIAgent", "native_turn", "render_tool_calls"]

_TOOL_CALL_BLOCK = re.compile(r"<tool_call>.*?</tool_call>", re.DOTALL)
#: Client errors worth another attempt, as OpenAI's client retries them: request timeout (a
#: proxy's), conflict (OpenAI's lock timeout), rate limit. Other 4xx fail at once.
_RETRIED = frozenset({408, 409, 429})
#: Where reasoning servers put a reasoning model's thinking (the preferred name first).
_REASONING_FIELDS = ("reasoning", "reasoning_content")


_HERMES = HermesParser()


def render_tool_calls(content: str, calls: list[dict[str, Any]], parser: ActionParser | None) -> str:
    """Native tool calls (`{"id", "name", "arguments"}` with decoded arguments) as action text for `parser`.

    Each call is written the way `parser` reads it (`ActionParser.format_call`); a call the
    format cannot express (a tag parser has no tag for it) falls back to a Hermes block.
    """
    parts = [content.strip()] if content and content.strip() else []
    for call in calls:
        name, args, call_id = call["name"], call["arguments"], call.get("id") or ""
        text = parser.format_call(name, args, call_id) if parser is not None and isinstance(args, dict) else None
        if text is None:
            text = _HERMES.format_call(name, args, call_id)
        if text is None:  # arguments decoded from a JSON response always encode again
            raise ValueError(f"tool call {name!r} has arguments that JSON cannot hold")
        parts.append(text)
    return "\n".join(parts)


def native_turn(content: str, calls: list[dict[str, Any]], parser: ActionParser) -> ParsedAction:
    """The turn the env runs for a reply with native tool calls (`{"id", "name", "arguments"}`,
    arguments decoded, ids distinct): what `parser` finds in the content (a call written there,
    the answer, the text, errors), then the server's calls as they are.

    The calls go to the env as calls rather than as their rendering, which the env's parser may
    not read back (a codeblock or tags format cannot write every call): the model then hears the
    tool's own error for a bad call. Arguments that hold no JSON object become an error naming
    them, as a parser reports them (a recorded call's arguments are an object).
    """
    found = parser.parse(content) if content.strip() else new_parsed([], None, "", [])
    server, errors = [], list(found.errors)
    for index, call in enumerate(calls, 1):
        args = _arguments_object(call["arguments"])
        if isinstance(args, dict):
            server.append(new_call(call["name"], args, call["id"]))
        else:
            errors.append(f"Tool call {index} ({_clip(call['name'])}): {args}. Send the arguments as a JSON object.")
    used = {c.id for c in server}  # a call written in the content gives way: the server's ids go back to it
    written = [c.model_copy(update={"id": _fresh_id(c.id, used)}) if c.id in used else c for c in found.tool_calls]
    return new_parsed([*written, *server], found.answer, found.text, errors)


def _arguments_object(arguments: Any) -> dict[str, Any] | str:
    """A native call's arguments as the object they hold, else what is wrong with them. A string
    is text the server's JSON did not decode to an object: not JSON, or JSON encoded twice (some
    models do so; the Hermes parser reads it too)."""
    if isinstance(arguments, str):
        try:
            arguments = encodable_value(json.loads(arguments))
        except (ValueError, RecursionError):  # ValueError: also ints past Python's 4300-digit limit
            return f"its arguments are not valid JSON (got: {_clip(arguments)})"
    if isinstance(arguments, dict):
        return arguments
    kinds = {type(None): "null", str: "a string", bool: "a boolean", int: "a number", float: "a number"}
    shown = _clip(json.dumps(arguments, ensure_ascii=False))
    return f"its arguments are {kinds.get(type(arguments), 'an array')}, not a JSON object (got: {shown})"


def _clip(text: str, limit: int = 200) -> str:
    """`text` cut to `limit` characters, marked: a long reply's arguments would flood the observation."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def _wants_completion_tokens(resp: httpx.Response, body: dict[str, Any]) -> bool:
    """Whether a 400 refuses `max_tokens` for `max_completion_tokens` (OpenAI: "Unsupported
    parameter: 'max_tokens' is not supported with this model. Use 'max_completion_tokens' instead.")."""
    return "max_tokens" in body and "max_completion_tokens" in resp.text and "max_tokens" in resp.text


def _check_base_url(url: str) -> None:
    """Refuse a base URL no request can reach: one missing its `http://` (`localhost:8000/v1`)
    fails every request as a dropped connection would, retried in each episode of the run."""
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL as exc:
        raise ValueError(f"base_url {url!r} is not a URL: {exc}") from None
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise ValueError(
            f"base_url must be an http:// or https:// URL with a host, e.g. http://127.0.0.1:8000/v1; got {url!r}"
        )


def _check_seconds(**durations: float) -> None:
    """Refuse a duration no request can work with: a timeout that is not positive (0 fails every
    connection as the server timing out would, in every episode, after its retries) or a NaN."""
    for name, value in durations.items():
        timeout = "timeout" in name
        if not (value > 0 if timeout else value >= 0):  # NaN fails both
            raise ValueError(f"{name} must be a number of seconds {'> 0' if timeout else '>= 0'}, got {value!r}")


class _Shared:
    """The pool and the cap, shared by every spawned copy; rebuilt if the event loop changes
    (the rate limit is not: it holds across event loops and threads)."""

    def __init__(self, rate_limit: float | None) -> None:
        self.rate = RateLimit(rate_limit) if rate_limit else None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.client: httpx.AsyncClient | None = None
        self.semaphore: asyncio.Semaphore | None = None
        # The name the token cap goes under: `max_tokens` until a chat server refuses it.
        self.token_field = "max_tokens"  # noqa: S105 - a request field name, not a secret


class OpenAIAgent(Agent):
    """An agent backed by an OpenAI-compatible HTTP server.

    Args:
        model: the served model name.
        base_url: the API root, e.g. `http://127.0.0.1:8000/v1` (default: `$OPENAI_BASE_URL`
            or OpenAI's).
        api: `"chat"` (`/chat/completions`) or `"completions"` (`/completions`; text only: an episode
            with images ends with an `AgentError`).
        tool_calling: `"native"` (send tool schemas, read `tool_calls`) or `"text"`; chat only.
        api_key_env: the environment variable holding the key (no key: no Authorization header).
        temperature: sampling temperature (None: the server's default).
        top_p: nucleus sampling (None: the server's default).
        max_tokens: tokens to generate at most (None: the server's default). Sent as
            `max_tokens`, which vLLM, SGLang and the completions API read; when a chat server
            refuses that name for `max_completion_tokens` (OpenAI's reasoning models), the
            request goes again under the new name, as do all later ones of this agent and its copies.
        timeout: seconds one attempt may take, from sending to the last byte of the reply (an overall
            deadline: a reply trickling in never outlasts it); a timed-out attempt is retried.
        connect_timeout: seconds to connect (within `timeout`).
        max_retries: extra attempts after a 408/409/429/5xx/timeout/malformed reply.
        backoff: first retry delay in seconds (doubling, with jitter).
        max_backoff: the cap of one retry delay, in seconds.
        max_concurrency: requests in flight at once across all episodes (also the pool size).
        rate_limit: requests per second at most, across all episodes (None: no limit): requests
            start at least `1/rate_limit` s apart, as a tool's `rate_limit` spaces its calls.
        logprobs: ask for per-token log-probabilities. A turn keeps them only when every generated
            token has one (as many as its token ids, when known); else it keeps none and its
            metadata says why (`logprobs_dropped`), never a shorter list that would misalign them.
        return_token_ids: ask vLLM for the token ids (`return_token_ids`): the generated ones and
            the prompt's, as the server rendered it, recorded per turn.
        extra_body: more request fields (e.g. `{"chat_template_kwargs": {...}}`). `n` other
            than 1 is a ValueError: one choice is read per turn; so is `stream` (true): the
            agent reads one JSON reply, not a stream of events.
        stop: the stop strings of text mode and the completions API. None (the default) sends the
            parser's, except, in chat, a stop string that closes one call of a format that writes
            several calls a turn (`</tool_call>` of Hermes and Qwen3-Coder): the chat template ends
            the model's turn after its last call with an end-of-turn token the server stops at, and
            stopping at the first call's close would cut every turn to one call (no parallel calls).
            The stops of a format that takes one call a turn (Search-R1's tags, whose model writes
            its own `<information>` unless stopped; Harmony's `<|call|>`) or that end the turn's
            whole call list (DeepSeek's, Kimi's, GLM's...) are sent, and so are all of the parser's
            with the completions API (one growing text has no chat turn to end). A list is sent as
            it is (`[]`: none), e.g. `["</tool_call>"]` for models trained on one call a turn, and
            in native mode too. A `stop` in `extra_body` is taken as this one.
        seed: the sampling seed (vLLM and SGLang take it; None: not sent). Each request sends
            `seed + turn`, offset per episode (by its place in the rollout, so a resumed or
            retried episode draws as in the whole run), so the samples of a task (a GRPO group,
            pass@k) are different draws and a fresh agent with the same seed draws them again. A `seed`
            in `extra_body` is taken as this one: sent as it is, every sample would be the same.
    """

    name = "openai"

    def __init__(
        self,
        model: str,
        base_url: str | None = None,
        *,
        api: Literal["chat", "completions"] = "chat",
        tool_calling: Literal["native", "text"] = "native",
        api_key_env: str = "OPENAI_API_KEY",
        temperature: float | None = None,
        top_p: float | None = None,
        max_tokens: int | None = 1024,
        timeout: float = 120.0,
        connect_timeout: float = 10.0,
        max_retries: int = 4,
        backoff: float = 0.5,
        max_backoff: float = 30.0,
        max_concurrency: int = 32,
        rate_limit: float | None = None,
        logprobs: bool = False,
        return_token_ids: bool = False,
        extra_body: dict[str, Any] | None = None,
        seed: int | None = None,
        stop: list[str] | str | None = None,
    ) -> None:
        if api not in ("chat", "completions"):
            raise ValueError(f"api must be 'chat' or 'completions', got {api!r}")
        if tool_calling not in ("native", "text"):
            raise ValueError(f"tool_calling must be 'native' or 'text', got {tool_calling!r}")
        if max_retries < 0 or max_concurrency < 1:
            raise ValueError("max_retries must be >= 0 and max_concurrency >= 1")
        _check_seconds(timeout=timeout, connect_timeout=connect_timeout, backoff=backoff, max_backoff=max_backoff)
        if rate_limit is not None and (isinstance(rate_limit, bool) or not rate_limit > 0):  # NaN fails too
            raise ValueError(f"rate_limit must be a number of requests per second > 0 (or None), got {rate_limit!r}")
        self.model = model
        self.base_url = (base_url or os.environ.get("OPENAI_BASE_URL") or "https://api.openai.com/v1").rstrip("/")
        _check_base_url(self.base_url)
        self.api = api
        self.tool_calling = tool_calling if api == "chat" else "text"
        self.native_tools = self.tool_calling == "native"  # the prompt then leaves the tools to `tools`
        self.api_key_env = api_key_env
        self.sampling = {
            k: v
            for k, v in {"temperature": temperature, "top_p": top_p, "max_tokens": max_tokens}.items()
            if v is not None
        }
        self.timeout = httpx.Timeout(timeout, connect=connect_timeout)  # each read, connect, pool wait
        self.request_timeout, self.connect_timeout = float(timeout), float(connect_timeout)
        self.rate_limit = rate_limit
        self.max_retries = max_retries
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.max_concurrency = max_concurrency
        self.logprobs = logprobs
        self.return_token_ids = return_token_ids
        self.extra_body = dict(extra_body or {})
        if self.extra_body.get("n", 1) != 1:  # one choice is read per turn: the others would be thrown away
            raise ValueError(
                f"extra_body n={self.extra_body['n']!r}: the agent reads one choice per turn; "
                "ask for more attempts per task with samples=N (rollout --samples N)"
            )
        if self.extra_body.get("stream") not in (None, False):  # each request would fail as malformed JSON
            raise ValueError(
                f"extra_body stream={self.extra_body['stream']!r}: the agent reads one JSON reply per request, "
                "not a stream of events; leave stream out"
            )
        base = self.extra_body.pop("seed", None) if seed is None else seed
        if base is not None and (isinstance(base, bool) or not isinstance(base, int)):
            raise ValueError(f"seed must be an int, got {base!r}")
        self.seed: int | None = base
        given = self.extra_body.pop("stop", None) if stop is None else stop  # one place, as `seed`
        if isinstance(given, str):  # the API takes one string too
            given = [given]
        if given is not None and (
            not isinstance(given, list | tuple) or not all(isinstance(x, str) and x for x in given)
        ):
            raise ValueError(f"stop must be a list of non-empty strings, got {given!r}")
        self.stop: list[str] | None = None if given is None else list(given)
        self._episodes = itertools.count(1)  # shared by spawned copies
        self._episode = 0  # 0: not spawned (direct use)
        self._shared = _Shared(rate_limit)
        self._reset_episode()

    def __repr__(self) -> str:  # no key, ever
        return f"OpenAIAgent(model={self.model!r}, base_url={self.base_url!r}, api={self.api!r})"

    # ------------------------------------------------------------------ episode state
    def _reset_episode(self) -> None:
        self._transcript: list[dict[str, Any]] = []  # chat text mode
        self._prompt = ""  # completions mode
        self._contents: dict[str, str] = {}  # native mode: rendered action -> the model's own content
        self._reasonings: dict[str, dict[str, str]] = {}  # native mode: action -> the reply's reasoning fields
        self._calls: dict[str, list[dict[str, Any]]] = {}  # native mode: action -> the server's calls

    def spawn(self) -> OpenAIAgent:
        twin = super().spawn()
        assert isinstance(twin, OpenAIAgent)
        twin._reset_episode()
        twin._episode = next(self._episodes)
        return twin

    def reset(self, task: Task) -> None:
        self._reset_episode()

    # ------------------------------------------------------------------ HTTP
    def _key(self) -> str | None:
        return os.environ.get(self.api_key_env) or None

    def _client(self) -> tuple[httpx.AsyncClient, asyncio.Semaphore]:
        sh = self._shared
        loop = asyncio.get_running_loop()
        if sh.client is None or sh.semaphore is None or sh.loop is not loop:
            limits = httpx.Limits(max_connections=self.max_concurrency, max_keepalive_connections=self.max_concurrency)
            sh.client = httpx.AsyncClient(
                base_url=self.base_url, timeout=self.timeout, limits=limits, verify=tls_context()
            )
            sh.semaphore = asyncio.Semaphore(self.max_concurrency)
            sh.loop = loop
        return sh.client, sh.semaphore

    def _redact(self, text: str) -> str:
        """`text` without the API key, nor the password of a base URL's `user:password@`."""
        key = self._key()
        text = text.replace(key, "***") if key else text
        password = urllib.parse.urlsplit(self.base_url).password
        return text.replace(f":{password}@", ":***@") if password else text

    def _snippet(self, text: str, limit: int) -> str:
        """A server's text for an error line: the key redacted before the cut (a cut key would
        escape the redaction), folded to one line (a proxy's HTML page), at most `limit` long."""
        return " ".join(self._redact(text).split())[:limit]

    async def _post(self, path: str, body: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """POST with retries; returns the decoded JSON and the turn's request metadata (the
        attempts used, and the seconds spent queued, in backoff and in requests: `Spent`).

        A hand-written loop rather than a retry library: it needs the status code rules
        (408/409/429/5xx retry, other 4xx fail at once) and `Retry-After`, which is most of the code.
        """
        client, sem = self._client()
        headers = {"Content-Type": "application/json"}
        key = self._key()
        if key:
            headers["Authorization"] = f"Bearer {key}"
        last = ""
        last_status: int | None = None
        renamed = False
        spent = Spent()
        for attempt in range(self.max_retries + 1):
            retry_after: float | None = None
            last_status = None
            try:
                resp = await self._send(client, sem, path, body, headers, spent)
                if not renamed and resp.status_code == 400 and _wants_completion_tokens(resp, body):
                    # Not an attempt: the same request under the name the server asked for.
                    self._shared.token_field, renamed = "max_completion_tokens", True
                    resp = await self._send(client, sem, path, body, headers, spent)
            except (httpx.TimeoutException, asyncio.TimeoutError) as exc:
                last = timeout_message(exc, self.request_timeout, self.connect_timeout)
            except httpx.TransportError as exc:
                last = f"connection failed ({type(exc).__name__}: {exc})"
            except httpx.DecodingError as exc:  # a body its Content-Encoding does not decode: malformed
                last = f"a reply that could not be decoded ({exc})"
            else:
                if resp.is_redirect:  # not followed: a POST redirected may arrive as a GET, or not at all
                    where = self._snippet(resp.headers.get("location", "nowhere"), 200)
                    raise AgentError(
                        self._redact(
                            f"{self.base_url}{path} answered HTTP {resp.status_code} (redirected to {where}); "
                            "set base_url to where the API is"
                        )
                    )
                if resp.status_code in _RETRIED or resp.status_code >= 500:
                    last, last_status = f"HTTP {resp.status_code}: {self._snippet(resp.text, 200)}", resp.status_code
                    retry_after = _retry_after(resp)
                elif resp.status_code >= 400:
                    snippet = self._snippet(resp.text, 500)
                    # A 404: a base URL without its `/v1`, or a model the server does not serve (OpenAI, vLLM).
                    hint = (
                        "; check base_url (the API root, e.g. http://127.0.0.1:8000/v1) and model"
                        if resp.status_code == 404
                        else ""
                    )
                    raise AgentError(
                        self._redact(f"{self.base_url}{path} answered HTTP {resp.status_code}: {snippet}{hint}")
                    )
                else:
                    try:
                        data = resp.json()
                    except ValueError:
                        last = f"malformed JSON in the reply: {self._snippet(resp.text, 100)!r}"
                    else:
                        if _has_choice(data, "message" if path == "/chat/completions" else None):
                            return data, {"attempts": attempt + 1, **spent.metadata()}
                        last = f"a reply without a usable choice: {self._snippet(str(data), 200)}"
            if attempt < self.max_retries:
                delay = min(self.backoff * 2**attempt, self.max_backoff) * (0.5 + random.random() / 2)
                start = time.monotonic()
                await asyncio.sleep(min(retry_after, self.max_backoff) if retry_after is not None else delay)
                spent.since(start, "backoff")
        hint = load_hint(self.max_concurrency, self.rate_limit) if last_status == 429 else ""
        raise AgentError(
            self._redact(f"{self.base_url}{path} failed after {self.max_retries + 1} attempt(s): {last}{hint}")
        )

    async def _send(
        self,
        client: httpx.AsyncClient,
        sem: asyncio.Semaphore,
        path: str,
        body: dict[str, Any],
        headers: dict[str, str],
        spent: Spent,
    ) -> httpx.Response:
        """One request, once a slot is free and the rate limit lets it go (both counted in `spent.queue`),
        under `timeout` as a whole (`spent.request`). Raises `asyncio.TimeoutError` past it."""
        start = time.monotonic()
        async with sem:
            if self._shared.rate is not None:  # inside the slot: a freed slot must not let a burst through
                await self._shared.rate.wait()
            sent = spent.since(start, "queue")
            try:
                return await within(
                    self.request_timeout, client.post(path, json=self._token_field(body), headers=headers)
                )
            finally:
                spent.since(sent, "request")

    # ------------------------------------------------------------------ acting
    async def act(self, observation: str, messages: list[Message], env_info: EnvInfo) -> AgentAction:
        if self.api == "completions":
            _refuse_images(messages)
            return await self._act_completions(observation, env_info)
        if self.tool_calling == "native":
            return await self._act_native(messages, env_info)
        return await self._act_chat_text(observation, messages, env_info)

    def _body(self, env_info: EnvInfo, **fields: Any) -> dict[str, Any]:
        body = {"model": self.model, **self.sampling, **fields, **self.extra_body}
        if self.seed is not None:  # a draw of its own per episode and turn (see `seed`)
            body["seed"] = episode_seed(self.seed, self._episode, env_info)
        return body

    def _token_field(self, body: dict[str, Any]) -> dict[str, Any]:
        """`body` with its token cap under the name this agent's server takes."""
        field = self._shared.token_field
        if field == "max_tokens" or "max_tokens" not in body or field in body:
            return body
        renamed = {k: v for k, v in body.items() if k != "max_tokens"}
        renamed[field] = body["max_tokens"]
        return renamed

    async def _act_completions(self, observation: str, env_info: EnvInfo) -> AgentAction:
        if env_info.turn == 0:
            self._prompt = observation
        else:  # as the format's trainers append it (Search-R1: `\n\n<information>…</information>\n\n`)
            glue = env_info.parser.continue_with(observation) if env_info.parser else f"\n{observation}\n"
            self._prompt += glue
        body = self._body(env_info, prompt=self._prompt, **self._gen_options(env_info))
        if self.logprobs:
            body["logprobs"] = 1
        if self.return_token_ids:
            body["return_token_ids"] = True
        data, stats = await self._post("/completions", body)
        choice = data["choices"][0]
        text = _with_stop(fix_text(str(choice.get("text") or "")), choice, env_info.parser, self._stops(env_info))
        self._prompt += text
        lp = (choice.get("logprobs") or {}).get("token_logprobs") if isinstance(choice.get("logprobs"), dict) else None
        return self._action(text, data, choice, stats, lp)

    async def _act_chat_text(self, observation: str, messages: list[Message], env_info: EnvInfo) -> AgentAction:
        if env_info.turn == 0 or not self._transcript:
            self._transcript = [m.to_openai() for m in messages if m.role in ("system", "user")]
        else:
            images = [im for m in _since_last_assistant(messages) for im in m.images]
            self._transcript.append(Message(role="user", content=observation, images=images).to_openai())
        body = self._body(env_info, messages=self._transcript, **self._gen_options(env_info))
        data, stats = await self._post("/chat/completions", self._with_logprobs(body))
        choice = data["choices"][0]
        msg = encodable_value(choice["message"])
        text = _with_stop(str(msg.get("content") or ""), choice, env_info.parser, self._stops(env_info))
        reasoning = _reasoning(msg)
        self._transcript.append({"role": "assistant", "content": text, **reasoning})
        return self._action(text, data, choice, stats, _chat_logprobs(choice), reasoning)

    async def _act_native(self, messages: list[Message], env_info: EnvInfo) -> AgentAction:
        body = self._body(env_info, messages=self._native_messages(messages))
        if env_info.tool_schemas:
            body["tools"] = env_info.tool_schemas
        if self.stop:  # the user's own; a parser's would cut the text around native calls
            body["stop"] = list(self.stop)
        data, stats = await self._post("/chat/completions", self._with_logprobs(body))
        choice = data["choices"][0]
        msg = encodable_value(choice["message"])
        content = str(msg.get("content") or "")
        calls = _distinct_ids([_decode_call(c, i) for i, c in enumerate(msg.get("tool_calls") or [])])
        text = render_tool_calls(content, calls, env_info.parser) if calls else content
        if calls:
            self._contents[text] = content
            self._calls[text] = calls
        reasoning = _reasoning(msg)
        if reasoning:
            self._reasonings[text] = reasoning
        action = self._action(text, data, choice, stats, _chat_logprobs(choice), reasoning)
        action.metadata["native_tool_calls"] = len(calls)
        if calls and env_info.parser is not None:
            action.parsed = native_turn(content, calls, env_info.parser)
        return action

    def _native_messages(self, messages: list[Message]) -> list[dict[str, Any]]:
        """The env's messages in the OpenAI shape, tool results answering their calls by id.

        Each call goes back under the server's id when the server made it (only Hermes blocks
        carry ids into the env; other formats' parsers name a turn's calls `call_0`, `call_1`...)
        and under no id used before in the conversation, which OpenAI, Anthropic (through a
        gateway) and Mistral refuse; each `tool` message answers its call under the same id."""
        out: list[dict[str, Any]] = []
        open_ids: dict[str, list[str]] = {}  # the env's id of an unanswered call -> the id it went under
        used: set[str] = set()
        pending_user: list[Message] = []
        # Tool messages carry text only: their images follow as user messages (the SFT export builds
        # a native turn's reply with the same function, so it writes what the model read)
        for m in move_tool_images(messages):
            if m.role == "tool" and m.tool_call_id and open_ids.get(m.tool_call_id):
                out.append({"role": "tool", "tool_call_id": open_ids[m.tool_call_id].pop(0), "content": m.content})
                continue
            if m.role == "tool":  # parser errors and the like: no call to answer
                pending_user.append(Message(role="user", content=m.content, images=m.images))
                continue
            open_ids.clear()
            out.extend(p.to_openai() for p in pending_user)
            pending_user = []
            if m.role == "assistant" and m.tool_calls:
                d = m.model_copy(update={"content": self._contents.get(m.content, _strip_calls(m.content))}).to_openai()
                d["content"] = d["content"] or None
                ids = self._sent_ids(m, used)
                d["tool_calls"] = [{**sent, "id": i} for sent, i in zip(d["tool_calls"], ids, strict=True)]
                for c, i in zip(m.tool_calls, ids, strict=True):
                    open_ids.setdefault(c.id, []).append(i)
            else:
                d = m.to_openai()
            if m.role == "assistant":  # the reasoning goes back with its message
                d.update(self._reasonings.get(m.content, {}))
            out.append(d)
        out.extend(p.to_openai() for p in pending_user)
        return out

    def _sent_ids(self, m: Message, used: set[str]) -> list[str]:
        """The ids `m`'s calls go back under: the server's for a call it made (same name and
        arguments), else the env's; suffixed when taken already (`used`, which gains them)."""
        server = list(self._calls.get(m.content, ()))
        ids = []
        for c in m.tool_calls or ():
            match = next((s for s in server if s["name"] == c.name and s["arguments"] == c.arguments), None)
            if match is not None:
                server.remove(match)
            base = match["id"] if match is not None else c.id
            ids.append(_fresh_id(base, used))
        return ids

    def _stops(self, env_info: EnvInfo) -> tuple[str, ...]:
        """The stop strings sent this turn (see `stop`): the user's, else the parser's less, in
        chat, those that close one of several calls a turn."""
        if self.stop is not None:
            return tuple(self.stop)
        if self.api == "chat":
            return chat_stops(env_info.stop)
        return env_info.stop

    def _gen_options(self, env_info: EnvInfo) -> dict[str, Any]:
        """Text-mode fields: the stop strings (`_stops`, all of them: vLLM and SGLang take any
        number; OpenAI's own API refuses more than 4 with a 400), and special tokens kept in the
        text when the format is written in them (vLLM and SGLang skip them by default)."""
        stops = self._stops(env_info)
        options: dict[str, Any] = {"stop": list(stops)} if stops else {}
        if env_info.parser is not None and env_info.parser.special_tokens:
            options["skip_special_tokens"] = False
        return options

    def _with_logprobs(self, body: dict[str, Any]) -> dict[str, Any]:
        if self.logprobs:
            body["logprobs"] = True
        if self.return_token_ids:
            body["return_token_ids"] = True
        return body

    def _action(
        self,
        text: str,
        data: dict[str, Any],
        choice: dict[str, Any],
        stats: dict[str, Any],
        logprobs: Any,
        reasoning: dict[str, str] | None = None,
    ) -> AgentAction:
        usage: dict[str, Any] = data["usage"] if isinstance(data.get("usage"), dict) else {}
        ids = choice.get("token_ids")
        # vLLM's `return_token_ids`: the prompt's ids on the choice (completions) or the response (chat).
        prompt_ids = choice.get("prompt_token_ids", data.get("prompt_token_ids"))
        metadata: dict[str, Any] = {"finish_reason": choice.get("finish_reason"), **stats}
        if reasoning:
            metadata["reasoning"] = next(iter(reasoning.values()))
        token_ids = [int(i) for i in ids] if isinstance(ids, list) else None
        kept, dropped = _aligned_logprobs(logprobs, token_ids)
        if dropped is not None and self.logprobs:
            metadata["logprobs_dropped"] = dropped
        return AgentAction(
            text=text,
            token_ids=token_ids,
            prompt_token_ids=[int(i) for i in prompt_ids] if isinstance(prompt_ids, list) else None,
            logprobs=kept,
            prompt_tokens=usage.get("prompt_tokens") if isinstance(usage.get("prompt_tokens"), int) else None,
            completion_tokens=usage.get("completion_tokens")
            if isinstance(usage.get("completion_tokens"), int)
            else None,
            metadata=metadata,
        )

    async def aclose(self) -> None:
        sh = self._shared
        if sh.client is not None:
            await sh.client.aclose()
        sh.client, sh.semaphore, sh.loop = None, None, None


def _has_choice(data: Any, field: str | None) -> bool:
    """True when `data` has a first choice that is an object (holding `field` as an object)."""
    choices = data.get("choices") if isinstance(data, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return False
    return field is None or isinstance(choices[0].get(field), dict)


def _reasoning(msg: dict[str, Any]) -> dict[str, str]:
    """The reasoning a reply carries beside its content (vLLM's `reasoning`, `reasoning_content`
    before it; SGLang's `reasoning_content`), as the fields of an assistant message that sends it
    back: under the name(s) the server used, the one it reads (a server that does not know the
    other name may refuse the message)."""
    text = next((v for k in _REASONING_FIELDS if isinstance(v := msg.get(k), str) and v), None)
    return {k: text for k in _REASONING_FIELDS if isinstance(msg.get(k), str) and msg[k]} if text else {}


def _retry_after(resp: httpx.Response) -> float | None:
    """Seconds the server asks to wait: OpenAI's `retry-after-ms`, else `Retry-After` as seconds
    or an HTTP date (RFC 9110); None when it asks nothing readable."""
    with contextlib.suppress(ValueError):
        if (ms := resp.headers.get("retry-after-ms")) is not None:
            return max(0.0, float(ms) / 1000)
    value = resp.headers.get("retry-after")
    if value is None:
        return None
    with contextlib.suppress(ValueError):
        return max(0.0, float(value))
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:  # RFC 9110 dates are GMT
        when = when.replace(tzinfo=datetime.timezone.utc)
    return max(0.0, (when - datetime.datetime.now(datetime.timezone.utc)).total_seconds())


def _with_stop(text: str, choice: dict[str, Any], parser: ActionParser | None, stops: tuple[str, ...]) -> str:
    """Put back the stop string (of `stops`, those sent) the server cut off (vLLM: `stop_reason`,
    SGLang: `matched_stop`), unless the text holds it already (vLLM's `include_stop_str_in_output`).

    OpenAI's API and most gateways do not say whether a stop string or the model's end of turn
    ended the reply, and a server naming a stop token by its id (vLLM stops gpt-oss at `<|call|>`,
    an end of turn in its generation config, and cuts it from the text) does not say which stop
    string it stands for: there, the stop string that completes a call the text left open (the
    env reads more calls or fewer errors with it) is put back; a complete text is kept as it is."""
    if parser is None or choice.get("finish_reason") != "stop" or not stops or text.endswith(stops):
        return text
    matched = choice.get("stop_reason") or choice.get("matched_stop")
    if isinstance(matched, str):
        return text + matched if matched in stops else text
    if matched is None and ("stop_reason" in choice or "matched_stop" in choice):  # ended by itself
        return text
    before = parser.parse(text)
    afters = [(stop, parser.parse(text + stop)) for stop in stops]
    for stop, after in afters:
        if len(after.tool_calls) > len(before.tool_calls) or len(after.errors) < len(before.errors):
            return text + stop
    if isinstance(matched, int) and not isinstance(matched, bool):  # a stop token ended the call it follows
        for stop, after in afters:
            if (
                after.tool_calls
                and len(after.tool_calls) == len(before.tool_calls)
                and len(after.errors) <= len(before.errors)
            ):
                return text + stop
    return text


def _chat_logprobs(choice: dict[str, Any]) -> list[Any] | None:
    """One entry per token of a chat choice's `logprobs.content`, None where a token has no log-prob."""
    lp = choice.get("logprobs")
    if isinstance(lp, dict) and isinstance(lp.get("content"), list):
        return [t.get("logprob") if isinstance(t, dict) else None for t in lp["content"]]
    return None


def _aligned_logprobs(values: Any, token_ids: list[int] | None) -> tuple[list[float] | None, str | None]:
    """(log-probs, None): one per generated token, as many as `token_ids` when known; else (None, why).

    Servers send a null log-prob for some tokens (special or tool-call tokens, some backends), or
    null `logprobs` for a choice. Leaving out only the nulls would shift every later log-prob onto
    the wrong token, which an RL trainer would train on without a sign: the turn keeps none instead."""
    if not isinstance(values, list):
        return None, "the reply has no log-probs"
    missing = sum(1 for v in values if isinstance(v, bool) or not isinstance(v, (int, float)))
    if missing:
        return None, f"{missing} of {len(values)} token log-probs are null or not numbers"
    if token_ids is not None and len(values) != len(token_ids):
        return None, f"{len(values)} log-probs for {len(token_ids)} token ids"
    return [float(v) for v in values], None


def _decode_call(raw: Any, index: int) -> dict[str, Any]:
    fn = raw.get("function") if isinstance(raw, dict) else None
    if not isinstance(fn, dict):  # no name: the env reports an unknown tool
        fn = {}
    args: Any = fn.get("arguments")
    if args is None:  # some servers send null for a call without arguments
        args = {}
    elif isinstance(args, str):
        with contextlib.suppress(json.JSONDecodeError):  # left as a string: the env's parser reports it
            args = encodable_value(json.loads(args)) if args.strip() else {}  # `"\\ud83d"` decodes to half an emoji
    call_id = raw.get("id") if isinstance(raw, dict) else None
    return {"name": str(fn.get("name", "")), "arguments": args, "id": call_id or f"call_{index}"}


def _fresh_id(base: str, used: set[str]) -> str:
    """`base`, or `base_1`, `base_2`... when taken; recorded in `used`."""
    cid, n = base, 1
    while cid in used:
        cid, n = f"{base}_{n}", n + 1
    used.add(cid)
    return cid


def _distinct_ids(calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The calls of one reply under distinct ids (a server may give two the same): the env answers
    each call by its id, and a call whose id another one took would be left unanswered."""
    used: set[str] = set()
    for c in calls:
        c["id"] = _fresh_id(c["id"], used)
    return calls


def _strip_calls(content: str) -> str:
    return _TOOL_CALL_BLOCK.sub("", content).strip()


def _refuse_images(messages: list[Message]) -> None:
    """Refuse an episode whose messages carry images in completions mode, whose text prompt has no
    place for them: sent without them, the model would answer about a picture it never saw.

    Raises:
        AgentError: a message carries images (the runner ends the episode with it).
    """
    for i, m in enumerate(messages):
        if m.images:
            raise AgentError(
                f"message {i} ({m.role}) carries {len(m.images)} image(s), and the openai agent's api=completions "
                "sends a text prompt only; use api=chat (the default) to send images"
            )


def _since_last_assistant(messages: list[Message]) -> list[Message]:
    for i in range(len(messages) - 1, -1, -1):
        if messages[i].role == "assistant":
            return messages[i + 1 :]
    return []
