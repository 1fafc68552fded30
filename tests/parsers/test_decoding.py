"""`reply_text`: a reply's token ids as the env's parser must read them, whatever the tokenizer
made special (a real `transformers` tokenizer, built offline)."""

from __future__ import annotations

from typing import Any

import pytest

from toolenv.parsers import get_parser
from toolenv.parsers.decoding import reply_text, special_token_texts

CALL = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'


def _tokenizer(special_markers: bool, marker_texts: tuple[str, ...] = ("<tool_call>", "</tool_call>")) -> Any:
    """A byte-level BPE tokenizer with Qwen's control tokens; the call markers are added as
    special tokens (as some fine-tunes do) or as ordinary added tokens (as Qwen's tokenizers do)."""
    pytest.importorskip("tokenizers", reason="needs the tokenizers package")
    transformers = pytest.importorskip("transformers", reason="needs the transformers package")
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator([CALL, "The answer is 5."], trainer)
    markers = [AddedToken(m, special=special_markers, normalized=False) for m in marker_texts]
    if special_markers:
        tok.add_special_tokens(markers)
    else:
        tok.add_tokens(markers)
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>")


@pytest.mark.parametrize("special_markers", [True, False], ids=["markers-special", "markers-plain"])
def test_a_call_survives_decoding_whatever_the_tokenizer_made_special(special_markers: bool) -> None:
    tokenizer = _tokenizer(special_markers)
    assert ("</tool_call>" in special_token_texts(tokenizer)) is special_markers
    ids = [*tokenizer.encode("Let me add. " + CALL, add_special_tokens=False), tokenizer.eos_token_id]
    hermes = get_parser("hermes")
    text = reply_text(hermes, tokenizer, ids)
    assert text == "Let me add. " + CALL  # the markers kept, the closing EOS not
    action = hermes.parse(text)
    assert [(c.name, c.arguments) for c in action.tool_calls] == [("add", {"a": 2, "b": 3})] and not action.errors
    # What skipping special tokens leaves of it: no call for the env to find.
    if special_markers:
        assert hermes.parse(tokenizer.decode(ids, skip_special_tokens=True)).tool_calls == []


def test_other_formats_and_control_tokens_are_decoded_as_before() -> None:
    tokenizer = _tokenizer(special_markers=True)
    ids = tokenizer.encode("The answer is 5.", add_special_tokens=False)
    eos = tokenizer.eos_token_id
    # A format whose markers are not special here: special tokens are skipped, wherever they are.
    tags = get_parser("tags")
    assert reply_text(tags, tokenizer, [*ids, eos]) == "The answer is 5."
    # A format written in special tokens keeps them all, the closing one included (it reads them).
    harmony = get_parser("harmony")
    assert reply_text(harmony, tokenizer, [*ids, eos]) == "The answer is 5.<|im_end|>"
    # A reply that stops at its marker (the stop string) keeps it at the end.
    hermes = get_parser("hermes")
    call_ids = tokenizer.encode(CALL, add_special_tokens=False)
    assert reply_text(hermes, tokenizer, call_ids) == CALL
    assert reply_text(hermes, tokenizer, []) == ""


def test_an_lfm2_call_followed_by_text_survives_decoding() -> None:
    # Liquid's LFM2 tokenizers make `<|tool_call_start|>`/`<|tool_call_end|>` special tokens, and
    # the model writes a sentence after the block (its model card's example; vLLM's `lfm2` parser
    # reads it). Skipping special tokens leaves `[add(a=2, b=3)]Adding them.`, which the
    # pythonic format reads as a list followed by text: an error, the call lost.
    tokenizer = _tokenizer(True, ("<|tool_call_start|>", "<|tool_call_end|>"))
    reply = "<|tool_call_start|>[add(a=2, b=3)]<|tool_call_end|>Adding them."
    ids = [*tokenizer.encode(reply, add_special_tokens=False), tokenizer.eos_token_id]
    pythonic = get_parser("pythonic")
    text = reply_text(pythonic, tokenizer, ids)
    assert text == reply
    action = pythonic.parse(text)
    assert [(c.name, c.arguments) for c in action.tool_calls] == [("add", {"a": 2, "b": 3})]
    assert action.errors == [] and action.text == "Adding them."
    # The wrapped parser decodes the same way.
    assert reply_text(get_parser("pythonic", reasoning=True), tokenizer, ids) == reply


def test_reasoning_tags_a_tokenizer_made_special_survive_decoding() -> None:
    # A tokenizer that made `<think>`/`</think>` special tokens: skipping them would leave the
    # reasoning wrapper no tag to find, and a call the model only drafted while thinking would run
    # (and a drafted answer end the episode). The wrapper's tags are markers it needs to read a turn.
    tokenizer = _tokenizer(True, ("<think>", "</think>"))
    reply = f"<think>Maybe {CALL}</think>The answer is 5."
    ids = [*tokenizer.encode(reply, add_special_tokens=False), tokenizer.eos_token_id]
    parser = get_parser("hermes", reasoning=True)
    text = reply_text(parser, tokenizer, ids)
    assert text == reply
    action = parser.parse(text)
    assert action.tool_calls == [] and action.errors == []
    # Without the wrapper, the tags mean nothing to the format: special tokens are skipped as before.
    assert reply_text(get_parser("hermes"), tokenizer, ids) == f"Maybe {CALL}The answer is 5."
