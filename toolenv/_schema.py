"""OpenAI function schemas from Pydantic models, and a flattened form for strict consumers.

Pydantic's JSON schema uses `$ref`/`$defs` and `anyOf` (for `Optional`). verl 0.9's
`OpenAIFunctionToolSchema` rejects `anyOf` and ignores `$ref`, so `flatten_schema`
inlines references and turns `anyOf` of simple types into a `type` list, keeping
`items`, `enum`, `description` and `default`. No library does this transform.
"""

from __future__ import annotations

import copy
import functools
import urllib.parse
from typing import Any

from pydantic import BaseModel
from pydantic_core import from_json, to_json

__all__ = ["flatten_schema", "inline_refs", "openai_schema", "strip_titles"]


#: Keywords whose values are data, not schemas: a "title" inside them is the data's own.
_VALUE_KEYS = frozenset({"default", "const", "enum", "examples", "example"})
#: Keywords whose values map names to schemas: a property may be named "title".
_NAMED_SCHEMAS = frozenset({"properties", "$defs", "definitions", "patternProperties"})


def strip_titles(node: Any) -> Any:
    """`node` without its `title` keywords (Pydantic's auto-generated ones are noise in a
    prompt), keeping properties named "title" and the keys of values (`default`, `enum`...)."""
    if isinstance(node, list):
        return [strip_titles(n) for n in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for k, v in node.items():
        if k == "title" and isinstance(v, str):
            continue
        if k in _VALUE_KEYS:
            out[k] = v
        elif k in _NAMED_SCHEMAS and isinstance(v, dict):
            out[k] = {name: strip_titles(sub) for name, sub in v.items()}
        else:
            out[k] = strip_titles(v)
    return out


def openai_schema(name: str, description: str, args: type[BaseModel]) -> dict[str, Any]:
    """`{"type": "function", "function": {name, description, parameters}}` for a tool.

    A fresh copy each call (callers may edit it). Pydantic builds a JSON schema in about
    350 µs, and every env renders its tools' schemas into its prompt and the runner hands
    them to the agent every episode, so the schema is built once per Args model.
    """
    return {
        "type": "function",
        "function": {"name": name, "description": description, "parameters": from_json(_parameters(args))},
    }


@functools.lru_cache(maxsize=4096)
def _parameters(args: type[BaseModel]) -> bytes:
    """The parameters schema of `args` as JSON (cached; decoded into a new dict per use)."""
    params = strip_titles(args.model_json_schema())
    params.setdefault("properties", {})
    params.setdefault("required", [])
    params.pop("additionalProperties", None)
    return to_json(params)


def flatten_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """A copy of a function schema with `$ref` inlined and `anyOf` collapsed where possible."""
    out = copy.deepcopy(schema)
    fn = out.get("function", out)
    fn["parameters"] = _flatten(inline_refs(fn.get("parameters", {})), depth=0)
    return out


def _nodes(node: Any) -> list[dict[str, Any]]:
    """Every object inside `node`, `node` first."""
    if isinstance(node, list):
        return [d for v in node for d in _nodes(v)]
    if not isinstance(node, dict):
        return []
    return [node, *(d for v in node.values() for d in _nodes(v))]


def local_ref_target(root: dict[str, Any], fragment: str) -> Any:
    """What the fragment of a local `$ref` (after its `#`) names in `root`: a JSON pointer
    (`/$defs/a~1b`, `""` for the root) or a plain name (the node with that `$anchor`); None
    when it names nothing."""
    if fragment and not fragment.startswith("/"):
        return next((d for d in _nodes(root) if d.get("$anchor") == fragment), None)
    node: Any = root
    for part in fragment.split("/")[1:]:
        key = urllib.parse.unquote(part).replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and key in node:
            node = node[key]
        elif isinstance(node, list) and key.isdigit() and int(key) < len(node):
            node = node[int(key)]
        else:
            return None
    return node


def inline_refs(schema: dict[str, Any]) -> dict[str, Any]:
    """`schema` with every local `$ref` (`#/...`, a JSON pointer into it, or `#name`, a node's
    `$anchor`) replaced by its target.

    Pydantic writes refs into `$defs`; other writers (TypeScript MCP servers) into
    `definitions` or `properties`. A ref inside the expansion of the same ref (a recursive
    model: a tree, a linked list) becomes the target's `type` and `description` only; a ref
    that does not resolve keeps just its siblings. The `$defs` / `definitions` sections go,
    as nothing points into them any more.
    """

    def resolve(ref: str) -> Any:
        return local_ref_target(schema, ref[1:])

    def walk(node: Any, expanding: frozenset[str]) -> Any:
        if isinstance(node, list):
            return [walk(n, expanding) for n in node]
        if not isinstance(node, dict):
            return node
        ref = node.get("$ref")
        if not isinstance(ref, str) or not ref.startswith("#"):
            return {k: walk(v, expanding) for k, v in node.items()}
        siblings = {k: v for k, v in node.items() if k != "$ref"}
        target = resolve(ref)
        if not isinstance(target, dict):
            return walk(siblings, expanding)
        if ref in expanding:  # recursive: stop here
            stub = {k: target[k] for k in ("type", "description") if k in target}
            return {**stub, **walk(siblings, expanding)}
        return walk({**target, **siblings}, expanding | {ref})

    # The definitions are only read through `resolve`: walking them too would expand each one
    # just to throw it away.
    return walk({k: v for k, v in schema.items() if k not in ("$defs", "definitions")}, frozenset())  # type: ignore[no-any-return]


def _flatten(node: Any, depth: int) -> Any:
    if depth > 32:
        raise ValueError("schema nests too deeply")
    if isinstance(node, list):
        return [_flatten(n, depth + 1) for n in node]
    if not isinstance(node, dict):
        return node
    node = {k: _flatten(v, depth + 1) for k, v in node.items()}
    for key in ("anyOf", "oneOf"):
        if key in node:
            variants = node[key]
            types: list[str] = []
            simple = all(isinstance(v, dict) and isinstance(v.get("type"), str) for v in variants)
            non_null = [v for v in variants if v.get("type") != "null"] if simple else []
            if simple and len(non_null) <= 1:
                base = dict(non_null[0]) if non_null else {}
                for v in variants:
                    types.append(v["type"])
                base.pop("type", None)
                node.pop(key)
                node = {**base, **node, "type": types if len(types) > 1 else types[0]}
                if "null" in types:  # the choices of the non-null branch must admit null too
                    if "const" in node:
                        node["enum"] = [node.pop("const")]
                    if "enum" in node and None not in node["enum"]:
                        node["enum"] = [*node["enum"], None]
            elif simple and all(set(v) == {"type"} for v in variants):
                node.pop(key)
                node["type"] = [v["type"] for v in variants]
    if "allOf" in node and len(node["allOf"]) == 1:
        inner = node.pop("allOf")[0]
        node = {**inner, **node}
    return node
