"""Which of a parser's stop strings a chat model's generation is given, as every reference agent picks them."""

from __future__ import annotations

#: Stop strings that close one call of a format writing several calls a turn, each in its own
#: block (Hermes, Qwen3-Coder: `</tool_call>`), whose chat templates end the turn with an
#: end-of-turn token after the last call. Stopping at one would allow one call a turn.
PER_CALL_STOPS = frozenset({"</tool_call>"})


def chat_stops(stops: tuple[str, ...]) -> tuple[str, ...]:
    """`stops` less those that close one of several calls a turn (`PER_CALL_STOPS`): in a chat,
    the model's end of turn ends the call list. The stops of a format that takes one call a turn
    (Search-R1's tags: the model would write its own results next; Harmony's `<|call|>`) or that
    end a turn's whole call list (DeepSeek's, Kimi's, GLM's...) are kept."""
    return tuple(s for s in stops if s not in PER_CALL_STOPS)
