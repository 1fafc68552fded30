"""Each parser against the real chat templates of the models it is for.

TRL ships the original chat templates of many model families (it matches them to pick a
response parser); set on the tiny offline tokenizer, each one writes a tool call exactly as
that model was tuned to write it. `template_mismatch` renders one call with the template
and parses it back, so these tests fail if a parser drifts from what the models write.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from toolenv.parsers import detect_parser, get_parser, parser_names, template_mismatch

trl = pytest.importorskip("trl", reason="the real chat templates come with trl (pip install toolenv[trl]); CI has it")

TEMPLATES = Path(trl.__file__).parent / "chat_templates"

#: template file (TRL's name) → the parsers that read the calls it writes.
EXPECTED: dict[str, set[str]] = {
    # Qwen2.5, Qwen3 (Hermes-style JSON in <tool_call>); llama3_json finds the bare JSON object too.
    "qwen2_5": {"hermes", "llama3_json"},
    "qwen3": {"hermes", "llama3_json"},
    "qwen3_instruct_2507": {"hermes", "llama3_json"},
    "qwen3_vl": {"hermes", "llama3_json"},
    # Qwen3.5/3.6/3.8 and NVIDIA Nemotron 3 write Qwen3-Coder's XML parameters.
    "qwen3_5_nothink": {"qwen3_xml"},
    "qwen3_5_think": {"qwen3_xml"},
    "qwen3_6": {"qwen3_xml"},
    "qwen3_8": {"qwen3_xml"},
    "nemotron_3_nano": {"qwen3_xml"},
    "nemotron_3_super": {"qwen3_xml"},
    "nemotron_3_ultra": {"qwen3_xml"},
    "nemotron_3_5_lightning": {"qwen3_xml"},
    # gpt-oss: Harmony, the recipient in the role section (` to=functions.x<|channel|>commentary json`).
    "gptoss": {"harmony"},
    # Llama 3.1 / 3.2: a bare JSON object with "parameters".
    "llama3_1": {"llama3_json"},
    "llama3_2": {"llama3_json"},
    # Liquid LFM2 / LFM2.5: a pythonic list inside <|tool_call_start|> ... <|tool_call_end|>.
    "lfm2_v2": {"pythonic"},
    "lfm2_2_5": {"pythonic"},
    "lfm2_2_5_v2": {"pythonic"},
    "lfm2_2_5_vl": {"pythonic"},
    # GLM-4.5/4.6 (glm4moe): the name on the <tool_call> line, then <arg_key>/<arg_value> pairs.
    "glm4moe": {"glm45"},
    # DeepSeek-V3: the arguments are concatenated as a JSON string, which both layouts read.
    "deepseekv3": {"deepseek_v3", "deepseek_v31"},
    # Gemma 4 and DiffusionGemma: <|tool_call>call:NAME{key:<|"|>text<|"|>}<tool_call|>.
    "gemma4": {"gemma4"},
    "gemma4_v2": {"gemma4"},
    "gemma4_v3": {"gemma4"},
    "gemma4_v4": {"gemma4"},
    "gemma4_v5": {"gemma4"},
    "diffusion_gemma": {"gemma4"},
    # Meta Muse Glimmer: an ATEM block in a message addressed to the tool, after the generation
    # prompt's `<|start|>assistant` (` to=NAME<|message|><atem:function_calls>…`).
    "muse_glimmer": {"muse_glimmer"},
}

#: What `detect_parser` picks where several parsers read a template (else the only reader).
DETECTED = {"qwen2_5": "hermes", "qwen3": "hermes", "qwen3_instruct_2507": "hermes", "qwen3_vl": "hermes"}
DETECTED["deepseekv3"] = "deepseek_v3"  # its own format_call writes the template's layout

#: Templates that cannot render a tool call: the check gives no verdict rather than a false alarm.
NO_TOOL_CALLS = [
    "cohere",
    "cohere2",
    "deepseek_r1_distill",
    "gemma",
    "gemma3",
    "idefics3",
    "lfm2",
    "llama3",
    "llava_next",
    "phi3",
    "phi3_5",
    "qwen2_5_vl",
    "smolvlm",
]


@pytest.fixture(scope="module")
def tok(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from transformers import AutoTokenizer

    from toolenv.integrations.verl.tiny import build_tiny_qwen2

    return AutoTokenizer.from_pretrained(build_tiny_qwen2(tmp_path_factory.mktemp("tok"), with_model=False))


def readers(tok: Any, template: str | None) -> set[str]:
    if template is not None:
        tok.chat_template = (TEMPLATES / f"{template}.jinja").read_text(encoding="utf-8")
    return {name for name in parser_names() if template_mismatch(get_parser(name), tok) is None}


@pytest.mark.parametrize("template", sorted(EXPECTED))
def test_the_model_families_parser_reads_its_real_template(tok: Any, template: str) -> None:
    assert readers(tok, template) == EXPECTED[template]


@pytest.mark.parametrize("template", sorted(t for t in EXPECTED if (TEMPLATES / f"{t}_training.jinja").exists()))
def test_the_training_variant_writes_calls_the_same_way(tok: Any, template: str) -> None:
    # TRL's `*_training` templates add {% generation %} marks for assistant-only loss; the
    # calls a model is trained on must read as the ones it is served with.
    assert readers(tok, f"{template}_training") == EXPECTED[template]


@pytest.mark.parametrize(
    "template",
    [*NO_TOOL_CALLS, *(f"{t}_training" for t in NO_TOOL_CALLS if (TEMPLATES / f"{t}_training.jinja").exists())],
)
def test_templates_without_tool_calls_get_no_verdict(tok: Any, template: str) -> None:
    assert readers(tok, template) == set(parser_names())  # None from every parser: nothing to compare


def test_the_lists_do_not_overlap() -> None:
    assert not set(EXPECTED) & set(NO_TOOL_CALLS)


def unlisted() -> list[str]:
    """Templates of the installed TRL that neither list names (a newer TRL's additions)."""
    listed = set(EXPECTED) | set(NO_TOOL_CALLS)
    return sorted(p.stem for p in TEMPLATES.glob("*.jinja") if p.stem.removesuffix("_training") not in listed)


def test_templates_trl_adds_are_read_by_some_parser(tok: Any) -> None:
    # A template a newer TRL adds is a model family someone may train. Some parser must read
    # its calls (every parser gives no verdict when it writes none): a new format no parser
    # reads fails here. Until it is pinned in EXPECTED or NO_TOOL_CALLS, the run lists it.
    found = {template: readers(tok, template) for template in unlisted()}
    for template, parsers in found.items():
        print(f"TRL template {template!r} is not listed yet; read by {sorted(parsers)}")
    assert [t for t, parsers in found.items() if not parsers] == []


def test_a_mismatch_names_what_the_template_writes(tok: Any) -> None:
    tok.chat_template = (TEMPLATES / "gptoss.jinja").read_text(encoding="utf-8")
    problem = template_mismatch(get_parser("hermes"), tok)
    assert problem is not None and "to=functions.lookup" in problem and "'hermes'" in problem


def test_a_template_that_wants_arguments_as_a_json_string_still_gets_a_verdict(tok: Any) -> None:
    # DeepSeek's templates concatenate the arguments as text: a dict makes them fail, a string works.
    tok.chat_template = (
        "{% for m in messages %}{% if m.tool_calls %}{% for c in m.tool_calls %}"
        '{{ \'<tool_call>{"name": "\' + c.function.name + \'", "arguments": \''
        ' + c.function.arguments + "}</tool_call>" }}'
        "{% endfor %}{% else %}{{ m.role + ': ' + m.content + '\\n' }}{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}assistant: {% endif %}"
    )
    assert template_mismatch(get_parser("hermes"), tok) is None
    assert "does not read" in (template_mismatch(get_parser("pythonic"), tok) or "")


@pytest.mark.parametrize("template", sorted(EXPECTED))
def test_detect_parser_picks_the_families_parser(tok: Any, template: str) -> None:
    tok.chat_template = (TEMPLATES / f"{template}.jinja").read_text(encoding="utf-8")
    want = DETECTED.get(template) or next(iter(EXPECTED[template]))
    assert len(EXPECTED[template]) == 1 or template in DETECTED
    assert detect_parser(tok) == want


@pytest.mark.parametrize("template", NO_TOOL_CALLS)
def test_detect_parser_gives_none_for_templates_without_tool_calls(tok: Any, template: str) -> None:
    tok.chat_template = (TEMPLATES / f"{template}.jinja").read_text(encoding="utf-8")
    assert detect_parser(tok) is None


def test_detect_parser_prefers_the_parser_that_writes_the_templates_layout(tok: Any) -> None:
    # DeepSeek-V3.1's layout (no `function` type, no fence): both DeepSeek parsers read it, the
    # V3.1 one writes it. A V3.1-style template written here (TRL ships none).
    tok.chat_template = (
        "{% for m in messages %}{% if m.tool_calls %}<｜tool▁calls▁begin｜>{% for c in m.tool_calls %}"
        "<｜tool▁call▁begin｜>{{ c.function.name }}<｜tool▁sep｜>{{ c.function.arguments | tojson }}"
        "<｜tool▁call▁end｜>{% endfor %}<｜tool▁calls▁end｜>{% else %}{{ m.content }}{% endif %}{% endfor %}"
    )
    assert readers(tok, None) >= {"deepseek_v3", "deepseek_v31"}
    assert detect_parser(tok) == "deepseek_v31"
    # A mismatch names the parser that reads the template.
    assert "parser='deepseek_v31' reads it" in (template_mismatch(get_parser("hermes"), tok) or "")
