"""Trajectories as chat-format fine-tuning data (SFT cold starts, rejection sampling).

Agentic RL recipes often start from supervised data: roll out a strong model (or an
oracle), keep the episodes that succeeded, and fine-tune on them before RL. This turns
trajectories into the OpenAI chat layout (`{"messages": [...], "tools": [...]}` per line), the
conversational form that TRL's `SFTTrainer` and LLaMA-Factory's OpenAI-style datasets read.

Each turn becomes an assistant message, then the env's answer as the model read it. A turn
written as text (`calls="text"`, an agent in text mode: the `openai` agent's
`tool_calling="text"` or completions API, a Search-R1 trainer, an oracle or a replay) is
answered by one user message holding the turn's `observation` exactly as the env returned it
(Search-R1's `<information>...</information>`, Hermes's `<tool_response>` blocks): what a
text-mode model reads, and no `tool` message that no assistant `tool_calls` declares, which
is malformed OpenAI chat. A turn of an agent that sends the env's messages instead (the
`openai` agent's native tool calling; the `transformers` agent, whose chat template renders
them), and every turn with `calls="structured"`, whose assistant message declares its calls,
is answered as those messages are: a `tool` message per result that answers a call (with its
call id) and one user message for what answers none (parse errors, "no tool call"), the layout
verl's agent loop and the OpenAI agent's native mode use.

Images never go into a tool message: the OpenAI chat format allows only text there, and
TRL's `prepare_multimodal_messages` neither counts nor fills an image placeholder in one. A
turn of the `openai` agent's native mode is answered as the agent sent it (`move_tool_images`):
the tool messages' text, then a user message per result with images (its images, then
`Images from <tool>:`), then the user message of what answers no call. Other turns' result
images go into one user message after its tool messages (with the observation, in text mode).
In the file,
a trajectory with images takes the layout of TRL's vision-language SFT: every content a list
of parts, a `{"type": "image"}` placeholder where each image stands, and an `images` column
naming the image files (in `images/` beside the file) in order of appearance. A trajectory
without images keeps the plain layout.

With `weights=True` each assistant message carries OpenAI's fine-tuning `"weight"`: 0 on a turn
the env could not use (`trains_on`), 1 on the others.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Literal

from toolenv._outputs import in_system_folder, open_output
from toolenv._text import fix_text
from toolenv.image_store import IMAGES_DIR, ImageStore
from toolenv.trajectory import Trajectory, TurnRecord
from toolenv.types import Message, ToolResult, reply_messages

if TYPE_CHECKING:
    from datasets import Dataset  # type: ignore[import-untyped,unused-ignore]

__all__ = [
    "ArgumentStyle",
    "CallStyle",
    "chat_messages",
    "export_chat",
    "export_tokens",
    "load_chat",
    "move_tool_images",
    "token_rows",
    "trains_on",
]

#: `text`: the assistant's content is the action exactly as the model wrote it (train the
#: same model family on its own format); calls the model gave as the API's `tool_calls` (native
#: tool calling) stay `tool_calls`, as it wrote them; the env's reply to a turn written as text is
#: its observation, as a text-mode model read it. `structured`: calls go into `tool_calls`, answered
#: by `tool` messages, and the content keeps the rest, so the target model's chat template writes the
#: calls in its own format (train one family on another's rollouts).
CallStyle = Literal["text", "structured"]
#: How a structured call's arguments are written. `json`: a JSON string (non-ASCII text as
#: written, not escaped), as the OpenAI spec has it (and as a `datasets` Arrow column holds any
#: arguments). `object`: the mapping itself, which most Hugging Face chat templates expect
#: (`arguments | tojson` would encode a string twice).
ArgumentStyle = Literal["json", "object"]


def _native(turn: TurnRecord) -> bool:
    """Whether the model gave the turn's calls as the API's `tool_calls` (the `openai` agent's
    native mode records how many): its action is then the agent's rendering of them in the env's
    format, not text the model wrote."""
    count = turn.agent_metadata.get("native_tool_calls")
    return isinstance(count, int) and count > 0


#: Agents (their trajectory label) that gave the model the env's messages through a chat template
#: before agents said so in `agent_metadata["replies"]`: trajectories recorded then read as before.
_MESSAGE_AGENTS = frozenset({"transformers"})


def _reads_observation(trajectory: Trajectory, turn: TurnRecord, calls: CallStyle) -> bool:
    """Whether the turn's reply is its observation as one user message (`calls="text"`, an agent in
    text mode) rather than the env's messages. An agent that sends the env's messages says so:
    `agent_metadata["replies"] == "messages"` (the `transformers` agent), or `native_tool_calls`
    recorded, 0 too (the `openai` agent's native mode sends the env's messages even after a turn
    without native calls: a parse error as a user message of the error alone)."""
    meta = turn.agent_metadata
    return (
        calls == "text"
        and "native_tool_calls" not in meta
        and meta.get("replies") != "messages"
        and trajectory.agent not in _MESSAGE_AGENTS
    )


def trains_on(turn: TurnRecord) -> bool:
    """Whether the turn is worth training on: False when the env could not use it, that is
    when its parser reported errors (a malformed call, even beside good ones) or it held
    neither a tool call nor an answer (the env replied that there was no action). A call the
    tool answered with an error (a failing query, an unknown tool) is a turn the env ran: True."""
    parsed = turn.parsed
    return not parsed.errors and (bool(parsed.tool_calls) or parsed.answer is not None)


def _assistant(turn: TurnRecord, calls: CallStyle, arguments: ArgumentStyle, weights: bool) -> dict[str, Any]:
    """The turn as an assistant message, with the thinking a reasoning parser split off (the
    `openai` agent records it as `reasoning`) as `reasoning_content`, where chat templates read it."""
    out = _assistant_message(turn, calls, arguments)
    reasoning = turn.agent_metadata.get("reasoning")
    if isinstance(reasoning, str) and reasoning:
        out["reasoning_content"] = reasoning
    if weights:
        out["weight"] = int(trains_on(turn))
    return out


def _assistant_message(turn: TurnRecord, calls: CallStyle, arguments: ArgumentStyle) -> dict[str, Any]:
    parsed = turn.parsed
    if not parsed.tool_calls or (calls == "text" and not _native(turn)):
        return {"role": "assistant", "content": turn.action}
    content = parsed.text
    if parsed.answer is not None:
        content = f"{content}\n<answer>{parsed.answer}</answer>".strip()
    out = Message(role="assistant", content=content, tool_calls=list(parsed.tool_calls)).to_openai()
    for wire, call in zip(out["tool_calls"], parsed.tool_calls, strict=True):
        # A string keeps text as the model wrote it, not as `\uXXXX`: a template that writes the
        # string as it is (Qwen3's) would train the model to write escapes
        args = call.arguments
        wire["function"]["arguments"] = args if arguments == "object" else json.dumps(args, ensure_ascii=False)
    return out


def _check(calls: str, arguments: str) -> None:
    if calls not in ("text", "structured"):
        raise ValueError(f"calls must be 'text' or 'structured', got {calls!r}")
    if arguments not in ("json", "object"):
        raise ValueError(f"arguments must be 'json' or 'object', got {arguments!r}")


def _reply(results: list[ToolResult]) -> list[Message]:
    """The env's reply to a turn (`reply_messages`) with no image in a tool message: the tool
    messages' images go, in order and before its own, into the user message that follows them
    (one is added when every result answers a call). A native turn of the `openai` agent is
    answered as that agent sent it instead (`move_tool_images`)."""
    out = reply_messages(results)
    moved = [im for m in out if m.role == "tool" for im in m.images]
    if not moved:
        return out
    tools = [Message(role="tool", content=m.content, name=m.name, tool_call_id=m.tool_call_id) for m in out[:-1]]
    last = out[-1]
    if last.role == "user":
        return [*tools, Message(role="user", content=last.content, images=[*moved, *last.images])]
    tools.append(Message(role="tool", content=last.content, name=last.name, tool_call_id=last.tool_call_id))
    return [*tools, Message(role="user", images=moved)]


def move_tool_images(messages: Iterable[Message]) -> list[Message]:
    """`messages` with no image in a tool message, as the `openai` agent's native mode sends them:
    each tool message keeps its text, and its images go, in order, into a user message of their own
    (`Images from <tool>:` after them) once the run of tool messages it is in ends.

    OpenAI's API refuses image parts in a tool message (`Message.to_openai` does too); the messages
    returned all convert. The agent and the SFT export both build a reply with this, so the export
    writes the messages, text parts and order the model read."""
    out: list[Message] = []
    moved: list[Message] = []
    for m in messages:
        if m.role == "tool" and m.images:
            out.append(Message(role="tool", content=m.content, name=m.name, tool_call_id=m.tool_call_id))
            moved.append(Message(role="user", content=f"Images from {m.name or 'the tool'}:", images=list(m.images)))
            continue
        if moved and m.role != "tool":
            out.extend(moved)
            moved = []
        out.append(m)
    out.extend(moved)
    return out


def _sent_natively(turn: TurnRecord) -> bool:
    """Whether the `openai` agent's native mode ran the turn (it records `native_tool_calls`, 0 too):
    its reply is then the env's messages as that agent sent them (`move_tool_images`)."""
    return "native_tool_calls" in turn.agent_metadata


def _observation(turn: TurnRecord) -> Message:
    """The turn's observation as the user message a text-mode model read: the text exactly as the
    env returned it, with the turn's result images in the order `_reply` gives them (as the
    `openai` agent's text mode sends them)."""
    return Message(role="user", content=turn.observation, images=[im for m in _reply(turn.results) for im in m.images])


def _episode(
    trajectory: Trajectory, calls: CallStyle, arguments: ArgumentStyle, weights: bool
) -> list[Message | dict[str, Any]]:
    """The prompt, then each turn (an OpenAI assistant dict) and the env's reply to it, but the last's."""
    out: list[Message | dict[str, Any]] = list(trajectory.prompt_messages)
    for i, turn in enumerate(trajectory.turns):
        out.append(_assistant(turn, calls, arguments, weights))
        if i == len(trajectory.turns) - 1:
            break
        if _reads_observation(trajectory, turn, calls):
            out.append(_observation(turn))
        elif _sent_natively(turn):
            out.extend(move_tool_images(reply_messages(turn.results)))
        else:
            out.extend(_reply(turn.results))
    return out


def chat_messages(
    trajectory: Trajectory, *, calls: CallStyle = "text", arguments: ArgumentStyle = "json", weights: bool = False
) -> list[dict[str, Any]]:
    """The episode as OpenAI chat messages: the prompt, then each turn and the env's reply.

    The reply is what the model read (module docstring): with `calls="text"` a turn of a text-mode
    agent gets its observation as one user message; native tool calls and `calls="structured"`
    get `tool` messages answering the calls by id. The reply to the last turn is left out: the
    model never saw it, so it is nothing to learn from. Images are `image_url` parts (data URLs) of
    user messages; a result's images follow its tool message in a user message (or go with the
    observation), since OpenAI's tool messages hold text only. A turn's thinking
    (`agent_metadata["reasoning"]`) is its message's `reasoning_content`. `weights` puts
    OpenAI's fine-tuning `"weight"` on each assistant message: 0 where `trains_on` says no, else 1.
    """
    _check(calls, arguments)
    return [m.to_openai() if isinstance(m, Message) else m for m in _episode(trajectory, calls, arguments, weights)]


def _parts(text: str, images: int) -> list[dict[str, Any]]:
    """TRL's content parts: a placeholder per image, then the text (none when empty, so that a
    template testing `message.content` sees an assistant turn with only calls as empty)."""
    return [*({"type": "image"} for _ in range(images)), *([{"type": "text", "text": text}] if text else [])]


def _shows_images(trajectory: Trajectory) -> bool:
    """True when the model saw an image: in the prompt or in a reply (the last turn's has none)."""
    return any(m.images for m in trajectory.prompt_messages) or any(
        r.images for turn in trajectory.turns[:-1] for r in turn.results
    )


def _line(
    trajectory: Trajectory, calls: CallStyle, arguments: ArgumentStyle, weights: bool, store: ImageStore
) -> dict[str, Any]:
    """A line's `messages` (and, for a trajectory with images, `images`: files relative to the export)."""
    if not _shows_images(trajectory):
        return {"messages": chat_messages(trajectory, calls=calls, arguments=arguments, weights=weights)}
    messages: list[dict[str, Any]] = []
    files: list[str] = []
    for m in _episode(trajectory, calls, arguments, weights):
        if isinstance(m, Message):
            files.extend(f"{IMAGES_DIR}/{store.put(im.data, im.mime)}" for im in m.images)
            messages.append({**m.to_openai(), "content": _parts(m.content, len(m.images))})
        else:
            messages.append({**m, "content": _parts(m["content"], 0)})
    return {"messages": messages, "images": files}


def _kept(t: Trajectory, success_only: bool, min_reward: float | None, weights: bool) -> bool:
    """Whether the filters keep `t` (errors and empty episodes are never kept, nor, with
    `weights`, one with no turn to train on: every weight 0 is nothing to learn)."""
    if t.error is not None or not t.turns or (weights and not any(trains_on(turn) for turn in t.turns)):
        return False
    # `not >=`: a NaN reward is at least no bound (`nan < bound` is False, which would keep it)
    return not ((success_only and not t.success) or (min_reward is not None and not t.reward >= min_reward))


def _metadata(t: Trajectory) -> dict[str, Any]:
    return {"task_id": t.task.id, "sample": t.sample, "reward": t.reward, "env_id": t.env_id}


class _NoImageFolder(ImageStore):
    """The image store of an export into a device or a descriptor (stdout), which has no folder beside it."""

    def __init__(self, target: Path) -> None:
        super().__init__(target.parent / IMAGES_DIR)
        self.target = target

    def put(self, data: bytes, mime: str) -> str:
        raise ValueError(
            f"a trajectory has images, which go to {IMAGES_DIR}/ beside the output: export to a file, not {self.target}"
        )


def _finite_json(value: Any) -> Any:
    """`value` with each NaN or infinity as null: JSON has no number for them, and a bare `NaN`
    (what `json.dumps` writes) is refused by JSON.parse, serde_json and fine-tuning uploads."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite_json(v) for v in value]
    return value


def _json_line(line: dict[str, Any]) -> str:
    """One line of an export: strict JSON (`_finite_json`), non-ASCII text as written, and U+FFFD
    for a lone surrogate (half an emoji a server cut), as the run's file has it."""
    try:
        text = json.dumps(line, ensure_ascii=False, allow_nan=False)
    except ValueError:  # a non-finite float (a NaN reward): rare, so walked only then
        text = json.dumps(_finite_json(line), ensure_ascii=False, allow_nan=False)
    return fix_text(text)


def _write_lines(
    trajectories: Iterable[Trajectory],
    target: Path,
    keep: Callable[[Trajectory], bool],
    lines: Callable[[Trajectory], list[dict[str, Any]] | None],
) -> int:
    """Write `lines(t)` for each kept trajectory (None: it has none to give) to `target`, whole or
    not at all; returns how many trajectories gave lines.

    A regular file (or a new one) is written beside itself and renamed over, through a symlink
    to the file it points to. Anything else (a FIFO, /dev/null) and a descriptor the shell opened
    (/dev/stdout, /dev/fd/N, even onto a file: `>> all.jsonl`) is written into, as a shell's `>`
    does: renaming over it would replace it with a regular file, or lose what was appended to
    (`toolenv._outputs.open_output`).
    """
    written = 0

    def write(fh: IO[str]) -> None:
        nonlocal written
        for t in trajectories:
            if not keep(t) or (out := lines(t)) is None:
                continue
            fh.writelines(_json_line(line) + "\n" for line in out)
            written += 1

    with open_output(target) as fh:
        write(fh)
    return written


def export_chat(
    trajectories: Iterable[Trajectory],
    path: str | Path,
    *,
    success_only: bool = False,
    min_reward: float | None = None,
    calls: CallStyle = "text",
    arguments: ArgumentStyle = "json",
    tools: list[dict[str, Any]] | None = None,
    weights: bool = False,
) -> int:
    """Write one `{"messages": [...]}` line per kept trajectory (errors and empty episodes are
    never kept); returns how many lines were written.

    A trajectory with images gets TRL's vision layout (content parts with `{"type": "image"}`
    placeholders, an `images` column) and its images as files in `images/` beside `path`,
    named by their hash (read the file with `load_chat`).

    Args:
        success_only: keep episodes that succeeded (reward at the run's success threshold, no error).
        min_reward: keep episodes whose reward is at least this.
        calls: how assistant tool calls, and the env's replies to them, are written (`CallStyle`).
        arguments: how structured calls' arguments are written (`ArgumentStyle`).
        tools: OpenAI function schemas to put on every line as `"tools"` (the env's `tool_schemas()`).
        weights: put OpenAI's fine-tuning `"weight"` on every assistant message, 0 on a turn the
            env could not use (`trains_on`: parse errors, or neither a call nor an answer), else 1;
            an episode with no turn of weight 1 is left out.
    """
    _check(calls, arguments)
    target = Path(path)
    store = _NoImageFolder(target) if in_system_folder(target) else ImageStore(target.parent / IMAGES_DIR)

    def lines(t: Trajectory) -> list[dict[str, Any]]:
        line = _line(t, calls, arguments, weights, store)
        if tools:
            line["tools"] = tools
        line["metadata"] = _metadata(t)
        return [line]

    return _write_lines(trajectories, target, lambda t: _kept(t, success_only, min_reward, weights), lines)


def _finite(logprobs: list[float]) -> list[float | None]:
    """Log-probs as JSON numbers (a non-finite one, which JSON has no number for, as null)."""
    return [lp if math.isfinite(lp) else None for lp in logprobs]


def token_rows(trajectory: Trajectory, *, weights: bool = False) -> list[dict[str, Any]] | None:
    """The trajectory as the exact token ids the model read and wrote, or None when a turn lacks
    `prompt_token_ids` or `token_ids` (the agent did not record them).

    A row is `input_ids`, `assistant_masks` (1 on generated tokens: the loss mask) and `logprobs`
    (per input id, null where not generated; null altogether when a turn of the row has none that
    fit). A turn whose prompt continues the row so far (the previous prompt and completion, then
    the env's reply) extends it; one that does not (a template that re-renders an earlier turn,
    e.g. drops its reasoning) starts a new row, so no row trains on tokens the model never read.
    With `weights`, the mask is 0 on the tokens of a turn the env could not use (`trains_on`).
    """
    if any(t.prompt_token_ids is None or t.token_ids is None for t in trajectory.turns):
        return None
    rows: list[dict[str, Any]] = []
    ids: list[int] = []
    mask: list[int] = []
    logprobs: list[float | None] | None = []
    first = last = 0
    for turn in trajectory.turns:
        prompt, completion = turn.prompt_token_ids or [], turn.token_ids or []
        if not ids or prompt[: len(ids)] != ids:
            if ids:
                rows.append(_token_row(trajectory, ids, mask, logprobs, first, last))
            ids, mask, logprobs, first = [], [], [], turn.index
        last = turn.index
        fresh = prompt[len(ids) :]
        ids += [*fresh, *completion]  # lists of this row only: a new row starts new lists
        mask += [0] * len(fresh) + [int(not weights or trains_on(turn))] * len(completion)
        if logprobs is not None and turn.logprobs is not None and len(turn.logprobs) == len(completion):
            logprobs += [None] * len(fresh) + _finite(turn.logprobs)
        else:
            logprobs = None
    rows.append(_token_row(trajectory, ids, mask, logprobs, first, last))
    return rows


def _token_row(
    t: Trajectory, ids: list[int], mask: list[int], logprobs: list[float | None] | None, first: int, last: int
) -> dict[str, Any]:
    return {
        "input_ids": ids,
        "assistant_masks": mask,
        "logprobs": logprobs,
        "metadata": {**_metadata(t), "turns": [first, last]},
    }


def export_tokens(
    trajectories: Iterable[Trajectory],
    path: str | Path,
    *,
    success_only: bool = False,
    min_reward: float | None = None,
    on_missing: Callable[[Trajectory], None] | None = None,
    weights: bool = False,
) -> int:
    """Write each kept trajectory as exact token ids (`token_rows`), for exact-token SFT (TRL's
    `SFTTrainer` takes `input_ids` with `assistant_masks` as already tokenized) or offline RL.
    Returns how many trajectories were written; one whose agent recorded no token ids is left
    out and given to `on_missing`. Filters as `export_chat`'s; `weights` zeroes the mask on the
    turns `export_chat(weights=True)` gives weight 0 and leaves out a row left with no 1."""

    def rows(t: Trajectory) -> list[dict[str, Any]] | None:
        out = token_rows(t, weights=weights)
        if out is None:
            if on_missing is not None:
                on_missing(t)
            return None
        if weights:  # a row whose every turn weighs 0 has no target: left out
            out = [row for row in out if 1 in row["assistant_masks"]]
        return out or None

    return _write_lines(trajectories, Path(path), lambda t: _kept(t, success_only, min_reward, weights), rows)


def load_chat(path: str | Path) -> Dataset:
    """An export as a `datasets.Dataset` for TRL's `SFTTrainer`, its `images` (when it has any)
    decoded as images: the file names the images relative to itself, which `datasets` alone
    would look for in the working directory. Needs `datasets` (installed with TRL)."""
    from datasets import Image, List, load_dataset  # type: ignore[import-untyped,unused-ignore]

    source = Path(path)
    dataset = load_dataset("json", data_files=str(source), split="train")
    if "images" not in dataset.column_names:
        return dataset
    base = source.resolve().parent

    def resolve(row: dict[str, Any]) -> dict[str, Any]:
        return {"images": [str(base / name) for name in row["images"] or []]}

    return dataset.map(resolve).cast_column("images", List(Image()))
