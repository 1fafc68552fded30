"""Does an env's parser read tool calls the way the model's chat template writes them?

The commonest silent failure in agentic RL: the env parses one format while the model
(through its chat template, i.e. what it was tuned on) writes another, so every turn is
"malformed", every reward zero, and nothing crashes. The check asks the tokenizer's own
template to write one tool call, then parses that text with the parser: no guessing from
model names or marker strings, so it holds for templates this project has never seen.
"""

from __future__ import annotations

import itertools
import json
import os
import re
from typing import Any

from toolenv.parsers.base import ActionParser, get_parser, parser_names

__all__ = ["detect_parser", "template_mismatch"]

_NAME, _ARGS = "lookup", {"query": "paris"}
_IDS = ("abcdefghi", f"functions.{_NAME}:0")
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


#: Which parser wins when several read a template's call and none writes it exactly: the
#: formats with their own markers first, `llama3_json` (a bare JSON object, found inside other
#: formats too) and the prompted formats last. Parsers not listed (plugins') come after these.
PREFERENCE = (
    "hermes",
    "qwen3_xml",
    "harmony",
    "glm45",
    "deepseek_v3",
    "deepseek_v31",
    "gemma4",
    "kimi_k2",
    "muse_glimmer",
    "mistral",
    "pythonic",
    "llama3_json",
)
_PROMPTED = ("tags", "codeblock")  # taught by the env's instructions, never a template's format
_SPACE = re.compile(r"\s+")


def _written_call(tokenizer: Any) -> str | None:
    """The text the template adds for an assistant turn holding one tool call, or None when
    the template cannot render tool calls at all (then there is nothing to compare).

    Arguments go in as a dict first (what most templates expect), then as a JSON string
    (DeepSeek's templates concatenate them as text). The call's id is a 9-character one first
    (Mistral's templates refuse others), then Kimi K2's `functions.NAME:0`: Kimi's templates
    write the id as given and no name, so only an id that names the call makes a call.
    """
    user = [{"role": "user", "content": "Where is Paris?"}]
    try:
        head = tokenizer.apply_chat_template(user, tools=_TOOLS, tokenize=False, add_generation_prompt=True)
    except Exception:  # noqa: BLE001 - a template without tool support (or any template error): no verdict
        return None
    if not isinstance(head, str):
        return None
    for call_id, arguments in itertools.product(_IDS, (dict(_ARGS), json.dumps(_ARGS))):
        call = {"id": call_id, "type": "function", "function": {"name": _NAME, "arguments": arguments}}
        turn = [*user, {"role": "assistant", "content": "", "tool_calls": [call]}]
        try:
            whole = tokenizer.apply_chat_template(turn, tools=_TOOLS, tokenize=False)
        except Exception:  # noqa: BLE001, S112 - this id or form of arguments is not the template's: try the next
            continue
        if not isinstance(whole, str):
            continue
        shared = len(os.path.commonprefix([head, whole]))  # noqa: RUF071 - a character prefix is what is wanted
        if _NAME in whole[shared:]:
            return whole[shared:]
    return None


def _reads(parser: ActionParser, written: str) -> bool:
    return any(c.name == _NAME and c.arguments == _ARGS for c in parser.parse(written).tool_calls)


def _readers(written: str) -> list[str]:
    """The registered model formats that read `written`, best first: those whose own
    `format_call` writes the same text (white space aside), then by `PREFERENCE`."""
    names = [n for n in parser_names() if n not in _PROMPTED]
    found: list[tuple[int, int, str]] = []
    for name in names:
        parser = get_parser(name)
        if not _reads(parser, written):
            continue
        own = parser.format_call(_NAME, dict(_ARGS)) or ""
        # The template's text may lack the first characters of the call when the generation
        # prompt ends with them (DeepSeek-V3's `<`), so an exact writer is sought in either form.
        exact = bool(own) and any(_SPACE.sub("", own[k:]) in _SPACE.sub("", written) for k in (0, 1))
        rank = PREFERENCE.index(name) if name in PREFERENCE else len(PREFERENCE)
        found.append((0 if exact else 1, rank, name))
    return [name for *_, name in sorted(found)]


def detect_parser(tokenizer: Any) -> str | None:
    """The name of the parser for the tool calls `tokenizer`'s chat template writes, or None
    when the template writes no tool calls or no registered parser reads them.

    The template writes one call; of the parsers that read it back, the one whose own
    `format_call` writes the same text wins (so DeepSeek-V3's template gets `deepseek_v3`, not
    `deepseek_v31`), then the more specific format (`hermes` over `llama3_json`).
    """
    written = _written_call(tokenizer)
    if written is None:
        return None
    found = _readers(written)
    return found[0] if found else None


def template_mismatch(parser: ActionParser, tokenizer: Any) -> str | None:
    """None when `parser` reads the tool call `tokenizer`'s chat template writes (or the template
    writes none); otherwise one line saying what the template writes and what to do.

    `tokenizer` is anything with Hugging Face's `apply_chat_template` (verl's tokenizer,
    `AutoTokenizer.from_pretrained(...)`).
    """
    written = _written_call(tokenizer)
    if written is None or _reads(parser, written):
        return None
    found = _readers(written)
    pick = f"parser={found[0]!r} reads it" if found else "no built-in parser reads it (see docs/parsers.md)"
    return (
        f"the model's chat template writes a tool call as {written.strip()[:160]!r}, which the env's "
        f"parser {parser.name or type(parser).__name__!r} does not read: the model will be scored on a "
        f"format it was not tuned to write. {pick}."
    )
