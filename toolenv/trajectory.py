"""The typed record of one rolled-out episode, one JSON line per trajectory.

A trajectory holds everything a report or a training pipeline needs: the task,
the prompt messages, and per turn the action, the parsed tool calls, the tool
results (images kept as base64 PNG/JPEG), the observation, the reward and its
components (and what the reward parts recorded: a judge's reply or error), timings and
token counts when the agent knows them.
"""

from __future__ import annotations

import base64
import itertools
import json
import math
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic_core import PydanticSerializationError, to_jsonable_python

from toolenv._text import fix_text
from toolenv.image_store import IMAGE_STORE, IMAGES_DIR, ImageStore
from toolenv.types import Message, ParsedAction, Task, ToolResult

__all__ = [
    "CallStats",
    "JsonLine",
    "Trajectory",
    "TurnRecord",
    "dump_line",
    "invalid_line_message",
    "iter_trajectory_file",
    "kept_lines",
    "load_trajectory_file",
    "read_trajectories",
    "retrying_file",
]

T = TypeVar("T")

SCHEMA_VERSION = 1


class _Model(BaseModel):
    # A non-finite float (a -inf logprob) is written as "NaN", "Infinity" or "-Infinity",
    # which reads back; pydantic's default, null, would make the line unreadable.
    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="strings")


class CallStats(_Model):
    """How one tool call went (the caller's record, JSON-friendly)."""

    name: str
    call_id: str = ""
    attempts: int = 0
    error: str | None = None
    truncated: bool = False
    latency_s: float = 0.0
    cached: bool = Field(default=False, description="Answered by the tool's ResultCache, without running it.")


class TurnRecord(_Model):
    """One agent action and what the env made of it."""

    index: int = Field(ge=0, description="0 for the first action.")
    action: str = Field(description="The action text the env parsed.")
    parsed: ParsedAction = Field(default_factory=ParsedAction)
    results: list[ToolResult] = Field(default_factory=list, description="Tool results, then parser errors.")
    calls: list[CallStats] = Field(default_factory=list)
    observation: str = ""
    reward: float = 0.0
    reward_components: dict[str, float] = Field(default_factory=dict)
    agent_latency_s: float = Field(default=0.0, description="Seconds the agent took to act.")
    env_latency_s: float = Field(default=0.0, description="Seconds the env step took (tool calls, reward).")
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    prompt_token_ids: list[int] | None = Field(default=None, description="The prompt as the model read it.")
    agent_metadata: dict[str, Any] = Field(default_factory=dict)

    @property
    def tool_errors(self) -> int:
        """Results of this turn that are errors (tool failures and parse errors)."""
        return sum(1 for r in self.results if r.is_error)


class Trajectory(_Model):
    """One episode, as written to `trajectories.jsonl`."""

    schema_version: int = SCHEMA_VERSION
    env_id: str
    agent: str
    model: str | None = None
    task: Task
    sample: int = Field(default=0, ge=0, description="Index of this attempt at the task (pass@k runs).")
    episode_id: str = ""
    seed: int | None = None
    prompt: str = Field(default="", description="The first observation.")
    prompt_messages: list[Message] = Field(default_factory=list, description="The messages after reset.")
    turns: list[TurnRecord] = Field(default_factory=list)
    answer: str | None = None
    reward: float = Field(default=0.0, description="Sum of the turn rewards.")
    reward_components: dict[str, float] = Field(default_factory=dict, description="Per component, summed over turns.")
    reward_info: dict[str, Any] = Field(
        default_factory=dict,
        description="What the reward parts recorded about the episode, by component (`info['reward_info']` "
        "at its end): a judge's reply, or the `error` that made a part score 0 (a judge that is down).",
    )
    success: bool = False
    terminated: bool = False
    truncated: bool = False
    error: str | None = Field(default=None, description="Why the episode stopped early (agent or env failure).")
    started_at: str = Field(default="", description="ISO 8601 UTC start time.")
    duration_s: float = 0.0

    @property
    def key(self) -> tuple[str, int]:
        """What a resumed run uses to skip finished work: (task id, sample)."""
        return self.task.id, self.sample

    @property
    def reward_error(self) -> str | None:
        """`PART: error` of the first reward part that reported an error in `reward_info` (an
        LLM judge after its retries, math-verify timing out): that part scored 0 for it."""
        for part, info in self.reward_info.items():
            error = info.get("error") if isinstance(info, dict) else None
            if error:
                return f"{part}: {error}"
        return None

    @property
    def tool_calls(self) -> int:
        """Tool calls the agent made."""
        return sum(len(t.parsed.tool_calls) for t in self.turns)

    @property
    def tool_errors(self) -> int:
        """Error results (failed calls and parse errors)."""
        return sum(t.tool_errors for t in self.turns)

    @property
    def tool_results(self) -> int:
        """All results, errors included."""
        return sum(len(t.results) for t in self.turns)

    def completion_tokens(self) -> int | None:
        """Generated tokens over all turns, or None when the agent never reported them."""
        known = [t.completion_tokens for t in self.turns if t.completion_tokens is not None]
        return sum(known) if known else None

    def prompt_tokens(self) -> int | None:
        """Prompt tokens over all turns, or None when unknown."""
        known = [t.prompt_tokens for t in self.turns if t.prompt_tokens is not None]
        return sum(known) if known else None

    def to_json_line(self, images: ImageStore | None = None) -> str:
        """One line of JSON (no newline inside). Images are base64 inside the line, or, given
        an `ImageStore`, files in it that the line names.

        Text with lone UTF-16 surrogates (half an emoji, cut by a server) is written with
        U+FFFD in their place, and numpy scalars and arrays (or anything else with `tolist()`
        or `item()`) in metadata as plain numbers and lists.

        Raises:
            ValueError: a value cannot be written as JSON; the message names its field.
        """
        line, problems, _ = dump_line(self, images)
        if problems:
            raise ValueError(f"cannot write {'; '.join(problems)}")
        return line


def plain_value(value: Any) -> Any:
    """A numpy scalar or array (or a tensor) as plain Python, else `value` itself."""
    for method in ("tolist", "item"):
        convert = getattr(value, method, None)
        if callable(convert):
            try:
                return convert()
            except Exception:  # noqa: BLE001, S112 - not a numpy-like value after all
                continue
    return value


class JsonLine(NamedTuple):
    """What `dump_line` made of a trajectory."""

    text: str
    #: Values written as null, each named: `turns.2.agent_metadata.x: Foo is not JSON (written as null)`.
    problems: list[str]
    #: The line differs from the trajectory in memory (surrogates replaced, values converted).
    altered: bool


def dump_line(traj: Trajectory, images: ImageStore | None = None) -> JsonLine:
    """`traj` as one JSON line, whatever it holds, and what could not be written (`dump_json`)."""
    return dump_json(traj, None if images is None else {IMAGE_STORE: images})


def dump_json(model: BaseModel, context: Any = None, *, warnings: bool = True) -> JsonLine:
    """`model` as one line of JSON, whatever it holds, and what could not be written.

    The common case is one call of pydantic's serializer. When it fails, lone surrogates
    become U+FFFD, numpy-like values plain numbers and lists, and each value that still is
    not JSON is written as null and named (`turns.2.agent_metadata.score: Foo is not JSON`).
    Non-finite floats are written as the model's `ser_json_inf_nan` says (null by default).
    Trajectory files and the remote env's wire both write through this.
    """
    try:
        return JsonLine(model.model_dump_json(context=context, warnings=warnings), [], False)
    except PydanticSerializationError:
        pass
    token = f"\x00toolenv-unwritable-{uuid.uuid4().hex}:"
    strings = model.model_config.get("ser_json_inf_nan") == "strings"

    def fallback(value: Any) -> Any:
        plain = plain_value(value)
        return plain if plain is not value else token + type(value).__qualname__

    try:
        data = model.model_dump(mode="json", context=context, fallback=fallback, warnings=warnings)
    except UnicodeDecodeError:  # bytes that are not UTF-8 where any value goes (a PNG in a task's context)
        data = model.model_dump(context=context, fallback=fallback, warnings=warnings)
        data = to_jsonable_python(_bytes_as_text(data, token), fallback=fallback)
    problems: list[str] = []

    def clean(value: Any, where: tuple[str, ...]) -> Any:
        if isinstance(value, str):
            if value.startswith(token):
                what = value[len(token) :]
                said = _NOT_UTF8 if what == _NOT_UTF8 else f"{what} is not JSON"
                problems.append(f"{'.'.join(where)}: {said} (written as null)")
                return None
            return fix_text(value)
        if isinstance(value, float) and not math.isfinite(value):  # a float field (Any ones are null by now)
            if not strings:
                return None
            return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
        if isinstance(value, dict):
            return {fix_text(str(k)): clean(v, (*where, str(k))) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [clean(v, (*where, str(i))) for i, v in enumerate(value)]
        return value

    data = clean(data, ())
    return JsonLine(json.dumps(data, ensure_ascii=False, separators=(",", ":"), allow_nan=False), problems, True)


_NOT_UTF8 = "bytes that are not UTF-8"
_IMAGE_KEYS = frozenset({"data", "mime", "width", "height"})


def _bytes_as_text(value: Any, token: str) -> Any:
    """A python-mode dump with bytes as JSON mode writes them: an image's as base64, others as
    their UTF-8 text, and those that are not UTF-8 as `token` naming them (written as null)."""
    if isinstance(value, dict):
        if value.keys() == _IMAGE_KEYS and isinstance(value["data"], bytes):  # a ToolImage, inline
            return {**value, "data": base64.b64encode(value["data"]).decode("ascii")}
        return {k: _bytes_as_text(v, token) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_bytes_as_text(v, token) for v in value]
    if isinstance(value, bytes | bytearray):
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            return token + _NOT_UTF8
    return value


def iter_trajectory_lines(path: str | Path) -> Iterator[tuple[int, Trajectory | None, str]]:
    """Each line of a JSONL file as (line number, trajectory or None when invalid, raw line).

    Images a line keeps as files are read from the `images/` folder beside the file. Bytes that
    are not UTF-8 (a write killed inside a character) make their line invalid, not the file.
    """
    path = Path(path)
    context = {IMAGE_STORE: ImageStore(path.parent / IMAGES_DIR)}
    with path.open(encoding="utf-8", errors="surrogateescape") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                yield lineno, Trajectory.model_validate_json(line, context=context), line
            except ValidationError:
                yield lineno, None, line


def _why_invalid(line: str, path: Path) -> str:
    try:
        json.loads(line)
    except json.JSONDecodeError as exc:
        return f"not valid JSON ({exc.msg})"
    try:
        Trajectory.model_validate_json(line, context={IMAGE_STORE: ImageStore(path.parent / IMAGES_DIR)})
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        said = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) + ': ' if e['loc'] else ''}{e['msg']}" for e in errors[:3]
        )
        more = f"; and {len(errors) - 3} more" if len(errors) > 3 else ""
        return f"not a valid trajectory ({said}{more})"
    return "not a valid trajectory"  # pragma: no cover - it failed a moment ago


def read_trajectories(path: str | Path, *, strict: bool = False) -> list[Trajectory]:
    """Trajectories from a JSONL file, with the earlier lines a killed `--retry-errors` run left
    in its `retrying_file` (each episode once: see `kept_lines`).

    Args:
        path: the file (`runs/NAME/trajectories.jsonl`).
        strict: raise on an invalid line instead of skipping it (a run killed mid-write
            may leave one partial last line; `load_trajectory_file` allows that one only).

    Raises:
        ValueError: `strict` and a line is not a valid trajectory (the message names the line).
    """

    def valid(file: Path, lines: Iterable[tuple[int, Trajectory | None, str]]) -> Iterator[Trajectory]:
        for lineno, traj, line in lines:
            if traj is None:
                if strict:
                    raise ValueError(f"{file}:{lineno}: {_why_invalid(line, file)}")
                continue
            yield traj

    path = Path(path)
    return list(_with_retrying(path, valid(path, iter_trajectory_lines(path)), _key, valid, iter_trajectory_lines))


def invalid_line_message(path: str | Path, lineno: int, line: str) -> str:
    """`PATH:LINE: why the line is not a valid trajectory`, one line."""
    return f"{path}:{lineno}: {_why_invalid(line, Path(path))}"


def load_trajectory_file(path: str | Path) -> tuple[list[Trajectory], int | None]:
    """Every trajectory in a run's file, and the number of a partial last line left out.

    A partial last line (one with no newline at its end that is not a valid trajectory) is
    what a run killed mid-write leaves: it is left out and its number returned. Every other
    line must be a valid trajectory.

    Raises:
        ValueError: a line other than a partial last one is not a valid trajectory, or the
            file holds no trajectory at all; the message names the file (and line) and why.
    """
    partial: list[int] = []
    out = list(iter_trajectory_file(path, on_partial=partial.append))
    return out, partial[0] if partial else None


def iter_trajectory_file(path: str | Path, *, on_partial: Callable[[int], None] | None = None) -> Iterator[Trajectory]:
    """`load_trajectory_file` one trajectory at a time, so a run of any size reads in flat
    memory: the number of a partial last line goes to `on_partial`, and the ValueErrors
    come when the iteration reaches the line (or the end of a file that held none)."""
    return kept_lines(path, iter_trajectory_lines(path), on_partial, read=iter_trajectory_lines, key=_key)


def retrying_file(path: str | Path) -> Path:
    """Where a `--retry-errors` run keeps the earlier lines of the episodes it is rerunning
    (`trajectories.retrying.jsonl` beside `trajectories.jsonl`) until their reruns are written.

    A run that ends (Ctrl-C and SIGTERM included) puts back the lines whose rerun it did not
    write and removes the file; one killed outright (SIGKILL, a crash) leaves it, and readers
    of the run (`kept_lines`) and its next resume count each of its lines whose episode has no
    line in the run's file.
    """
    path = Path(path)
    return path.with_name(f"{path.stem}.retrying{path.suffix}")


def _key(traj: Trajectory) -> tuple[str, int]:
    return traj.key


def _refuse(file: Path, lines: Iterable[tuple[int, T | None, str]]) -> Iterator[T]:
    """The valid lines of a retrying file, written whole: any invalid line is a ValueError."""
    for lineno, item, line in lines:
        if item is None:
            raise ValueError(invalid_line_message(file, lineno, line))
        yield item


def _with_retrying(
    path: Path,
    kept: Iterable[T],
    key: Callable[[T], tuple[str, int]],
    valid: Callable[[Path, Iterable[tuple[int, T | None, str]]], Iterator[T]],
    read: Callable[[Path], Iterable[tuple[int, T | None, str]]],
) -> Iterator[T]:
    """`kept` (the run file's trajectories), then those of its `retrying_file` whose (task id,
    sample) `kept` has none of, so each episode is read once: a line in the run's file is
    never older than one of its episode left aside. Only the keys aside are held (the file is
    read again at the end), so memory stays flat.

    A run may start or end while this reads, so the run's file is opened first (a retry writes
    the file aside before the run's file loses a line), and lines aside gone by the end (a run
    put them back, then removed the file) are looked for in the run's file as it is then."""
    aside = retrying_file(path)
    kept = iter(kept)
    first = next(kept, None)  # the run's file open before the file aside is: see above
    waiting = {key(item) for item in _if_there(aside, read, valid)}
    for item in kept if first is None else itertools.chain((first,), kept):
        if waiting:
            waiting.discard(key(item))
        yield item
    if not waiting:
        return
    try:
        yield from _among(valid(aside, read(aside)), key, waiting)
    except FileNotFoundError:  # put back meanwhile: in the run's file now
        yield from _among((item for _, item, _ in read(path) if item is not None), key, waiting)


def _among(items: Iterable[T], key: Callable[[T], tuple[str, int]], waiting: set[tuple[str, int]]) -> Iterator[T]:
    """The first of `items` of each (task id, sample) in `waiting`, each taken out of it."""
    for item in items:
        if key(item) in waiting:
            waiting.discard(key(item))
            yield item


def _if_there(
    file: Path,
    read: Callable[[Path], Iterable[tuple[int, T | None, str]]],
    valid: Callable[[Path, Iterable[tuple[int, T | None, str]]], Iterator[T]],
) -> Iterator[T]:
    """The valid items of `file`, none when it is not there (or goes while it is read)."""
    try:
        yield from valid(file, read(file))
    except FileNotFoundError:
        return


def kept_lines(
    path: str | Path,
    lines: Iterable[tuple[int, T | None, str]],
    on_partial: Callable[[int], None] | None = None,
    *,
    read: Callable[[Path], Iterable[tuple[int, T | None, str]]] | None = None,
    key: Callable[[T], tuple[str, int]] | None = None,
) -> Iterator[T]:
    """The rule every reader of a run's file keeps, over `(line number, value or None when the
    line is invalid, raw line)`: an invalid line is a ValueError unless it is the partial last
    line a killed write leaves (its number goes to `on_partial`), and so is a file with no
    valid line. Given `read` (what gave `lines`, for another file) and `key` (a value's (task
    id, sample)), the earlier lines a killed `--retry-errors` run left in the `retrying_file`
    follow, each whose episode the file has no line of (`_with_retrying`)."""
    partial: int | None = None

    def valid() -> Iterator[T]:
        nonlocal partial
        for lineno, item, line in lines:
            if item is None:
                if line.endswith("\n"):
                    raise ValueError(invalid_line_message(path, lineno, line))
                partial = lineno
                continue
            yield item

    items = valid() if read is None or key is None else _with_retrying(Path(path), valid(), key, _refuse, read)
    seen = False
    for item in items:
        seen = True
        yield item
    if not seen:
        extra = f" (only a partial line {partial}, from a run killed mid-write)" if partial else ""
        raise ValueError(f"{path} holds no trajectories{extra}")
    if partial is not None and on_partial is not None:
        on_partial(partial)
