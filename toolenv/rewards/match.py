"""Answer matching: exact match and token F1 with SQuAD normalisation (what Search-R1 scores)."""

from __future__ import annotations

import re
import string
import unicodedata
from collections import Counter

from toolenv.episode import Episode
from toolenv.rewards.base import Reward, register_reward

__all__ = ["ExactMatch", "TokenF1", "exact_match", "normalize_answer", "token_f1"]

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = str.maketrans("", "", string.punctuation)


def normalize_answer(text: str) -> str:
    """Lower-case, drop punctuation and articles, collapse whitespace (SQuAD v1.1)."""
    return " ".join(_ARTICLES.sub(" ", text.lower().translate(_PUNCT)).split())


def _keep_articles(text: str) -> str:
    return " ".join(text.lower().translate(_PUNCT).split())


def _normalized(prediction: str, gold: str) -> tuple[str, str]:
    """Both sides normalised as SQuAD does, unless the gold normalises to nothing: a gold that
    is only an article ("A" of a multiple choice) then became "", which every empty answer (or
    "the", or "?") equalled, and which F1 scored 0 even against itself. Such a gold and its
    prediction keep their articles, and a gold of punctuation alone keeps its punctuation. A
    blank gold (a dataset's missing answer) stays "", which nothing matches.

    Both sides are first composed (NFC): a decomposed "é" (e and a combining accent, as macOS
    files hold it) is the same text as a composed one, and its "e" no word boundary of its own.
    """
    prediction, gold = unicodedata.normalize("NFC", prediction), unicodedata.normalize("NFC", gold)
    for norm in (normalize_answer, _keep_articles):
        g = norm(gold)
        if g:
            return norm(prediction), g
    return " ".join(prediction.lower().split()), " ".join(gold.lower().split())


def exact_match(prediction: str, gold: str) -> float:
    """1.0 when the normalised strings are equal (see `_normalized` for a gold that normalises
    to nothing); a blank gold is matched by nothing."""
    p, g = _normalized(prediction, gold)
    return float(bool(g) and p == g)


def token_f1(prediction: str, gold: str) -> float:
    """Token-level F1 between normalised strings (yes/no/noanswer must match exactly)."""
    p, g = _normalized(prediction, gold)
    if p in {"yes", "no", "noanswer"} or g in {"yes", "no", "noanswer"}:
        return float(p == g)
    ptoks, gtoks = p.split(), g.split()
    common = sum((Counter(ptoks) & Counter(gtoks)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(ptoks), common / len(gtoks)
    return 2 * precision * recall / (precision + recall)


class ExactMatch(Reward):
    """1.0 when the final answer matches any gold answer after normalisation."""

    name = "exact_match"

    async def final(self, episode: Episode) -> float:
        if episode.answer is None:
            return 0.0
        return max((exact_match(episode.answer, g) for g in episode.task.answers), default=0.0)


class TokenF1(Reward):
    """The best token F1 of the final answer against the gold answers."""

    name = "f1"

    async def final(self, episode: Episode) -> float:
        if episode.answer is None:
            return 0.0
        return max((token_f1(episode.answer, g) for g in episode.task.answers), default=0.0)


register_reward("exact_match", ExactMatch)
register_reward("em", ExactMatch)
register_reward("f1", TokenF1)
