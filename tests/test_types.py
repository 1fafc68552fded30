from __future__ import annotations

import json
from pathlib import Path

import pytest

from toolenv.types import Message, ParsedAction, Task, ToolCall, ToolImage, ToolResult, load_tasks


def test_load_tasks_from_list_assigns_ids() -> None:
    tasks = load_tasks([{"question": "a"}, {"id": "x", "question": "b", "answer": ["1", "2"]}])
    assert [t.id for t in tasks] == ["0", "x"]
    assert tasks[1].answers == ["1", "2"]
    assert tasks[0].answers == []


def test_load_tasks_from_jsonl(tmp_path: Path) -> None:
    p = tmp_path / "t.jsonl"
    p.write_text(json.dumps({"id": "a", "question": "q", "answer": "A", "context": {"db": "x"}}) + "\n\n")
    (task,) = load_tasks(p)
    assert task.context == {"db": "x"} and task.answer == "A"


def test_load_tasks_errors_name_the_row(tmp_path: Path) -> None:
    p = tmp_path / "t.jsonl"
    p.write_text('{"question": "ok"}\n{not json\n')
    with pytest.raises(ValueError, match=r"t.jsonl:2: not valid JSON"):
        load_tasks(p)
    with pytest.raises(ValueError, match="task 1 is not valid"):
        load_tasks([{"question": "a"}, {"question": "b", "typo_field": 1}])


def test_numeric_answers_and_ids_of_a_dataset_load_as_text(tmp_path: Path) -> None:
    """GSM8K-style rows store `"answer": 72` and an int `id`: they load as text, and an episode
    answering "72" scores 1; a bool or a NaN is no gold answer and stays refused."""
    p = tmp_path / "t.jsonl"
    p.write_text(json.dumps({"id": 17, "question": "q", "answer": 72}) + "\n")
    (task,) = load_tasks(p)
    assert (task.id, task.answers) == ("17", ["72"])
    assert Task.model_validate({"answer": [1, 2.5, "x"]}).answers == ["1", "2.5", "x"]
    # pandas writes an integer column with gaps as floats: 72.0 is the number 72, not "72.0"
    # (which an answer of 72 never matched, and which normalises to "720")
    assert Task.model_validate({"id": 17.0, "answer": [72.0, -3.0, 1e20]}).model_dump(include={"id", "answer"}) == {
        "id": "17",
        "answer": ["72", "-3", "1e+20"],
    }
    for bad in ({"answer": True}, {"answer": float("nan")}, {"answer": [False]}, {"id": True}):
        with pytest.raises(ValueError):
            Task.model_validate(bad)
    import toolenv

    env = toolenv.ToolEnv(
        tools=[], tasks=[{"question": "6*12?", "answer": 72}, {"question": "6*12.0?", "answer": 72.0}]
    )
    try:
        for i in range(2):
            env.reset(options={"task_index": i})
            assert env.step("<answer>72</answer>")[1] == 1.0
    finally:
        env.close()


def test_tool_result_error_and_roundtrip() -> None:
    r = ToolResult.error("boom", retryable=True, code=3)
    assert r.is_error and r.retryable and r.metadata == {"code": 3}
    assert ToolResult.model_validate_json(r.model_dump_json()) == r


def test_image_roundtrip_and_data_url() -> None:
    png = bytes.fromhex(
        "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
        "1f15c4890000000d49444154789c6360f8cf00000301010018dd8db00000000049454e44ae426082"
    )
    img = ToolImage(data=png, width=1, height=1)
    assert img.data_url().startswith("data:image/png;base64,iVBOR")
    again = ToolImage.model_validate_json(img.model_dump_json())
    assert again.data == png


def test_message_to_openai_with_tool_calls_and_images() -> None:
    img = ToolImage(data=b"x", width=2, height=3)
    m = Message(role="assistant", content="hi", tool_calls=[ToolCall(name="add", arguments={"a": 1}, id="c0")])
    d = m.to_openai()
    assert d["tool_calls"][0]["function"] == {"name": "add", "arguments": '{"a": 1}'}
    u = Message(role="user", content="res", images=[img]).to_openai()
    assert u["content"][0]["type"] == "image_url" and u["content"][1] == {"type": "text", "text": "res"}
    t = Message(role="tool", content="res", tool_call_id="c0").to_openai()
    assert t == {"role": "tool", "content": "res", "tool_call_id": "c0"}
    # OpenAI takes text only in a tool message: its images go in a user message after it
    with pytest.raises(ValueError, match="move_tool_images"):
        Message(role="tool", content="res", tool_call_id="c0", images=[img]).to_openai()


def test_models_forbid_unknown_fields() -> None:
    with pytest.raises(ValueError):
        Task.model_validate({"question": "q", "answr": "typo"})


def test_step_types_validate_and_serialise_like_models() -> None:
    # The per-step types are dataclasses; validation goes through Pydantic on demand.
    with pytest.raises(ValueError, match="bogus"):
        Message.model_validate({"role": "user", "bogus": 1})
    with pytest.raises(ValueError):
        Message.model_validate({"role": "narrator"})
    with pytest.raises(TypeError):
        ToolCall(name="x", argumnts={})  # type: ignore[call-arg]
    call = ToolCall.model_validate({"name": "add", "arguments": {"a": 1}})
    assert call == ToolCall(name="add", arguments={"a": 1}) and call.id == ""
    assert call.model_copy(update={"id": "c9"}).id == "c9" and call.id == ""
    dumped = Message(role="assistant", content="hi", tool_calls=[call]).model_dump(mode="json")
    assert dumped["tool_calls"] == [{"name": "add", "arguments": {"a": 1}, "id": ""}]
    assert set(ParsedAction.model_json_schema()["properties"]) == {"tool_calls", "answer", "text", "errors"}
    again = ParsedAction.model_validate_json(ParsedAction(tool_calls=[call], answer="4").model_dump_json())
    assert again.tool_calls == [call] and again.answer == "4" and again.is_final


def test_from_pil_is_lossless_png_and_passes_save_params() -> None:
    pil = pytest.importorskip("PIL.Image", reason="Pillow comes with toolenv-vision")
    noise = pil.frombytes("RGB", (64, 48), bytes((i * 7919) % 251 for i in range(64 * 48 * 3)))
    png = ToolImage.from_pil(noise)
    assert (png.mime, png.width, png.height) == ("image/png", 64, 48)
    assert png.to_pil().tobytes() == noise.tobytes()  # zlib level 1 is still lossless
    slow = ToolImage.from_pil(noise, compress_level=9)
    assert slow.to_pil().tobytes() == noise.tobytes() and slow.data != png.data
    jpeg = ToolImage.from_pil(noise, "JPEG", quality=50)
    assert jpeg.mime == "image/jpeg" and jpeg.to_pil().size == (64, 48)


def test_hot_path_builders_set_every_field_and_equal_the_keyword_constructors() -> None:
    import dataclasses

    from toolenv.types import Message, ParsedAction, ToolCall, new_call, new_message, new_parsed

    call = new_call("add", {"a": 1}, "call_0")
    parsed = new_parsed([call], "42", "rest", ["an error"])
    tool_msg = new_message("tool", "ok", "add", "call_0", None, [])
    assistant = new_message("assistant", "text", None, None, [call])
    for built in (call, parsed, tool_msg, assistant):  # asdict reads every slot: an unset one raises
        assert set(dataclasses.asdict(built)) == {f.name for f in dataclasses.fields(built)}
    assert call == ToolCall(name="add", arguments={"a": 1}, id="call_0")
    assert parsed == ParsedAction(tool_calls=[call], answer="42", text="rest", errors=["an error"])
    assert tool_msg == Message(role="tool", content="ok", name="add", tool_call_id="call_0")
    assert assistant == Message(role="assistant", content="text", tool_calls=[call])
    assert assistant.images == [] and assistant.images is not new_message("user", "x").images
    assert Message.model_validate(assistant.model_dump()) == assistant
