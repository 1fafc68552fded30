"""A toolenv tool's argument schema as a Python signature and Google-style docstring.

TRL hands an environment's methods to the chat template as tools, and transformers
builds each tool's JSON schema from the method's type hints and docstring
(`transformers.utils.get_json_schema`). So each toolenv tool becomes a method whose
hints and docstring say what its Pydantic `Args` schema says, as far as hints can:
types, lists, enums (`Literal`), unions, optional and nested objects (`dict`). Bounds such as
`maxLength` have no hint; toolenv still checks them on every call.

transformers reads the docstring back with regular expressions that end a section at
`Args:`, `Returns:` or `Raises:` anywhere in the text and parse a trailing `(choices: ...)`
as JSON, so the tool's own descriptions are written so that they are read back whole.
"""

from __future__ import annotations

import inspect
import keyword
import re
from collections.abc import Mapping
from typing import Any, Literal, Optional, Union, cast

from toolenv._tool import Tool

__all__ = ["schema_signature", "tool_signature"]

_SCALARS: dict[str, Any] = {"string": str, "integer": int, "number": float, "boolean": bool}


def _hint(node: dict[str, Any]) -> Any:
    """The type hint for one JSON-schema node (what transformers turns back into that node)."""
    enum = node.get("enum", [node["const"]] if "const" in node else None)  # pydantic writes a 1-value Literal so
    if isinstance(enum, list):
        values = [v for v in enum if v is not None]  # an optional Literal's None is `Optional`, not a choice
        if values and all(isinstance(v, (str, int, float, bool)) for v in values):
            choices = cast(Any, Literal)[tuple(values)]  # hints built at run time, hence the casts
            return cast(Any, Optional)[choices] if len(values) < len(enum) else choices
    kind = node.get("type")
    branches = node.get("anyOf") or node.get("oneOf")
    if kind is None and isinstance(branches, list) and branches:  # a union of types that are not all plain
        nodes = [b for b in branches if isinstance(b, dict)]
        hints = [_hint(b) for b in nodes if b.get("type") != "null"]
        inner = cast(Any, Union)[tuple(hints)] if hints else Any
        return cast(Any, Optional)[inner] if len(hints) < len(nodes) else inner
    if isinstance(kind, list):
        kinds = [k for k in kind if k != "null"]
        if len(kinds) == 1:
            inner = _hint({**node, "type": kinds[0]})
        else:  # transformers writes a union of plain types back as a list of types
            inner = cast(Any, Union)[tuple(_hint({"type": k}) for k in kinds)] if kinds else Any
        return cast(Any, Optional)[inner] if "null" in kind else inner
    if kind in _SCALARS:
        return _SCALARS[kind]
    if kind == "array":  # a bare `list` hint would reach the model as an object: no item type is `list[Any]`
        items = node.get("items")
        return cast(Any, list)[_hint(items) if isinstance(items, dict) and items else Any]
    if kind == "object":
        extra = node.get("additionalProperties")
        return cast(Any, dict)[str, _hint(extra)] if isinstance(extra, dict) and extra.get("type") else dict
    return Any


# What transformers' docstring parser takes for the start of a section, wherever it stands.
_SECTION = re.compile(r"(Args|Returns|Raises):")
# An argument description ending so is read as `(choices: <JSON list>)` and fails if it is not JSON.
_CHOICES = re.compile(r"\(choices:.*\)\s*$", re.IGNORECASE | re.DOTALL)


def _one_line(text: str) -> str:
    """`text` on one line, its section words in lower case so the parser does not cut it there."""
    return _SECTION.sub(lambda m: m.group(1).lower() + ":", " ".join(text.split()))


def _arg_line(text: str) -> str:
    """An argument's description, read back verbatim (no `(choices: ...)` taken as an enum)."""
    text = _one_line(text)
    return text + "." if _CHOICES.search(text) else text


def tool_signature(tool: Tool) -> tuple[inspect.Signature, dict[str, Any], str]:
    """(signature with `self`, annotations, docstring) for a method that stands for `tool`.

    Required arguments have no default; the others default to None, and a call passes on
    only what the model wrote, so the Args model's own defaults apply.
    """
    return schema_signature(tool.flat_schema())


def schema_signature(schema: Mapping[str, Any]) -> tuple[inspect.Signature, dict[str, Any], str]:
    """`tool_signature` for a tool known by its OpenAI function schema alone (`$ref`s inlined, as
    `toolenv._schema.flatten_schema` writes it): a remote env's tools run on its server, and the env
    has only their schemas (`env.tool_schemas()`)."""
    fn = schema.get("function", schema)
    tool_name = str(fn.get("name", ""))
    params = fn.get("parameters") or {}
    props: dict[str, Any] = params.get("properties") or {}
    required = set(params.get("required") or [])
    ordered = [n for n in props if n in required] + [n for n in props if n not in required]
    parameters = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    annotations: dict[str, Any] = {}
    lines = []
    for name in ordered:
        if not name.isidentifier():
            raise ValueError(f"tool {tool_name!r}: argument {name!r} is not a Python identifier, so TRL cannot pass it")
        if keyword.iskeyword(name):
            raise ValueError(
                f"tool {tool_name!r}: argument {name!r} is a Python keyword, so it cannot be a method parameter for TRL"
            )
        hint = _hint(props[name])
        default = inspect.Parameter.empty if name in required else None
        parameters.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=hint))
        annotations[name] = hint
        described = _arg_line(str(props[name].get("description") or props[name].get("title") or ""))
        lines.append(f"    {name}: {described or 'The ' + name.replace('_', ' ') + '.'}")
    annotations["return"] = str
    summary = _one_line(fn.get("description") or "") or f"Call the {tool_name} tool."
    doc = summary + ("\n\nArgs:\n" + "\n".join(lines) if lines else "") + "\n\nReturns:\n    The tool's result."
    return inspect.Signature(parameters, return_annotation=str), annotations, doc
