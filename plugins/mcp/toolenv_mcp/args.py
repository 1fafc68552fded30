"""`Args` models for MCP tools: validation by the server's own JSON schema.

An MCP tool describes its arguments with a JSON schema, not a Pydantic model. Its
`Args` model has one field per schema property, so toolenv's caller reports unknown
argument names exactly as for its own tools ("Expected arguments: a, b"), and
`model_validate` checks the arguments with `jsonschema` (the validator compiled once per
tool), raising Pydantic's `ValidationError` so the model sees the usual message. Invalid
arguments never reach the server.
"""

from __future__ import annotations

import functools
import urllib.parse
from collections.abc import Iterator, Mapping
from typing import Any, ClassVar

import jsonschema  # type: ignore[import-untyped, unused-ignore]  # stubs optional
import referencing
import referencing.exceptions
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, create_model
from pydantic_core import InitErrorDetails, PydanticCustomError
from typing_extensions import Self

__all__ = ["MCPArgs", "accepts_extra_arguments", "args_model", "arguments_of", "resolved"]

_MAX_ERRORS = 5
_MAX_QUOTED = 100  # characters of a refused value an error quotes
_MAX_MESSAGE = 300  # characters of one error's message
_MAX_REF_HOPS = 8
_MAX_SUBSCHEMA_DEPTH = 8  # nesting of combinators read for argument names (a recursive ref loops)


class MCPArgs(BaseModel):
    """Base of every MCP tool's `Args`: the arguments as the model sent them, schema-checked."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=())

    _arguments: dict[str, Any] | None = PrivateAttr(default=None)
    _schema_validator: ClassVar[Any] = None
    _known: ClassVar[frozenset[str] | None] = None  # property names; None: any name is accepted
    _field_of: ClassVar[dict[str, str]] = {}  # property name -> field name, where they differ

    @classmethod
    def model_validate(cls, obj: Any, *args: Any, **kwargs: Any) -> Self:
        """Check `obj` against the tool's JSON schema; raises `ValidationError` listing the problems."""
        if isinstance(obj, cls):
            return obj
        if not isinstance(obj, Mapping):
            raise _invalid(cls, [_custom("arguments must be a JSON object", (), obj)])
        arguments = dict(obj)
        errors = _unencodable(arguments, ())
        if not errors and cls._known is not None:
            errors = [_custom("unknown argument", (k,), v) for k, v in arguments.items() if k not in cls._known]
        if not errors and cls._schema_validator is not None:
            errors = _schema_errors(cls._schema_validator, arguments)
        if errors:
            raise _invalid(cls, errors)
        values = {cls._field_of.get(k, k): v for k, v in arguments.items()}
        out = cls.model_construct(_fields_set=set(values) & set(cls.model_fields), **values)
        out._arguments = arguments
        return out


class _OpenMCPArgs(MCPArgs):
    """For schemas that allow properties they do not name (`additionalProperties`)."""

    model_config = ConfigDict(extra="allow", protected_namespaces=())


def accepts_extra_arguments(schema: Mapping[str, Any]) -> bool:
    """True when the schema explicitly allows arguments it does not name.

    JSON Schema allows them by default, but a model inventing an argument should hear
    about it (as with toolenv's own tools), so only an explicit `additionalProperties`
    (true or a schema) or `patternProperties` opens the model.
    """
    schema = resolved(schema, schema)
    extra = schema.get("additionalProperties")
    return extra is True or isinstance(extra, dict) or bool(schema.get("patternProperties"))


def args_model(tool_name: str, schema: Mapping[str, Any]) -> type[MCPArgs]:
    """The `Args` model of the tool `tool_name` whose input schema is `schema`.

    Raises:
        ValueError: the schema is not a valid JSON schema.
    """
    dialect = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    try:
        dialect.check_schema(schema)
    except jsonschema.SchemaError as exc:
        raise ValueError(f"its input schema is not a valid JSON schema: {exc.message}") from None
    names = _property_names(schema)
    open_ = accepts_extra_arguments(schema)
    fields: dict[str, Any] = {}
    field_of: dict[str, str] = {}
    for prop in names:
        field = _field_name(prop, fields)
        fields[field] = (Any, None) if field == prop else (Any, Field(default=None, alias=prop))
        if field != prop:
            field_of[prop] = field
    base = _OpenMCPArgs if open_ else MCPArgs
    model = create_model(f"{tool_name}_args", __base__=base, **fields)
    model._schema_validator = _lenient(dialect)(schema, registry=referencing.Registry())
    model._known = None if open_ else frozenset(names)
    model._field_of = field_of
    return model


def arguments_of(args: BaseModel) -> dict[str, Any]:
    """The arguments to send: as the model wrote them, or the fields set on a model built directly."""
    raw = args._arguments if isinstance(args, MCPArgs) else None
    if raw is not None:
        return raw
    return args.model_dump(by_alias=True, exclude_unset=True)


def _property_names(schema: Mapping[str, Any]) -> list[str]:
    """The argument names the schema defines: its `properties` and `required`, and those of every subschema
    that applies to the arguments object itself (`allOf` / `anyOf` / `oneOf` branches, at any
    depth; `if` / `then` / `else`; `dependentSchemas`): a schema composed of parts names them there."""
    names: dict[str, None] = {}
    pending: list[tuple[Mapping[str, Any], int]] = [(schema, 0)]
    while pending:
        node, depth = pending.pop(0)
        node = resolved(schema, node)
        props, required = node.get("properties"), node.get("required")
        names.update(dict.fromkeys(props) if isinstance(props, Mapping) else {})
        names.update(dict.fromkeys(r for r in required if isinstance(r, str)) if isinstance(required, list) else {})
        if depth >= _MAX_SUBSCHEMA_DEPTH:
            continue
        parts: list[Any] = []
        for key in ("allOf", "anyOf", "oneOf"):
            found = node.get(key)
            parts += found if isinstance(found, list) else []
        parts += [node.get(key) for key in ("if", "then", "else")]
        for key in ("dependentSchemas", "dependencies"):  # `dependencies`: draft 7's name (values: schemas or lists)
            found = node.get(key)
            parts += list(found.values()) if isinstance(found, Mapping) else []
        pending += [(part, depth + 1) for part in parts if isinstance(part, Mapping)]
    return list(names)


def resolved(schema: Mapping[str, Any], node: Mapping[str, Any]) -> Mapping[str, Any]:
    """`node` (a part of `schema`) with its local `$ref` followed: the target's keys, and its own beside them.

    Pydantic writes the schema of a recursive model as `{"$ref": "#/$defs/Node", "$defs": ...}`:
    its arguments are those of the target. Refs that are not local JSON pointers stay as they are.
    """
    for _ in range(_MAX_REF_HOPS):  # a ref to a ref, ...; a cycle of refs names nothing
        ref = node.get("$ref")
        if not isinstance(ref, str) or not ref.startswith("#"):
            return node
        target: Any = schema
        for part in ref[1:].split("/")[1:]:
            key = urllib.parse.unquote(part).replace("~1", "/").replace("~0", "~")
            target = target.get(key) if isinstance(target, Mapping) else None
        if not isinstance(target, Mapping):
            return node
        node = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
    return node


def _field_name(prop: str, taken: Mapping[str, Any]) -> str:
    """`prop` itself where Pydantic allows it as a field name, else a close variant (with `prop` as alias)."""
    name = prop
    if name.startswith("_") or hasattr(MCPArgs, name) or name == "model_config":
        name = "arg" + name if name.startswith("_") else name + "_"
    while name in taken or hasattr(MCPArgs, name):
        name += "_"
    return name


@functools.cache
def _lenient(dialect: Any) -> Any:
    """`dialect` (a jsonschema validator class) checking nothing behind a `$ref` it cannot resolve.

    The schema comes from the server. jsonschema's default registry fetches an unknown
    `$ref` URL with a blocking `urlopen` at every validation (a GET of the server's choosing,
    on the env's event loop), and a ref to a missing definition raised at every validation,
    refusing every call: so refs resolve within the schema (and the metaschemas) only, and
    what lies behind one that does not is left to the server to check.
    """

    def lenient(check: Any) -> Any:
        def ref(validator: Any, value: Any, instance: Any, schema: Any) -> Iterator[Any]:
            try:
                yield from check(validator, value, instance, schema)
            except referencing.exceptions.Unresolvable:
                return

        return ref

    refs = {k: lenient(v) for k, v in dialect.VALIDATORS.items() if k in ("$ref", "$dynamicRef", "$recursiveRef")}
    return jsonschema.validators.extend(dialect, refs)


def _schema_errors(validator: Any, arguments: dict[str, Any]) -> list[InitErrorDetails]:
    errors: list[InitErrorDetails] = []
    missing: set[tuple[Any, ...]] = set()  # jsonschema reports `required` once per missing name
    for err in validator.iter_errors(arguments):
        path = tuple(err.absolute_path)
        if err.validator == "required" and isinstance(err.instance, dict):
            for name in err.validator_value:
                loc = (*path, name)
                if isinstance(name, str) and name not in err.instance and loc not in missing:
                    missing.add(loc)
                    errors.append({"type": "missing", "loc": loc, "input": err.instance})
        else:
            errors.append(_custom(_short_message(err.message, err.instance), path, err.instance))
    errors.sort(key=lambda e: [str(p) for p in e["loc"]])  # by argument, whatever order jsonschema found them in
    return errors[:_MAX_ERRORS]


def _short_message(message: str, instance: Any) -> str:
    """`message` with the value it quotes cut short, and itself at most `_MAX_MESSAGE` characters.

    jsonschema quotes the refused value whole: a 20 kB argument (a file the model wrote) came
    back in the error, once per problem, filling the model's context with its own text.
    """
    quoted = repr(instance)
    if len(quoted) > _MAX_QUOTED:
        message = message.replace(quoted, _cut(quoted, _MAX_QUOTED))
    return _cut(message, _MAX_MESSAGE)


def _cut(text: str, limit: int) -> str:
    """`text`, or its start and end around an ellipsis when longer than `limit`."""
    if len(text) <= limit:
        return text
    half = (limit - 1) // 2
    return f"{text[:half]}…{text[-half:]}"


def _unencodable(value: Any, loc: tuple[Any, ...]) -> list[InitErrorDetails]:
    """An error for each string (key or value) UTF-8 cannot encode: one holding a lone surrogate.

    JSON lets a model write half of a UTF-16 pair as an escape (`"\\ud83d"`), and Python keeps
    it; sent, it failed the MCP SDK's serialization inside the transport, which killed the
    session (and restarted a shared server under every episode using it).
    """
    if isinstance(value, str):
        if value.isascii():
            return []
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            lone = value[exc.start : exc.end]
            return [_custom(f"{value!r:.200} is not valid Unicode (a lone surrogate, {lone!r})", loc, value)]
        return []
    errors: list[InitErrorDetails] = []
    if isinstance(value, Mapping):
        for key, item in value.items():
            at = (*loc, key.encode("utf-8", "backslashreplace").decode() if isinstance(key, str) else key)
            errors += _unencodable(key, at) + _unencodable(item, at)
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            errors += _unencodable(item, (*loc, index))
    return errors[:_MAX_ERRORS]


def _custom(message: str, loc: tuple[Any, ...], value: Any) -> InitErrorDetails:
    return {"type": PydanticCustomError("mcp_schema", "{message}", {"message": message}), "loc": loc, "input": value}


def _invalid(model: type[BaseModel], errors: list[InitErrorDetails]) -> ValidationError:
    return ValidationError.from_exception_data(model.__name__, errors)
