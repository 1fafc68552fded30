"""Trajectories as chat-format fine-tuning data (SFT cold starts, rejection sampling).

Agentic RL recipes often start from supervised data: roll out a strong model (or an
oracle), keep the episodes that succeeded, and fine-tune on them before RL. This turns
trajectories into the OpenAI chat layout (`{"messages": [...], "tools": [...]}` per line), the
conversational form that TRL's `SFTTrainer` and LLaMA-Factory's OpenAI-style datasets read.

Each turn becomes an assistant message, then the env's answer: a `tool` message per result
that answers a call (with its call id) and one user message for what answers none (parse
errors, "no tool call"), the layout verl's agent loop and the OpenAI agent use.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

from toolenv.trajectory import Trajectory, TurnRecord
from toolenv.types import Message, reply_messages

__all__ = ["ArgumentStyle", "CallStyle", "chat_messages", "export_chat"]

#: `text`: the assistant's content is the action exactly as the model wrote it (train the
#: same model family on its own format). `structured`: calls go into `tool_calls` and the
#: content keeps the rest, so the target model's chat template writes the calls in its own
#: format (train one family on another's rollouts).
CallStyle = Literal["text", "structured"]
#: How a structured call's arguments are written. `json`: a JSON string, as the OpenAI spec
#: has it (and as a `datasets` Arrow column holds any arguments). `object`: the mapping itself,
#: which most Hugging Face chat templates expect (`arguments | tojson` would encode a string twice).
ArgumentStyle = Literal["json", "object"]


def _assistant(turn: TurnRecord, calls: CallStyle, arguments: ArgumentStyle) -> dict[str, Any]:
    parsed = turn.parsed
    if calls == "text" or not parsed.tool_calls:
        return {"role": "assistant", "content": turn.action}
    content = parsed.text
    if parsed.answer is not None:
        content = f"{content}\n<answer>{parsed.answer}</answer>".strip()
    out = Message(role="assistant", content=content, tool_calls=list(parsed.tool_calls)).to_openai()
    if arguments == "object":
        for wire, call in zip(out["tool_calls"], parsed.tool_calls, strict=True):
            wire["function"]["arguments"] = call.arguments
    return out


def _check(calls: str, arguments: str) -> None:
    if calls not in ("text", "structured"):
        raise ValueError(f"calls must be 'text' or 'structured', got {calls!r}")
    if arguments not in ("json", "object"):
        raise ValueError(f"arguments must be 'json' or 'object', got {arguments!r}")


def chat_messages(
    trajectory: Trajectory, *, calls: CallStyle = "text", arguments: ArgumentStyle = "json"
) -> list[dict[str, Any]]:
    """The episode as OpenAI chat messages: the prompt, then each turn and the env's reply.

    The reply to the last turn is left out: the model never saw it, so it is nothing to learn from.
    """
    _check(calls, arguments)
    out = [m.to_openai() for m in trajectory.prompt_messages]
    for i, turn in enumerate(trajectory.turns):
        out.append(_assistant(turn, calls, arguments))
        if i < len(trajectory.turns) - 1:
            out.extend(m.to_openai() for m in reply_messages(turn.results))
    return out


def export_chat(
    trajectories: Iterable[Trajectory],
    path: str | Path,
    *,
    success_only: bool = False,
    min_reward: float | None = None,
    calls: CallStyle = "text",
    arguments: ArgumentStyle = "json",
    tools: list[dict[str, Any]] | None = None,
) -> int:
    """Write one `{"messages": [...]}` line per kept trajectory (errors and empty episodes are
    never kept); returns how many lines were written.

    Args:
        success_only: keep episodes that succeeded (reward at the run's success threshold, no error).
        min_reward: keep episodes whose reward is at least this.
        calls: how assistant tool calls are written (`CallStyle`).
        arguments: how structured calls' arguments are written (`ArgumentStyle`).
        tools: OpenAI function schemas to put on every line as `"tools"` (the env's `tool_schemas()`).
    """
    _check(calls, arguments)
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    written = 0
    tmp = target.with_name(target.name + ".tmp")
    try:
        with tmp.open("w", encoding="utf-8") as fh:
            for t in trajectories:
                if t.error is not None or not t.turns:
                    continue
                if (success_only and not t.success) or (min_reward is not None and t.reward < min_reward):
                    continue
                line: dict[str, Any] = {"messages": chat_messages(t, calls=calls, arguments=arguments)}
                if tools:
                    line["tools"] = tools
                line["metadata"] = {"task_id": t.task.id, "sample": t.sample, "reward": t.reward, "env_id": t.env_id}
                fh.write(json.dumps(line, ensure_ascii=False) + "\n")
                written += 1
        tmp.replace(target)  # whole or not at all: a killed export leaves no half file under the name
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()  # a failed write or rename leaves nothing behind either
        raise
    return written
