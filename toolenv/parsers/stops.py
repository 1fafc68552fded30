"""Which of a parser's stop strings a chat model's generation is given, as every agent picks them.

The reference agents (`toolenv_agents`) and the verl agent loop share this rule, so it lives in
the core, which imports no agent.
"""

from __future__ import annotations

__all__ = ["PER_CALL_STOPS", "chat_stops"]

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
