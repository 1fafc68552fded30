"""Action parsers: model text in, a typed `ParsedAction` out. No input makes them raise."""

from toolenv.parsers.base import ActionParser, get_parser, parser_names
from toolenv.parsers.codeblock import CodeBlockParser
from toolenv.parsers.harmony import HarmonyParser
from toolenv.parsers.hermes import HermesParser
from toolenv.parsers.qwen3_xml import Qwen3XMLParser
from toolenv.parsers.tags import TagParser

__all__ = [
    "ActionParser",
    "CodeBlockParser",
    "HarmonyParser",
    "HermesParser",
    "Qwen3XMLParser",
    "TagParser",
    "get_parser",
    "parser_names",
]
