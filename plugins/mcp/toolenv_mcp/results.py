"""MCP `CallToolResult` (wire format) → toolenv `ToolResult`.

Text contents are joined with newlines; images become `ToolImage`s when Pillow can
read them (the `images` extra), labelled by their bytes and sent as PNG unless they are
PNG, JPEG, WebP or GIF, else a text note says what was left out;
embedded text resources give their text, resource links a line naming the URI, audio
and binary blobs a note. `structuredContent` is kept in `metadata["structured_content"]`
and becomes the text when the result has no text of its own. `isError` → `is_error`.
"""

from __future__ import annotations

import base64
import binascii
import functools
import io
import json
from collections.abc import Mapping
from typing import Any

from toolenv import ToolImage, ToolResult

__all__ = ["to_tool_result"]


def to_tool_result(result: Mapping[str, Any], *, tool: str, server: str, mcp_tool: str | None = None) -> ToolResult:
    """The `ToolResult` of one call of `tool` (named `mcp_tool` on the server, if that differs) on `server`."""
    texts: list[str] = []
    images: list[ToolImage] = []
    for block in result.get("content") or []:
        if not isinstance(block, Mapping):
            continue
        kind = block.get("type")
        if kind == "text":
            texts.append(str(block.get("text", "")))
        elif kind == "image":
            _image(block.get("data"), str(block.get("mimeType", "image/png")), texts, images)
        elif kind == "resource":
            _resource(block.get("resource") or {}, texts, images)
        elif kind == "resource_link":
            name = f" ({block['name']})" if block.get("name") else ""
            texts.append(f"[resource link: {block.get('uri', '')}{name}]")
        elif kind == "audio":
            texts.append(f"[{block.get('mimeType', 'audio')} audio omitted: toolenv passes text and images]")
        else:
            texts.append(f"[content of type {kind!r} omitted]")
    metadata: dict[str, Any] = {"mcp_server": server, "mcp_tool": mcp_tool or tool}
    structured = result.get("structuredContent")
    if structured is not None:
        metadata["structured_content"] = structured
        if not texts:
            texts.append(json.dumps(structured, ensure_ascii=False))
    is_error = bool(result.get("isError"))
    text = "\n".join(texts)
    if is_error and not text.strip():
        text = f"Tool '{tool}' failed (MCP server {server!r} gave no message)."
    return ToolResult(text=text, images=images, metadata=metadata, is_error=is_error)


def _image(data: Any, mime: str, texts: list[str], images: list[ToolImage]) -> None:
    try:
        raw = base64.b64decode(str(data or ""), validate=True)
    except (binascii.Error, ValueError):
        texts.append(f"[{mime} image omitted: its data is not valid base64]")
        return
    image = _readable(raw)
    if image is None:
        why = "it could not be decoded" if _pillow() else "install toolenv-mcp[images] (Pillow) to receive images"
        texts.append(f"[{mime} image of {len(raw)} bytes omitted: {why}]")
        return
    images.append(image)


def _resource(resource: Mapping[str, Any], texts: list[str], images: list[ToolImage]) -> None:
    uri = resource.get("uri", "")
    mime = str(resource.get("mimeType") or "")
    if "text" in resource:
        texts.append(str(resource["text"]))
    elif mime.startswith("image/") and "blob" in resource:
        _image(resource["blob"], mime, texts, images)
    else:
        texts.append(f"[resource {uri} ({mime or 'binary'}) omitted: toolenv passes text and images]")


#: The formats chat APIs (OpenAI, Anthropic, Gemini) and VLM processors take, by Pillow's name (MPO: a
#: phone camera's JPEG holding a second picture, a JPEG to them).
_SENT_AS_IS = {"PNG": "image/png", "JPEG": "image/jpeg", "MPO": "image/jpeg", "WEBP": "image/webp", "GIF": "image/gif"}


def _readable(raw: bytes) -> ToolImage | None:
    """The image in `raw` as models take it, or None (no Pillow, or not an image it knows).

    Labelled by what its bytes are, not by the server's `mimeType` (JPEG bytes sent as
    image/png made a data URL that APIs checking the type refuse); a format models do not
    take (TIFF, BMP, ...) is sent as PNG. A PNG, JPEG, WebP or GIF is read to its header only.
    """
    pil = _pillow()
    if pil is None:
        return None
    try:
        with pil.open(io.BytesIO(raw)) as im:
            width, height = im.size
            if width <= 0 or height <= 0:
                return None
            mime = _SENT_AS_IS.get(str(im.format))
            if mime is not None:
                return ToolImage(data=raw, mime=mime, width=int(width), height=int(height))
            return ToolImage.from_pil(im.convert("RGBA" if im.has_transparency_data else "RGB"))
    except Exception:  # noqa: BLE001 - any undecodable image becomes a note
        return None


@functools.cache
def _pillow() -> Any:
    """`PIL.Image`, or None when Pillow is not installed."""
    try:
        from PIL import Image
    except ImportError:
        return None
    return Image
