"""Action parsers: model text in, a typed `ParsedAction` out. No input makes them raise."""

from toolenv.parsers.base import ActionParser, answer_markup_of, get_parser, parser_names
from toolenv.parsers.codeblock import CodeBlockParser
from toolenv.parsers.deepseek import DeepSeekParser
from toolenv.parsers.gemma4 import Gemma4Parser
from toolenv.parsers.glm45 import Glm45Parser
from toolenv.parsers.harmony import HarmonyParser
from toolenv.parsers.hermes import HermesParser
from toolenv.parsers.kimi_k2 import KimiK2Parser
from toolenv.parsers.llama3_json import Llama3JSONParser
from toolenv.parsers.mistral import MistralParser
from toolenv.parsers.muse_glimmer import MuseGlimmerParser
from toolenv.parsers.pythonic import PythonicParser
from toolenv.parsers.qwen3_xml import Qwen3XMLParser
from toolenv.parsers.reasoning import ReasoningParser
from toolenv.parsers.tags import TagParser
from toolenv.parsers.template_check import detect_parser, template_mismatch

__all__ = [
    "ActionParser",
    "CodeBlockParser",
    "DeepSeekParser",
    "Gemma4Parser",
    "Glm45Parser",
    "HarmonyParser",
    "HermesParser",
    "KimiK2Parser",
    "Llama3JSONParser",
    "MistralParser",
    "MuseGlimmerParser",
    "PythonicParser",
    "Qwen3XMLParser",
    "ReasoningParser",
    "TagParser",
    "answer_markup_of",
    "detect_parser",
    "get_parser",
    "parser_names",
    "template_mismatch",
]
