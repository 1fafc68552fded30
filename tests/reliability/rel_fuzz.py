"""A seeded mutation fuzzer for model output, and the invariants every step must keep.

Actions are made cheaply (a `random.Random` over a corpus) so each env sees
thousands of them within seconds: the corpus holds the oracle's valid actions
and near-valid tool calls built from each tool's JSON schema; mutations break
JSON, nest or leave tags open, splice actions together, inject control and
astral characters, and now and then blow a string up to hundreds of kilobytes.
Hypothesis (in the test module) covers a smaller structured part.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from _markers import parser_markers
from pydantic import ValidationError

import toolenv
from toolenv.parsers import CodeBlockParser, HarmonyParser, HermesParser, Qwen3XMLParser, TagParser

FRAGMENTS = [
    "<tool_call>", "</tool_call>", "<answer>", "</answer>", "<search>", "</search>", "<sql>", "</sql>",
    "<python>", "</python>", "<information>", "```python\n", "```py\n", "```", "```output\n",
    "{", "}", "[", "]", '"', "\\", '\\"', ":", ",", "null", "true", "NaN", "Infinity", "-0", "1e999",
    '"name"', '"arguments"', '{"name": "', '", "arguments": {', "}}", "\n", "\r\n", "\t", " ",
    "\x00", "\x1b[2J", "\x7f", "\u200b", "\u202e", "\ufeff", "\ud800", "😀", "𝔘", "é", "中文", "ﷺ",
    "'; DROP TABLE x; --", "SELECT", "import os", "while True: pass", "%s%n", "{question}", "{0}",
    "<|start|>", "<|channel|>", "<|message|>", "<|call|>", "<|end|>", "<|return|>", "<|constrain|>",
    "assistant", "commentary", "final", "analysis", " to=functions.", "to=", "json",
    "<function=", "</function>", "<parameter=", "</parameter>", ">",
    '<|python_tag|>', '{"name": ', '"parameters": ', '; ', '<|eom_id|>', '[f(', 'x=',
    "'''", '<|python_start|>', '<|python_end|>', '[TOOL_CALLS]', '[ARGS]', '[CALL_ID]', '</s>',
]  # fmt: skip
# ... and the markers of every format a parser writes (DeepSeek's, Kimi's, GLM's, Gemma's, ...).
FRAGMENTS += [m for m in parser_markers() if m not in FRAGMENTS]


def format_call(parser: Any, name: str, arguments: Any) -> str:
    """One tool call in the env parser's own syntax."""
    if isinstance(parser, HermesParser):
        return (
            "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False) + "\n</tool_call>"
        )
    if isinstance(parser, TagParser):
        for tag, (tool, arg) in parser.tags.items():
            if tool == name:
                body = arguments.get(arg, "") if isinstance(arguments, dict) else arguments
                return f"<{tag}>{body}</{tag}>"
        return f"<{name}>{json.dumps(arguments)}</{name}>"
    if isinstance(parser, CodeBlockParser):
        body = arguments.get(parser.arg, "") if isinstance(arguments, dict) else arguments
        return f"```python\n{body}\n```"
    if isinstance(parser, Qwen3XMLParser):
        if not isinstance(arguments, dict):
            return f"<tool_call>\n<function={name}>\n{json.dumps(arguments)}\n</function>\n</tool_call>"
        params = "".join(
            f"<parameter={k}>\n{v if isinstance(v, str) else json.dumps(v)}\n</parameter>\n"
            for k, v in arguments.items()
        )
        return f"<tool_call>\n<function={name}>\n{params}</function>\n</tool_call>"
    if isinstance(parser, HarmonyParser):
        body = json.dumps(arguments, ensure_ascii=False)
        return f"<|channel|>commentary to=functions.{name} <|constrain|>json<|message|>{body}<|call|>"
    if isinstance(arguments, dict) and (written := parser.format_call(name, arguments)):
        return str(written)  # any other format: the parser writes its own calls
    return json.dumps({"name": name, "arguments": arguments})


def _sample(prop: dict[str, Any]) -> Any:
    """A valid-looking value for one JSON-schema property."""
    if "enum" in prop:
        return prop["enum"][0]
    if "anyOf" in prop:
        return _sample(prop["anyOf"][0])
    kind = prop.get("type")
    if kind == "integer":
        return int(prop.get("minimum", 1))
    if kind == "number":
        return float(prop.get("minimum", 0.5))
    if kind == "boolean":
        return True
    if kind == "array":
        return [_sample(prop.get("items", {})) for _ in range(int(prop.get("minItems", 1)))]
    if kind == "object":
        return {}
    return "x" * max(1, int(prop.get("minLength", 1)))


def _wrong(prop: dict[str, Any]) -> list[Any]:
    """Values that break one property: wrong types, bounds, lengths, enums."""
    out: list[Any] = [None, {"nested": {"deeper": [1, 2]}}, [], "", -1, 1.5, True, "\x00" * 3, "9" * 5000]
    if "maximum" in prop:
        out.append(prop["maximum"] + 1)
    if "minimum" in prop:
        out.append(prop["minimum"] - 1)
    if "maxLength" in prop:
        out.append("a" * (prop["maxLength"] + 1))
    if "maxItems" in prop:
        out.append([0] * (prop["maxItems"] + 1))
    if "minItems" in prop:
        out.append([0] * max(0, prop["minItems"] - 1))
    if "enum" in prop:
        out.append(str(prop["enum"][0]).upper() + "?")
    if prop.get("type") == "array":
        out += [["a", "b", "c", "d"], [[1], [2], [3], [4]], [float("nan")] * 4]
    return out


def near_valid_calls(env: toolenv.ToolEnv) -> list[str]:
    """Tool calls that are almost right, built from each tool's schema."""
    out: list[str] = []
    for t in env.tools:
        params = t.schema()["function"]["parameters"]
        props: dict[str, Any] = params.get("properties", {})
        required = params.get("required", [])
        valid = {k: _sample(p) for k, p in props.items()}
        out.append(format_call(env.parser, t.name, valid))
        for key, prop in props.items():
            for bad in _wrong(prop):
                out.append(format_call(env.parser, t.name, {**valid, key: bad}))
        for key in required:
            out.append(format_call(env.parser, t.name, {k: v for k, v in valid.items() if k != key}))
        out += [
            format_call(env.parser, t.name, {**valid, "unexpected": 1}),
            format_call(env.parser, t.name.upper(), valid),
            format_call(env.parser, t.name + "_", valid),
            format_call(env.parser, "", valid),
            format_call(env.parser, t.name, []),
            format_call(env.parser, t.name, json.dumps(valid)),  # arguments double-encoded
            format_call(env.parser, t.name, {}),
        ]
        if isinstance(env.parser, HermesParser):
            body = json.dumps({"name": t.name, "arguments": valid})
            out += [
                f"<tool_call>{body}",  # unclosed
                f"<tool_call>{body[:-1]}</tool_call>",  # broken JSON
                f"<tool_call><tool_call>{body}</tool_call></tool_call>",  # nested
                f"<tool_call>{json.dumps([body])}</tool_call>",  # a list, not an object
                f'<tool_call>{{"name": "{t.name}", "arguments": ' + "[" * 5000 + "]" * 5000 + "}</tool_call>",
                "<tool_call>" + '{"a":' * 3000 + "1" + "}" * 3000 + "</tool_call>",
            ]
        if isinstance(env.parser, Qwen3XMLParser):
            key = next(iter(props), "x")
            out += [
                f"<tool_call>\n<function={t.name}>\n<parameter={key}>\n1\n</function>\n</tool_call>",  # unclosed
                f"<tool_call>\n<function={t.name}\n</function>\n</tool_call>",  # header without >
                f"<tool_call>\n<parameter={key}>\n1\n</parameter>\n</tool_call>",  # no function
                f"<tool_call>\n<function={t.name}>\n<parameter={key}>\n1\n</parameter>\n" * 2,  # twice, unclosed
                f"<tool_call>\n<function={t.name}>\n<parameter={key}>\n"
                + "[" * 5000
                + "\n</parameter>\n</function>\n</tool_call>",
            ]
        if isinstance(env.parser, HarmonyParser):
            head = f"<|channel|>commentary to=functions.{t.name}"
            body = json.dumps(valid)
            out += [
                f"{head}<|call|>",  # no <|message|>
                f"{head} <|constrain|>json<|message|>{body[:-1]}<|call|>",  # broken JSON
                f"{head}<|message|>{head}<|message|>{body}<|call|>",  # a header inside the body
                f"<|channel|>commentary to=browser.search<|message|>{body}<|call|>",  # not a function
                f"<|channel|>commentary to=functions.<|message|>{body}<|call|>",  # no name
                f"{head}<|message|>" + "[" * 5000 + "]" * 5000 + "<|call|>",
                f"<|start|>assistant to=functions.{t.name}<|channel|><|message|>{body}",  # empty channel
            ]
    return out


@dataclass
class Mutator:
    """Seeded mutations over a corpus of actions."""

    corpus: Sequence[str]
    rng: random.Random
    huge_every: int = 1000  # one action in this many is blown up to 100 kB-1 MB
    ops: list[Callable[[str], str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.ops = [
            self._delete, self._duplicate, self._insert_fragment, self._insert_char, self._truncate,
            self._splice, self._swap, self._nest, self._case, self._replace_char,
        ]  # fmt: skip

    def __call__(self) -> str:
        r = self.rng
        text = r.choice(self.corpus)
        if r.random() < 0.1:
            return text  # some valid actions keep the episode moving
        for _ in range(r.randint(1, 4)):
            text = r.choice(self.ops)(text)
        if r.randrange(self.huge_every) == 0:
            text = self._huge(text)
        return text

    def _pos(self, text: str) -> int:
        return self.rng.randint(0, len(text))

    def _delete(self, t: str) -> str:
        a = self._pos(t)
        return t[:a] + t[a + self.rng.randint(1, 16) :]

    def _duplicate(self, t: str) -> str:
        a = self._pos(t)
        b = min(len(t), a + self.rng.randint(1, 40))
        return t[:b] + t[a:b] * self.rng.randint(1, 5) + t[b:]

    def _insert_fragment(self, t: str) -> str:
        a = self._pos(t)
        return t[:a] + self.rng.choice(FRAGMENTS) + t[a:]

    def _insert_char(self, t: str) -> str:
        a = self._pos(t)
        low, high = self.rng.choice([(0, 0x1F), (0x80, 0x2FFF), (0x10000, 0x10FFFF)])  # control, BMP, astral
        c = chr(self.rng.randint(low, high))
        return t[:a] + c + t[a:]

    def _truncate(self, t: str) -> str:
        return t[: self._pos(t)]

    def _splice(self, t: str) -> str:
        other = self.rng.choice(self.corpus)
        return t[: self._pos(t)] + other[self.rng.randint(0, len(other)) :]

    def _swap(self, t: str) -> str:
        a, b = sorted((self._pos(t), self._pos(t)))
        return t[b:] + t[a:b] + t[:a]

    def _nest(self, t: str) -> str:
        tag = self.rng.choice(["tool_call", "answer", "search", "sql", "python"])
        depth = self.rng.randint(1, 50)
        close = "" if self.rng.random() < 0.5 else f"</{tag}>" * depth
        return f"<{tag}>" * depth + t + close

    def _case(self, t: str) -> str:
        return t.upper() if self.rng.random() < 0.5 else t.swapcase()

    def _replace_char(self, t: str) -> str:
        if not t:
            return t
        a = self.rng.randrange(len(t))
        return t[:a] + self.rng.choice('{}[]"<>/`\\:,') + t[a + 1 :]

    def _huge(self, t: str) -> str:
        size = self.rng.choice([100_000, 100_000, 300_000, 1_000_000])
        filler = self.rng.choice(["a", "{", "<tool_call>", "😀", "\x00", "<answer>", "```python\n"])
        a = self._pos(t)
        return t[:a] + filler * (size // len(filler)) + t[a:]


def _args_ok(tool: toolenv.Tool, arguments: dict[str, Any]) -> bool:
    """Would the caller accept these arguments? (unknown keys are refused unless extra="allow")."""
    if tool.Args.model_config.get("extra") != "allow":
        allowed = set(tool.Args.model_fields) | {f.alias for f in tool.Args.model_fields.values() if f.alias}
        if set(arguments) - allowed:
            return False
    try:
        tool.Args.model_validate(arguments)
    except (ValidationError, ValueError):
        return False
    return True


@dataclass
class StepStats:
    """What the fuzzer saw, for the report."""

    actions: int = 0
    episodes: int = 0
    malformed: int = 0  # nothing usable parsed, or parse errors, or an invalid call
    invalid_calls: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    max_action_chars: int = 0
    max_obs_chars: int = 0

    def merge(self, other: StepStats) -> None:
        for k, v in vars(other).items():
            setattr(self, k, max(getattr(self, k), v) if k.startswith("max_") else getattr(self, k) + v)


def check_step(env: toolenv.ToolEnv, action: str, out: tuple[Any, ...], stats: StepStats) -> None:
    """Assert the invariants of one step's output; count what happened."""
    obs, reward, terminated, truncated, info = out
    assert isinstance(obs, str)
    assert isinstance(reward, float) and math.isfinite(reward), reward
    assert isinstance(terminated, bool) and isinstance(truncated, bool)
    parsed: toolenv.ParsedAction = info["action"]
    results: list[toolenv.ToolResult] = info["tool_results"]
    tools = {t.name: t for t in env.tools}
    calls = parsed.tool_calls
    assert len(results) >= len(calls), "every call gets a result"
    malformed = bool(parsed.errors)
    for call, result in zip(calls, results, strict=False):
        tool = tools.get(call.name)
        if tool is None or not _args_ok(tool, call.arguments):
            malformed = True
            stats.invalid_calls += 1
            assert result.is_error, f"invalid call {call!r} got a non-error result"
        elif tool.limits.max_output_chars is not None:
            assert len(result.text) <= tool.limits.max_output_chars, "tool output is truncated"
    if parsed.errors:
        assert any(r.is_error and r.name == "parser" for r in results), "parse errors reach the model"
    if not calls and parsed.answer is None:
        malformed = True
        assert any(r.is_error for r in results), "an action with nothing usable gets an error observation"
    if not terminated and any(r.is_error for r in results):
        # Shown to the model: some error's own words are in the observation, not only in `info`.
        shown = [r.text.strip()[:40] for r in results if r.is_error and r.text.strip()]
        forms = {f for s in shown for f in (s, json.dumps(s)[1:-1], json.dumps(s, ensure_ascii=False)[1:-1])}
        assert any(f in obs for f in forms), f"no error reaches the observation: {shown[:3]} / {obs[:300]!r}"
    stats.actions += 1
    stats.malformed += malformed
    stats.tool_calls += len(calls)
    stats.tool_errors += sum(r.is_error for r in results[: len(calls)])
    stats.max_action_chars = max(stats.max_action_chars, len(action))
    stats.max_obs_chars = max(stats.max_obs_chars, len(obs))
