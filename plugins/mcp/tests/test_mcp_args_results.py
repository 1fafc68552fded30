"""The two pure halves of an MCP tool: JSON-schema `Args` models and `CallToolResult` conversion."""

from __future__ import annotations

import base64
import io
from typing import Any

import pytest
from pydantic import ValidationError

from toolenv import Task, ToolCall, ToolCaller, ToolContext, ToolResult
from toolenv_mcp import results
from toolenv_mcp.args import args_model, arguments_of

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "query": {"type": "string"},
        "limit": {"type": "integer", "minimum": 1},
        "filters": {"type": "object", "properties": {"year": {"type": "integer"}}},
    },
    "required": ["query"],
}


def errors(model: Any, arguments: Any) -> list[tuple[tuple[Any, ...], str]]:
    with pytest.raises(ValidationError) as info:
        model.model_validate(arguments)
    return [(e["loc"], e["msg"]) for e in info.value.errors()]


def test_arguments_are_checked_against_the_json_schema() -> None:
    model = args_model("search", SCHEMA)
    assert list(model.model_fields) == ["query", "limit", "filters"]
    args = model.model_validate({"query": "q", "filters": {"year": 2020}})
    assert arguments_of(args) == {"query": "q", "filters": {"year": 2020}}  # as sent: no defaults added
    assert args.query == "q" and args.limit is None  # type: ignore[attr-defined]
    assert errors(model, {"limit": 0}) == [
        (("limit",), "0 is less than the minimum of 1"),
        (("query",), "Field required"),
    ]
    assert errors(model, {"query": 3}) == [(("query",), "3 is not of type 'string'")]
    assert errors(model, {"query": "q", "filters": {"year": "x"}}) == [
        (("filters", "year"), "'x' is not of type 'integer'")
    ]
    assert errors(model, {"query": "q", "page": 2}) == [(("page",), "unknown argument")]
    assert errors(model, ["q"]) == [((), "arguments must be a JSON object")]


def test_extra_arguments_only_when_the_schema_says_so() -> None:
    open_schema = {**SCHEMA, "additionalProperties": True}
    model = args_model("search", open_schema)
    assert arguments_of(model.model_validate({"query": "q", "page": 2})) == {"query": "q", "page": 2}
    closed = args_model("search", {**SCHEMA, "additionalProperties": {"type": "integer"}})
    assert errors(closed, {"query": "q", "page": "x"}) == [(("page",), "'x' is not of type 'integer'")]


def test_awkward_property_names_keep_their_names_on_the_wire() -> None:
    schema = {
        "type": "object",
        "properties": {n: {"type": "integer"} for n in ("json", "model_config", "_hidden", "file-path", "class")},
    }
    model = args_model("odd", schema)
    sent = {"json": 1, "model_config": 2, "_hidden": 3, "file-path": 4, "class": 5}
    assert arguments_of(model.model_validate(sent)) == sent
    assert errors(model, {"json": "x"}) == [(("json",), "'x' is not of type 'integer'")]


def test_an_error_does_not_echo_a_long_argument_back() -> None:
    # jsonschema's messages quote the value they refuse: a 20 kB `content` (a file the model wrote)
    # came back whole in the error, once per problem, filling the model's context with its own text.
    schema = {
        "type": "object",
        "properties": {"content": {"type": "string"}, "path": {"type": "string"}, "mode": {"enum": ["w", "a"]}},
        "oneOf": [{"required": ["content"]}, {"required": ["path"]}],
    }
    model = args_model("write", schema)
    found = errors(model, {"content": "x" * 20_000, "path": "p", "mode": "y" * 5_000})
    assert [loc for loc, _ in found] == [(), ("mode",)]
    for _, message in found:
        assert len(message) < 400, len(message)
    assert found[1][1].endswith("is not one of ['w', 'a']")
    assert "is valid under each of" in found[0][1]
    short = errors(model, {"content": "x" * 50, "path": "p"})[0][1]
    assert "'x" + "x" * 49 + "'" in short  # a short value is quoted whole


def test_an_invalid_schema_is_refused() -> None:
    with pytest.raises(ValueError, match="not a valid JSON schema"):
        args_model("bad", {"type": "object", "properties": {"a": {"type": "no-such-type"}}})


async def test_the_caller_reports_bad_arguments_as_for_its_own_tools() -> None:
    from toolenv import Tool

    class Fake(Tool):
        name = "search"
        Args = args_model("search", SCHEMA)

        async def run(self, args: Any, ctx: ToolContext) -> ToolResult:
            return ToolResult(text=repr(arguments_of(args)))

    caller = ToolCaller([Fake()])
    ctx = ToolContext(Task())
    calls = [
        ToolCall(name="search", arguments={"query": "q", "limit": 2}),
        ToolCall(name="search", arguments={"query": "q", "pages": 2}),
        ToolCall(name="search", arguments={"limit": "2"}),
    ]
    out, _ = await caller.invoke(calls, ctx)
    assert out[0].text == "{'query': 'q', 'limit': 2}" and not out[0].is_error
    assert out[1].is_error and out[1].text == (
        "Invalid arguments for tool 'search': unknown argument(s) 'pages'. Expected arguments: query, limit, filters."
    )
    assert out[2].is_error and out[2].text == (
        "Invalid arguments for tool 'search': limit: '2' is not of type 'integer'; query: Field required. "
        "Expected arguments: query, limit, filters."
    )


def png(width: int, height: int) -> str:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (width, height), "red").save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode()


def convert(result: dict[str, Any]) -> ToolResult:
    return results.to_tool_result(result, tool="t", server="srv")


def test_text_images_resources_and_links() -> None:
    pytest.importorskip("PIL")
    out = convert(
        {
            "content": [
                {"type": "text", "text": "first"},
                {"type": "image", "data": png(4, 2), "mimeType": "image/png"},
                {"type": "resource", "resource": {"uri": "file:///a.txt", "mimeType": "text/plain", "text": "body"}},
                {"type": "resource", "resource": {"uri": "file:///b.png", "mimeType": "image/png", "blob": png(1, 1)}},
                {"type": "resource", "resource": {"uri": "file:///c.bin", "blob": "AAAA"}},
                {"type": "resource_link", "uri": "file:///d.csv", "name": "d.csv"},
                {"type": "audio", "data": "AAAA", "mimeType": "audio/wav"},
                {"type": "hologram"},
            ]
        }
    )
    assert out.text.split("\n") == [
        "first",
        "body",
        "[resource file:///c.bin (binary) omitted: toolenv passes text and images]",
        "[resource link: file:///d.csv (d.csv)]",
        "[audio/wav audio omitted: toolenv passes text and images]",
        "[content of type 'hologram' omitted]",
    ]
    assert [(im.width, im.height, im.mime) for im in out.images] == [(4, 2, "image/png"), (1, 1, "image/png")]
    assert not out.is_error and out.metadata == {"mcp_server": "srv", "mcp_tool": "t"}


def test_images_without_pillow_become_a_note(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(results, "_pillow", lambda: None)
    out = convert({"content": [{"type": "image", "data": base64.b64encode(b"\x89PNG...").decode()}]})
    assert out.images == []
    assert out.text == "[image/png image of 7 bytes omitted: install toolenv-mcp[images] (Pillow) to receive images]"


def test_undecodable_images_become_a_note() -> None:
    pytest.importorskip("PIL")
    assert convert({"content": [{"type": "image", "data": "not base64!", "mimeType": "image/png"}]}).text == (
        "[image/png image omitted: its data is not valid base64]"
    )
    junk = base64.b64encode(b"not an image").decode()
    assert convert({"content": [{"type": "image", "data": junk, "mimeType": "image/jpeg"}]}).text == (
        "[image/jpeg image of 12 bytes omitted: it could not be decoded]"
    )


def encoded(image: Any, fmt: str) -> str:
    buf = io.BytesIO()
    image.save(buf, format=fmt)
    return base64.b64encode(buf.getvalue()).decode()


def test_an_image_is_labelled_by_its_bytes_and_sent_in_a_format_models_take() -> None:
    # The server's `mimeType` was passed on as it was: JPEG bytes labelled image/png went to the
    # model as a PNG data URL (which APIs checking the type refuse), and a TIFF or BMP, which
    # chat APIs and VLM processors do not take, was passed on as image/tiff.
    pil = pytest.importorskip("PIL.Image")
    red = pil.new("RGB", (5, 3), "red")
    blocks = [
        {"type": "image", "data": encoded(red, "JPEG"), "mimeType": "image/png"},
        {"type": "image", "data": encoded(red, "PNG"), "mimeType": "image/jpeg"},
        {"type": "image", "data": encoded(red, "TIFF"), "mimeType": "image/tiff"},
        {"type": "image", "data": encoded(pil.new("RGBA", (4, 2), (0, 0, 255, 9)), "TIFF"), "mimeType": "image/tiff"},
        {"type": "image", "data": encoded(red, "BMP"), "mimeType": "image/bmp"},
        {
            "type": "resource",
            "resource": {"uri": "file:///x.tif", "mimeType": "image/tiff", "blob": encoded(red, "TIFF")},
        },
        {"type": "image", "data": encoded(red, "WEBP"), "mimeType": "image/webp"},
    ]
    phone = io.BytesIO()  # a phone's JPEG with a second picture in it: Pillow names it MPO
    red.save(phone, format="MPO", save_all=True, append_images=[red])
    blocks.append({"type": "image", "data": base64.b64encode(phone.getvalue()).decode(), "mimeType": "image/jpeg"})
    out = convert({"content": blocks})
    assert [im.mime for im in out.images] == ["image/jpeg", "image/png", *["image/png"] * 4, "image/webp", "image/jpeg"]
    assert out.images[-1].data == phone.getvalue()  # a JPEG as it is, not made a PNG
    for im in out.images[:-1]:
        decoded = im.to_pil()
        assert im.mime == f"image/{decoded.format.lower()}" and decoded.size == (im.width, im.height)
    assert out.images[2].to_pil().convert("RGB").getpixel((0, 0)) == (255, 0, 0)  # the pixels kept
    assert out.images[3].to_pil().mode == "RGBA"  # and the transparency
    assert out.text == ""


def test_structured_content_and_errors() -> None:
    out = convert({"content": [], "structuredContent": {"b": [1, 2], "a": "é"}})
    assert out.text == '{"b": [1, 2], "a": "é"}' and out.metadata["structured_content"] == {"b": [1, 2], "a": "é"}
    both = convert({"content": [{"type": "text", "text": "3"}], "structuredContent": {"result": 3}})
    assert both.text == "3" and both.metadata["structured_content"] == {"result": 3}
    failed = convert({"content": [{"type": "text", "text": "no such city"}], "isError": True})
    assert failed.is_error and failed.text == "no such city" and not failed.retryable
    silent = convert({"content": [], "isError": True})
    assert silent.is_error and silent.text == "Tool 't' failed (MCP server 'srv' gave no message)."
    assert convert({"content": []}).text == ""


def flat_parameters(schema: dict[str, Any]) -> dict[str, Any]:
    from toolenv_mcp import MCPServer, MCPTool

    tool = MCPTool(MCPServer(name="s", command="python"), {"name": "t", "inputSchema": schema})
    params: dict[str, Any] = tool.flat_schema()["function"]["parameters"]
    return params


def test_flat_schema_inlines_every_local_ref() -> None:
    point = {"type": "object", "properties": {"x": {"type": "number"}}, "required": ["x"]}
    draft7 = {  # as TypeScript servers (zod-to-json-schema) write them
        "$schema": "http://json-schema.org/draft-07/schema#",
        "type": "object",
        "definitions": {"Point": point},
        "properties": {"a": {"$ref": "#/definitions/Point"}, "b": {"$ref": "#/properties/a", "description": "end"}},
    }
    params = flat_parameters(draft7)
    assert params["properties"] == {"a": point, "b": {**point, "description": "end"}}
    assert "definitions" not in params
    escaped = {"type": "object", "$defs": {"a/b": {"type": "string"}}, "properties": {"p": {"$ref": "#/$defs/a~1b"}}}
    assert flat_parameters(escaped)["properties"] == {"p": {"type": "string"}}
    # A plain-name fragment names an `$anchor` (draft 2019-09 on): it was read as the root schema.
    anchored = {
        "type": "object",
        "$defs": {"Point": {"$anchor": "point", "type": "object", "properties": {"x": {"type": "number"}}}},
        "properties": {"p": {"$ref": "#point"}},
    }
    p = flat_parameters(anchored)["properties"]["p"]
    assert p["properties"] == {"x": {"type": "number"}} and p["type"] == "object"


def test_flat_schema_of_a_recursive_schema_stops_at_the_recursion() -> None:
    node = {
        "type": "object",
        "description": "A tree node.",
        "properties": {"value": {"type": "integer"}, "children": {"type": "array", "items": {"$ref": "#/$defs/Node"}}},
    }
    schema = {"type": "object", "$defs": {"Node": node}, "properties": {"root": {"$ref": "#/$defs/Node"}}}
    root = flat_parameters(schema)["properties"]["root"]  # raised "schema nests too deeply" before
    assert root["properties"]["value"] == {"type": "integer"}
    stub = {"type": "object", "description": "A tree node."}  # the recursion, cut
    assert root["properties"]["children"] == {"type": "array", "items": stub}


def test_an_env_renders_a_recursive_mcp_schema_in_its_prompt() -> None:
    from toolenv import ToolEnv
    from toolenv_mcp import MCPServer, MCPTool

    schema = {
        "type": "object",
        "$defs": {"N": {"type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/N"}}}}},
        "properties": {"root": {"$ref": "#/$defs/N"}},
    }
    tool = MCPTool(MCPServer(name="s", command="python"), {"name": "tree", "inputSchema": schema})
    env = ToolEnv(tools=[tool], tasks=[{"question": "q", "answer": "a"}], parser="qwen3_xml")
    obs, _ = env.reset(seed=0)
    assert "tree" in obs
    env.close()


async def test_the_expected_arguments_are_named_as_the_schema_names_them() -> None:
    from toolenv import Tool

    schema = {"type": "object", "properties": {n: {"type": "string"} for n in ("schema", "_id", "query")}}

    class Fake(Tool):
        name = "select"
        Args = args_model("select", schema)

        async def run(self, args: Any, ctx: ToolContext) -> ToolResult:
            return ToolResult(text=repr(arguments_of(args)))

    calls = [
        ToolCall(name="select", arguments={"schema": 1}),
        ToolCall(name="select", arguments={"table": "t"}),
        ToolCall(name="select", arguments={"schema": "public", "_id": "7"}),
    ]
    out, _ = await ToolCaller([Fake()]).invoke(calls, ToolContext(Task()))
    # not "schema_, arg_id, query": the model must hear the names it has to send
    assert out[0].text == (
        "Invalid arguments for tool 'select': schema: 1 is not of type 'string'. "
        "Expected arguments: schema, _id, query."
    )
    assert out[1].text == (
        "Invalid arguments for tool 'select': unknown argument(s) 'table'. Expected arguments: schema, _id, query."
    )
    assert out[2].text == "{'schema': 'public', '_id': '7'}" and not out[2].is_error


def test_titles_are_dropped_from_schemas_not_from_values() -> None:
    from toolenv_mcp import MCPServer, MCPTool

    note = {"title": "Note", "type": "object", "default": {"title": "Untitled", "body": ""}}
    schema = {"type": "object", "properties": {"note": note, "title": {"title": "Title", "enum": [{"title": "a"}]}}}
    tool = MCPTool(MCPServer(name="s", command="python"), {"name": "t", "inputSchema": schema})
    props = tool.schema()["function"]["parameters"]["properties"]
    assert props["note"] == {"type": "object", "default": {"title": "Untitled", "body": ""}}
    assert props["title"] == {"enum": [{"title": "a"}]}


def test_properties_named_in_top_level_combinators_are_arguments() -> None:
    schema = {
        "type": "object",
        "allOf": [
            {"properties": {"path": {"type": "string"}}, "required": ["path"]},
            {"properties": {"mode": {"enum": ["r", "w"]}}},
        ],
        "anyOf": [{"properties": {"text": {"type": "string"}}}, {"properties": {"data": {"type": "string"}}}],
    }
    model = args_model("write", schema)
    assert list(model.model_fields) == ["path", "mode", "text", "data"]
    sent = {"path": "/tmp/x", "mode": "w", "text": "hi"}
    assert arguments_of(model.model_validate(sent)) == sent  # before: every one an "unknown argument"
    assert errors(model, {"path": "p", "size": 1}) == [(("size",), "unknown argument")]
    assert errors(model, {"mode": "w"}) == [(("path",), "Field required")]


def test_a_schema_that_is_a_ref_to_its_definitions_names_its_arguments() -> None:
    """Pydantic writes a recursive model's schema as `{"$ref": "#/$defs/Node", "$defs": ...}`,
    and servers that publish `Model.model_json_schema()` as the input schema send just that.
    Every argument was "unknown" (the tool "takes no arguments"), and the parameters the
    model read were `{"properties": {}}`: the tool could not be called at all."""
    from pydantic import BaseModel

    from toolenv_mcp import MCPServer, MCPTool

    class Node(BaseModel):
        name: str
        children: list[Node] = []

    schema = Node.model_json_schema()
    assert set(schema) == {"$ref", "$defs"}  # what Pydantic gives: no top-level `properties`
    model = args_model("tree", schema)
    sent = {"name": "root", "children": [{"name": "leaf"}]}
    assert arguments_of(model.model_validate(sent)) == sent
    assert errors(model, {"name": "r", "size": 1}) == [(("size",), "unknown argument")]
    assert errors(model, {"children": []}) == [(("name",), "Field required")]
    tool = MCPTool(MCPServer(name="s", command="python"), {"name": "tree", "inputSchema": schema})
    try:
        params = tool.schema()["function"]["parameters"]
        assert params["type"] == "object" and set(params["properties"]) == {"name", "children"}
        assert params["required"] == ["name"]
        flat = tool.flat_schema()["function"]["parameters"]
        assert set(flat["properties"]) == {"name", "children"} and flat["required"] == ["name"]
    finally:
        tool._drop()


def test_a_remote_ref_is_never_fetched_and_does_not_refuse_a_valid_call() -> None:
    """jsonschema's default registry fetches an unknown `$ref` URL with a blocking `urlopen`
    (no timeout) at every validation: a server's schema made each call's argument check do an
    HTTP GET of the server's choosing, on the env's event loop. The remote part is left to the
    server to check; the rest of the schema is still checked here."""
    import http.server
    import threading

    fetched: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            fetched.append(self.path)
            body = b'{"type": "integer"}'
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        remote = f"http://127.0.0.1:{httpd.server_port}/int.json"
        schema = {
            "type": "object",
            "properties": {"n": {"$ref": remote}, "m": {"type": "integer"}},
            "required": ["n"],
        }
        model = args_model("remote", schema)
        assert arguments_of(model.model_validate({"n": "anything", "m": 1})) == {"n": "anything", "m": 1}
        assert errors(model, {"n": 1, "m": "x"}) == [(("m",), "'x' is not of type 'integer'")]
        assert errors(model, {"m": 1}) == [(("n",), "Field required")]
        assert fetched == []
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_a_dangling_local_ref_does_not_refuse_every_call() -> None:
    """A `$ref` to a definition the schema lacks raised an unresolvable-reference error at
    each validation: every call was refused with it, valid or not. The server checks that part."""
    schema = {
        "type": "object",
        "properties": {"p": {"$ref": "#/$defs/Missing"}, "m": {"type": "integer"}},
    }
    model = args_model("dangling", schema)
    assert arguments_of(model.model_validate({"p": {"x": 1}, "m": 2})) == {"p": {"x": 1}, "m": 2}
    assert errors(model, {"m": "x"}) == [(("m",), "'x' is not of type 'integer'")]


def test_properties_named_in_conditional_and_nested_subschemas_are_arguments() -> None:
    """A property the schema names only under `if`/`then`/`else`, `dependentSchemas` or a
    combinator inside a combinator (zod's `z.union([a.and(b), c])`) was an "unknown argument":
    a call the schema accepts was refused before it reached the server."""
    schema = {
        "type": "object",
        "properties": {"kind": {"enum": ["file", "url"]}},
        "required": ["kind"],
        "if": {"properties": {"kind": {"const": "file"}}},
        "then": {"properties": {"path": {"type": "string"}}, "required": ["path"]},
        "else": {"properties": {"url": {"type": "string"}}, "required": ["url"]},
        "dependentSchemas": {"path": {"properties": {"encoding": {"type": "string"}}}},
        "anyOf": [{"allOf": [{"properties": {"depth": {"type": "integer"}}}]}, {"properties": {"flat": {}}}],
    }
    model = args_model("fetch", schema)
    assert set(model.model_fields) == {"kind", "path", "url", "encoding", "depth", "flat"}
    sent = {"kind": "file", "path": "/tmp/x", "encoding": "utf-8", "depth": 2}
    assert arguments_of(model.model_validate(sent)) == sent
    assert errors(model, {"kind": "file"}) == [(("path",), "Field required")]
    assert errors(model, {"kind": "url", "url": "u", "size": 1}) == [(("size",), "unknown argument")]


def test_a_required_name_the_schema_does_not_describe_is_an_argument() -> None:
    """`{"required": ["query"]}` without `properties.query` (a hand-written schema) asks for an
    argument the model could not send: missing, it was "Field required"; sent, "unknown"."""
    model = args_model(
        "search", {"type": "object", "properties": {"limit": {"type": "integer"}}, "required": ["query"]}
    )
    assert set(model.model_fields) == {"limit", "query"}
    assert arguments_of(model.model_validate({"query": "q"})) == {"query": "q"}
    assert errors(model, {"limit": 1}) == [(("query",), "Field required")]
