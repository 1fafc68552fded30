"""Does an env's parser read tool calls the way the model's chat template writes them?

The commonest silent failure in agentic RL: the env parses one format while the model
(through its chat template, i.e. what it was tuned on) writes another, so every turn is
"malformed", every reward zero, and nothing crashes. The check asks the tokenizer's own
template to write one tool call, then parses that text with the parser: no guessing from
model names or marker strings, so it holds for templates this project has never seen.
"""

from __future__ import annotations

import json
import os
from typing import Any

from toolenv.parsers.base import ActionParser

__all__ = ["template_mismatch"]

_NAME, _ARGS = "lookup", {"query": "paris"}
_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": _NAME,
            "description": "Look a phrase up.",
            "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
        },
    }
]


def _written_call(tokenizer: Any) -> str | None:
    """The text the template adds for an assistant turn holding one tool call, or None when
    the template cannot render tool calls at all (then there is nothing to compare).

    Arguments go in as a dict first (what most templates expect), then as a JSON string
    (DeepSeek's templates concatenate them as text).
    """
    user = [{"role": "user", "content": "Where is Paris?"}]
    try:
        head = tokenizer.apply_chat_template(user, tools=_TOOLS, tokenize=False, add_generation_prompt=True)
    except Exception:  # noqa: BLE001 - a template without tool support (or any template error): no verdict
        return None
    if not isinstance(head, str):
        return None
    for arguments in (dict(_ARGS), json.dumps(_ARGS)):
        call = {"id": "abcdefghi", "type": "function", "function": {"name": _NAME, "arguments": arguments}}
        turn = [*user, {"role": "assistant", "content": "", "tool_calls": [call]}]
        try:
            whole = tokenizer.apply_chat_template(turn, tools=_TOOLS, tokenize=False)
        except Exception:  # noqa: BLE001, S112 - this form of arguments is not the template's: try the next
            continue
        if not isinstance(whole, str):
            continue
        shared = len(os.path.commonprefix([head, whole]))  # noqa: RUF071 - a character prefix is what is wanted
        if _NAME in whole[shared:]:
            return whole[shared:]
    return None


def template_mismatch(parser: ActionParser, tokenizer: Any) -> str | None:
    """None when `parser` reads the tool call `tokenizer`'s chat template writes (or the template
    writes none); otherwise one line saying what the template writes and what to do.

    `tokenizer` is anything with Hugging Face's `apply_chat_template` (verl's tokenizer,
    `AutoTokenizer.from_pretrained(...)`).
    """
    written = _written_call(tokenizer)
    if written is None:
        return None
    if any(c.name == _NAME and c.arguments == _ARGS for c in parser.parse(written).tool_calls):
        return None
    return (
        f"the model's chat template writes a tool call as {written.strip()[:160]!r}, which the env's "
        f"parser {parser.name or type(parser).__name__!r} does not read: the model will be scored on a "
        "format it was not tuned to write. Pick the parser for this model (see docs/parsers.md)."
    )
