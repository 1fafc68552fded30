"""The format reward: did the episode follow the action format from start to end?

Rule-based format rewards (Search-R1, ReSearch, ToolRL) score 1 only when every
turn was well formed and the episode ended with an answer; a policy then cannot
earn answer reward through malformed but lucky output.
"""

from __future__ import annotations

import re

from toolenv.episode import Episode, Turn
from toolenv.parsers.reasoning import split_reasoning
from toolenv.rewards.base import Reward, register_reward

__all__ = ["FormatReward", "has_block", "turn_is_well_formed"]


def has_block(text: str, tag: str) -> bool:
    """True when `text` holds a closed, non-empty `<tag>…</tag>` block.

    Plain `str.find` rather than a regex: linear even on huge outputs full of unclosed tags.
    """
    open_tag, close_tag = f"<{tag}>", f"</{tag}>"
    start = text.find(open_tag)
    while start >= 0:
        body = start + len(open_tag)
        end = text.find(close_tag, body)
        if end < 0:
            return False
        if text[body:end].strip():
            return True
        start = text.find(open_tag, end)
    return False


def _reasoning_first(text: str, tag: str) -> bool:
    """True when `text` opens with a non-empty `<tag>` block and acts after it (R1-style, as
    open-r1's `^<think>.*?</think>` and Search-R1's `is_valid_sequence` want), or starts inside
    one the generation prompt opened (Qwen3-thinking, DeepSeek-R1 and GLM templates end the
    prompt with `<think>`; vLLM's reasoning parsers and `split_reasoning` read it so).

    A block after the action or nested in it, nested blocks, and an action inside the
    reasoning (nothing after its close) do not count.
    """
    open_tag, close_tag = f"<{tag}>", f"</{tag}>"
    rest = text.lstrip()
    if rest.startswith(open_tag):
        rest = rest[len(open_tag) :]
    end = rest.find(close_tag)
    if end < 0:
        return False
    reasoning, after = rest[:end], rest[end + len(close_tag) :]
    return bool(reasoning.strip()) and open_tag not in reasoning and bool(after.strip()) and not _tagged(after, tag)


def _tagged(text: str, tag: str) -> bool:
    """True when `text` holds an opening or closing `tag` (a second reasoning block)."""
    return f"<{tag}>" in text or f"</{tag}>" in text


def _only_reasoning(outside: str, tag: str) -> bool:
    """True when a turn's text outside its actions (`ParsedAction.text`) is its reasoning and
    nothing else: R1's format has no free text between, around or after the actions (open-r1's
    `^<think>.*?</think>\\s*<answer>.*?</answer>$`)."""
    return not split_reasoning(outside, f"<{tag}>", f"</{tag}>")[1].strip()


def _answered(answer: str | None) -> bool:
    """A real answer: an empty `<answer></answer>` ends the episode but says nothing."""
    return answer is not None and bool(answer.strip())


def turn_is_well_formed(turn: Turn, think_tag: str | None = None) -> bool:
    """True when the turn parsed without errors, did something (a call or a non-empty answer)
    and, when `think_tag` is given, opens with a non-empty `<think_tag>` block (or inside one
    the generation prompt opened, ending at its `</think_tag>`) and then only acts: no text
    besides its tool calls and answer, and no second reasoning block."""
    parsed = turn.parsed
    if parsed.errors:
        return False
    if parsed.answer is not None and not _answered(parsed.answer):
        return False
    if not parsed.tool_calls and parsed.answer is None:
        return False
    if think_tag is None:
        return True
    return _reasoning_first(turn.action, think_tag) and _only_reasoning(parsed.text, think_tag)


class FormatReward(Reward):
    """1.0 when every turn was well formed (see `turn_is_well_formed`) and the episode
    ended with a non-empty answer, else 0.0.

    Args:
        require_answer: the episode must end with a non-empty answer (not by truncation).
        require_think: every turn must open with a non-empty `<think>…</think>` block and then
            only act (R1-style: tool calls or the answer, no other text, no second block), or
            start inside one that the generation prompt opened and close it with `</think>`.
        think_tag: the tag name of the reasoning block.
        partial: score the fraction of well-formed turns instead of all-or-nothing
            (the answer requirement still gates the score).
        name: the component name.
    """

    def __init__(
        self,
        *,
        require_answer: bool = True,
        require_think: bool = False,
        think_tag: str = "think",
        partial: bool = False,
        name: str = "format",
    ) -> None:
        if not re.fullmatch(r"[A-Za-z_][\w-]*", think_tag):
            raise ValueError(f"think_tag {think_tag!r} is not a valid tag name")
        self.name = name
        self.require_answer = require_answer
        self.partial = partial
        self._think = think_tag if require_think else None

    async def final(self, episode: Episode) -> float:
        if not episode.turns or (self.require_answer and not _answered(episode.answer)):
            return 0.0
        good = sum(turn_is_well_formed(t, self._think) for t in episode.turns)
        if self.partial:
            return good / len(episode.turns)
        return float(good == len(episode.turns))


register_reward("format", FormatReward)
