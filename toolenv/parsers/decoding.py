"""Token ids of a model's reply to the text a parser reads, whatever the tokenizer made special.

A trainer decodes a reply with `skip_special_tokens=True` so that control tokens (`<|im_end|>`,
padding) stay out of the text. That loses every call when the tokenizer has made the format's
own markers special tokens: Qwen's tokenizers mark `<tool_call>` as an ordinary added token, but
some fine-tunes (Hermes-style tokenizers, custom agent models) mark it special, and then the env
sees no call at all, every turn, with nothing failing. vLLM's hermes tool parser keeps special
tokens for the same reason.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Sequence
from typing import Any

from toolenv.parsers.base import ActionParser

__all__ = ["reply_text", "special_token_texts"]

_SPECIALS: weakref.WeakKeyDictionary[Any, frozenset[str]] = weakref.WeakKeyDictionary()


def special_token_texts(tokenizer: Any) -> frozenset[str]:
    """The texts of `tokenizer`'s special tokens (its named ones and added tokens marked special)."""
    try:
        return _SPECIALS[tokenizer]
    except (KeyError, TypeError):
        pass
    texts = set(getattr(tokenizer, "all_special_tokens", None) or ())
    added = getattr(tokenizer, "added_tokens_decoder", None) or {}
    texts |= {str(getattr(t, "content", t)) for t in added.values() if getattr(t, "special", False)}
    found = frozenset(texts)
    with contextlib.suppress(TypeError):  # not weak-referenceable: computed again next time
        _SPECIALS[tokenizer] = found
    return found


def reply_text(parser: ActionParser, tokenizer: Any, ids: Sequence[int]) -> str:
    """The reply as `parser` must read it.

    A format written in special tokens (`parser.special_tokens`: Harmony...) keeps them all. A
    format whose markers (its `stop` strings and `markers`) this tokenizer made special keeps
    special tokens too, except those that end the reply (EOS, end of turn), which are not part
    of what the model wrote. Otherwise special tokens are skipped.
    """
    if parser.special_tokens:
        return str(tokenizer.decode(list(ids), skip_special_tokens=False))
    specials = special_token_texts(tokenizer)
    if not any(s in specials for s in (*parser.stop, *parser.markers)):
        return str(tokenizer.decode(list(ids), skip_special_tokens=True))
    end = len(ids)
    while (
        end and (token := tokenizer.convert_ids_to_tokens(int(ids[end - 1]))) in specials and token not in parser.stop
    ):
        end -= 1
    return str(tokenizer.decode(list(ids[:end]), skip_special_tokens=False))
