"""A toolenv tool's argument schema as a Python signature and Google-style docstring.

TRL hands an environment's methods to the chat template as tools, and transformers
builds each tool's JSON schema from the method's type hints and docstring
(`transformers.utils.get_json_schema`). So each toolenv tool becomes a method whose
hints and docstring say what its Pydantic `Args` schema says, as far as hints can:
types, lists, enums (`Literal`), optional and nested objects (`dict`). Bounds such as
`maxLength` have no hint; toolenv still checks them on every call.
"""

from __future__ import annotations

import inspect
from typing import Any, Literal, Optional, cast

from toolenv._tool import Tool

__all__ = ["tool_signature"]

_SCALARS: dict[str, Any] = {"string": str, "integer": int, "number": float, "boolean": bool}


def _hint(node: dict[str, Any]) -> Any:
    """The type hint for one JSON-schema node (what transformers turns back into that node)."""
    enum = node.get("enum")
    if isinstance(enum, list) and enum and all(isinstance(v, (str, int, float, bool)) for v in enum):
        return cast(Any, Literal)[tuple(enum)]  # hints built at run time, hence the casts
    kind = node.get("type")
    if isinstance(kind, list):
        kinds = [k for k in kind if k != "null"]
        inner = _hint({**node, "type": kinds[0]}) if len(kinds) == 1 else Any
        return cast(Any, Optional)[inner] if "null" in kind else inner
    if kind in _SCALARS:
        return _SCALARS[kind]
    if kind == "array":
        items = node.get("items")
        return cast(Any, list)[_hint(items)] if isinstance(items, dict) and items else list
    if kind == "object":
        extra = node.get("additionalProperties")
        return cast(Any, dict)[str, _hint(extra)] if isinstance(extra, dict) and extra.get("type") else dict
    return Any


def _one_line(text: str) -> str:
    return " ".join(text.split())


def tool_signature(tool: Tool) -> tuple[inspect.Signature, dict[str, Any], str]:
    """(signature with `self`, annotations, docstring) for a method that stands for `tool`.

    Required arguments have no default; the others default to None, and a call passes on
    only what the model wrote, so the Args model's own defaults apply.
    """
    fn = tool.flat_schema()["function"]
    params = fn.get("parameters") or {}
    props: dict[str, Any] = params.get("properties") or {}
    required = set(params.get("required") or [])
    ordered = [n for n in props if n in required] + [n for n in props if n not in required]
    parameters = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    annotations: dict[str, Any] = {}
    lines = []
    for name in ordered:
        if not name.isidentifier():
            raise ValueError(f"tool {tool.name!r}: argument {name!r} is not a Python identifier, so TRL cannot pass it")
        hint = _hint(props[name])
        default = inspect.Parameter.empty if name in required else None
        parameters.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=hint))
        annotations[name] = hint
        described = _one_line(str(props[name].get("description") or props[name].get("title") or ""))
        lines.append(f"    {name}: {described or 'The ' + name.replace('_', ' ') + '.'}")
    annotations["return"] = str
    summary = _one_line(fn.get("description") or "") or f"Call the {tool.name} tool."
    doc = summary + ("\n\nArgs:\n" + "\n".join(lines) if lines else "") + "\n\nReturns:\n    The tool's result."
    return inspect.Signature(parameters, return_annotation=str), annotations, doc
