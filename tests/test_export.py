"""Trajectories as chat-format SFT data: the layout, the filters, the CLI, a real chat template reading it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from _tiny_vlm import tiny_qwen3_vl

import toolenv
from toolenv.agent import Agent, EnvInfo
from toolenv.cli import main
from toolenv.export import chat_messages, export_chat, export_tokens, trains_on
from toolenv.trajectory import Trajectory, read_trajectories

CALL = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'
TASKS = [{"id": "right", "question": "2+3?", "answer": "5"}, {"id": "wrong", "question": "2+3?", "answer": "6"}]


@toolenv.tool
def add(a: int, b: int) -> str:
    """Add two integers."""
    return str(a + b)


class Scripted(Agent):
    """A broken call, a good call, then the answer 5 (right for one task, wrong for the other)."""

    async def act(self, observation: str, messages: list[toolenv.Message], env_info: EnvInfo) -> str:
        return ['<tool_call>{"name": "add", "arguments": </tool_call>', CALL, "It is <answer>5</answer>"][env_info.turn]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("run")
    res = toolenv.rollout(
        lambda: toolenv.ToolEnv(tools=[add], tasks=TASKS, max_turns=4), Scripted(), out=out, concurrency=1
    )
    assert sorted((t.task.id, t.success) for t in res.trajectories) == [("right", True), ("wrong", False)]
    return out


def _trajectory(run_dir: Path, task_id: str) -> Trajectory:
    return next(t for t in read_trajectories(run_dir / "trajectories.jsonl") if t.task.id == task_id)


def test_messages_follow_the_episode(run_dir: Path) -> None:
    msgs = chat_messages(_trajectory(run_dir, "right"))
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user", "assistant", "user", "assistant"]
    assert msgs[2]["content"].startswith('<tool_call>{"name": "add"')  # the action as written
    assert "not valid JSON" in msgs[3]["content"]  # a parse error answers no call: said as the user
    assert msgs[4] == {"role": "assistant", "content": CALL}
    # A call written as text is answered by the observation a text-mode model read, not by a
    # `tool` message answering a call no assistant message declares
    assert msgs[5] == {"role": "user", "content": "<tool_response>\n5\n</tool_response>"}
    assert msgs[6] == {"role": "assistant", "content": "It is <answer>5</answer>"}  # no reply after the last turn


def test_structured_calls_leave_the_format_to_the_template(run_dir: Path) -> None:
    msgs = chat_messages(_trajectory(run_dir, "right"), calls="structured")
    call = msgs[4]
    assert call["content"] == "" and call["tool_calls"] == [
        {"id": "call_0", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}
    ]
    assert msgs[6] == {"role": "assistant", "content": "It is <answer>5</answer>"}  # no call: the text as written
    with pytest.raises(ValueError, match="calls must be"):
        chat_messages(_trajectory(run_dir, "right"), calls="xml")  # type: ignore[arg-type]
    objects = chat_messages(_trajectory(run_dir, "right"), calls="structured", arguments="object")
    assert objects[4]["tool_calls"][0]["function"]["arguments"] == {"a": 2, "b": 3}
    assert objects[:4] == msgs[:4] and objects[5:] == msgs[5:]
    with pytest.raises(ValueError, match="arguments must be"):
        chat_messages(_trajectory(run_dir, "right"), calls="structured", arguments="yaml")  # type: ignore[arg-type]


@toolenv.tool
def weather(city: str) -> str:
    """The weather in a city."""
    return f"{city}: sunny"


WEATHER_CALL = '<tool_call>\n{"name": "weather", "arguments": {"city": "北京"}}\n</tool_call>'


class AsksTheWeather(Agent):
    """Calls `weather` for 北京 (as a model writes it: the characters themselves), then answers."""

    async def act(self, observation: str, messages: list[toolenv.Message], env_info: EnvInfo) -> str:
        return [WEATHER_CALL, "<answer>5</answer>"][env_info.turn]


def test_structured_arguments_keep_the_characters_the_model_wrote(tmp_path: Path) -> None:
    """A JSON-string call's arguments hold non-ASCII text as written, not as `\\uXXXX` escapes: a template
    that writes a string's arguments as they are (Qwen3's) trains the model on what it wrote."""
    res = toolenv.rollout(
        lambda: toolenv.ToolEnv(tools=[weather], tasks=TASKS[:1], max_turns=3), AsksTheWeather(), out=tmp_path / "run"
    )
    (t,) = res.trajectories
    msgs = chat_messages(t, calls="structured")
    arguments = msgs[2]["tool_calls"][0]["function"]["arguments"]
    assert arguments == '{"city": "北京"}' and json.loads(arguments) == {"city": "北京"}
    pytest.importorskip("trl", reason="the TRL checks need trl (pip install toolenv[trl]); CI installs it")
    import tempfile

    from transformers import AutoTokenizer
    from trl.chat_template_utils import qwen3_chat_template

    from toolenv.integrations.verl.tiny import build_tiny_qwen2

    tokenizer: Any = AutoTokenizer.from_pretrained(build_tiny_qwen2(Path(tempfile.mkdtemp()), with_model=False))
    text = tokenizer.apply_chat_template(msgs, chat_template=qwen3_chat_template, tokenize=False)
    assert WEATHER_CALL in text  # the call as the model wrote it


def test_filters_and_file(run_dir: Path, tmp_path: Path) -> None:
    trajs = read_trajectories(run_dir / "trajectories.jsonl")
    assert export_chat(trajs, tmp_path / "all.jsonl") == 2
    assert export_chat(trajs, tmp_path / "ok.jsonl", success_only=True) == 1
    assert export_chat(trajs, tmp_path / "none.jsonl", min_reward=1.5) == 0
    (line,) = [json.loads(x) for x in (tmp_path / "ok.jsonl").read_text().splitlines()]
    assert line["metadata"] == {"task_id": "right", "sample": 0, "reward": 1.0, "env_id": ""}
    assert line["messages"] == chat_messages(_trajectory(run_dir, "right"))
    tools = [add.schema()]
    export_chat(trajs, tmp_path / "tools.jsonl", tools=tools)
    assert all(json.loads(x)["tools"] == tools for x in (tmp_path / "tools.jsonl").read_text().splitlines())
    failed = trajs[0].model_copy(update={"error": "agent failed on turn 0: boom"})
    assert export_chat([failed], tmp_path / "err.jsonl") == 0  # an episode that broke teaches nothing


def test_cli(run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "sft.jsonl"
    assert main(["export", str(run_dir), "--out", str(out), "--success-only", "--calls", "structured"]) == 0
    assert f"wrote 1 of 2 trajectories to {out}" in capsys.readouterr().out
    (line,) = [json.loads(x) for x in out.read_text().splitlines()]
    assert line["messages"][4]["tool_calls"][0]["function"]["name"] == "add"
    assert line["messages"][4]["tool_calls"][0]["function"]["arguments"] == '{"a": 2, "b": 3}'
    args = ["export", str(run_dir), "--out", str(out), "--calls", "structured", "--arguments", "object"]
    assert main(args) == 0
    line = json.loads(out.read_text().splitlines()[0])
    assert line["messages"][4]["tool_calls"][0]["function"]["arguments"] == {"a": 2, "b": 3}


def test_a_chat_template_renders_the_export_back_into_calls_the_env_reads(run_dir: Path) -> None:
    """Structured calls rendered by a real chat template (the tiny Qwen2's) come out in the
    model's format, and the env's parser reads the same call back."""
    pytest.importorskip("transformers", reason="the chat-template check needs transformers (CI installs it)")
    import tempfile

    from transformers import AutoTokenizer

    from toolenv.integrations.verl.tiny import build_tiny_qwen2

    tokenizer: Any = AutoTokenizer.from_pretrained(build_tiny_qwen2(Path(tempfile.mkdtemp())))
    # Qwen's template wants arguments as a mapping, as most templates do.
    msgs = chat_messages(_trajectory(run_dir, "right"), calls="structured", arguments="object")
    text = tokenizer.apply_chat_template(msgs, tools=[add.schema()], tokenize=False)
    assistant = text.split("<|im_start|>assistant\n")[2].split("<|im_end|>")[0]
    (call,) = toolenv.get_parser("hermes").parse(assistant).tool_calls
    assert (call.name, call.arguments) == ("add", {"a": 2, "b": 3})
    assert "<tool_response>\n5\n</tool_response>" in text


def test_a_failed_export_leaves_no_tmp_file(run_dir: Path, tmp_path: Path) -> None:
    target = tmp_path / "taken"
    target.mkdir()  # the final rename onto a directory fails
    with pytest.raises(OSError):
        export_chat(read_trajectories(run_dir / "trajectories.jsonl"), target)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken"]  # no taken.tmp left behind


def _live_trajectories() -> int:
    import gc

    gc.collect()
    return sum(type(o) is Trajectory for o in gc.get_objects())


def test_cli_streams_a_run_of_any_size(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`toolenv export` of a big run holds one trajectory at a time, not the whole file."""
    import toolenv.export

    run = tmp_path / "run"
    toolenv.rollout(
        lambda: toolenv.ToolEnv(tools=[add], tasks=TASKS, max_turns=4), Scripted(), samples=40, out=run, tune_gc=False
    )
    live: list[int] = []
    real = toolenv.export.chat_messages

    def counting(trajectory: Trajectory, **kwargs: Any) -> list[dict[str, Any]]:
        live.append(_live_trajectories())
        return real(trajectory, **kwargs)

    monkeypatch.setattr(toolenv.export, "chat_messages", counting)
    copy = tmp_path / "copy.jsonl"  # a second file: the same run twice is refused
    copy.write_bytes((run / "trajectories.jsonl").read_bytes())
    assert main(["export", str(run), str(copy), "--out", str(tmp_path / "sft.jsonl")]) == 0
    assert len(live) == 160 and max(live) <= 3
    assert len((tmp_path / "sft.jsonl").read_text().splitlines()) == 160


def test_cli_with_an_invalid_line_writes_nothing(run_dir: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    lines = (run_dir / "trajectories.jsonl").read_text().splitlines(keepends=True)
    bad.write_text(lines[0] + "{not json}\n" + lines[1])
    assert main(["export", str(bad), "--out", str(tmp_path / "sft.jsonl")]) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.jsonl"]


# ---------------------------------------------------------------------- trajectories with images
@toolenv.tool
def snap(label: str) -> toolenv.ToolResult:
    """Show a small picture."""
    from PIL import Image

    return toolenv.ToolResult(text=f"picture {label}", images=[toolenv.ToolImage.from_pil(Image.new("RGB", (40, 30)))])


SNAP = '<tool_call>{"name": "snap", "arguments": {"label": "a"}}</tool_call>'


class Snapper(Agent):
    """A picture; a picture and a broken call in one turn; then the answer."""

    async def act(self, observation: str, messages: list[toolenv.Message], env_info: EnvInfo) -> str:
        return [SNAP, SNAP + '<tool_call>{"name": "snap", "arguments": </tool_call>', "<answer>5</answer>"][
            env_info.turn
        ]


@pytest.fixture(scope="module")
def visual_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real `toolenv/VisualSearch-v0` rollout of its oracle: the overview in the prompt, a crop in a result."""
    pytest.importorskip("toolenv_vision", reason="the vision plugin (plugins/vision)")
    out = tmp_path_factory.mktemp("visual")
    res = toolenv.rollout("toolenv/VisualSearch-v0", "oracle", n=2, out=out)
    assert [t.success for t in res.trajectories] == [True, True]
    return out


def _visual(visual_run: Path) -> list[Trajectory]:
    return read_trajectories(visual_run / "trajectories.jsonl")


def test_chat_messages_put_a_results_images_in_a_user_message_not_the_tool_message(visual_run: Path) -> None:
    """OpenAI's tool messages hold text only: the crop's image follows its tool message in a user message."""
    first = _visual(visual_run)[0]
    msgs = chat_messages(first, calls="structured")
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "tool", "user", "assistant"]
    assert [p["type"] for p in msgs[1]["content"]] == ["image_url", "text"]  # the overview, then the question
    assert msgs[3]["content"] == first.turns[0].results[0].text  # the crop's text, alone
    assert msgs[3]["tool_call_id"] == msgs[2]["tool_calls"][0]["id"]
    (image,) = msgs[4]["content"]
    assert image["type"] == "image_url" and image["image_url"]["url"] == first.turns[0].results[0].images[0].data_url()


def test_a_turns_images_and_its_unanswered_results_share_one_user_message(tmp_path: Path) -> None:
    """Tool results with images and a parse error in one turn: the tool messages (text), then one user
    message with every image of the turn, in order, and the error text; templates that want roles to
    alternate see no two user messages in a row."""
    res = toolenv.rollout(
        lambda: toolenv.ToolEnv(tools=[snap], tasks=TASKS[:1], max_turns=4), Snapper(), out=tmp_path / "run"
    )
    (t,) = res.trajectories
    msgs = chat_messages(t, calls="structured")  # text mode answers with the observation (test_export_text_mode)
    assert [m["role"] for m in msgs] == [
        "system",
        "user",
        "assistant",
        "tool",
        "user",
        "assistant",
        "tool",
        "user",
        "assistant",
    ]
    assert msgs[3]["content"] == "picture a" and msgs[6]["content"] == "picture a"
    assert [p["type"] for p in msgs[4]["content"]] == ["image_url"]
    assert [p["type"] for p in msgs[7]["content"]] == ["image_url", "text"]
    assert "not valid JSON" in msgs[7]["content"][1]["text"]
    assert export_chat(res.trajectories, tmp_path / "sft.jsonl", calls="structured") == 1
    (line,) = [json.loads(x) for x in (tmp_path / "sft.jsonl").read_text().splitlines()]
    # tool, user (image), assistant (calls only: no text part), tool, user (image, error text)
    assert [len(m["content"]) for m in line["messages"][3:8]] == [1, 1, 0, 1, 2]
    assert line["messages"][7]["content"][0] == {"type": "image"} and len(line["images"]) == 2
    assert line["images"][0] == line["images"][1]  # the same picture: one file, named twice


def test_an_image_trajectory_is_written_in_trls_vision_layout(visual_run: Path, run_dir: Path, tmp_path: Path) -> None:
    """Image placeholders only outside tool messages, as many as the `images` column names, the
    files beside the export; a text-only trajectory in the same file keeps the plain layout."""
    out = tmp_path / "sft" / "mixed.jsonl"
    texts = read_trajectories(run_dir / "trajectories.jsonl")
    visual_trajectories = _visual(visual_run)
    assert export_chat([*texts[:1], *visual_trajectories], out, calls="structured") == 3
    text, *visual = [json.loads(x) for x in out.read_text().splitlines()]
    assert "images" not in text and text["messages"] == chat_messages(texts[0], calls="structured")
    for line, t in zip(visual, visual_trajectories, strict=True):
        msgs = line["messages"]
        assert [m["role"] for m in msgs] == ["system", "user", "assistant", "tool", "user", "assistant"]
        assert all(isinstance(m["content"], list) for m in msgs)
        placeholders = [m["role"] for m in msgs for p in m["content"] if p["type"] == "image"]
        assert placeholders == ["user", "user"] == ["user"] * len(line["images"])
        assert msgs[1]["content"][0] == {"type": "image"} and msgs[1]["content"][1]["type"] == "text"
        assert msgs[2]["content"] == [] and msgs[2]["tool_calls"][0]["function"]["name"] == "crop"
        assert msgs[3]["content"] == [{"type": "text", "text": t.turns[0].results[0].text}]
        assert msgs[4]["content"] == [{"type": "image"}]
        shown = [*t.prompt_messages[1].images, *t.turns[0].results[0].images]  # the overview, the crop
        assert [(out.parent / name).read_bytes() for name in line["images"]] == [im.data for im in shown]


@pytest.mark.parametrize("template", ["qwen3_vl", "qwen2_5_vl"])
def test_trls_vision_collator_reads_the_export(visual_run: Path, tmp_path: Path, template: str) -> None:
    """`load_chat` then TRL's own `DataCollatorForVisionLanguageModeling` (its `prepare_multimodal_messages`,
    a real processor and chat template): both images of each row reach the pixels, each where it stands."""
    pytest.importorskip("trl", reason="the TRL checks need trl (pip install toolenv[trl]); CI installs it")
    from trl import chat_template_utils
    from trl.trainer.sft_trainer import DataCollatorForVisionLanguageModeling

    from toolenv.export import load_chat

    processor, _, tok = tiny_qwen3_vl()
    out = tmp_path / "sft.jsonl"
    trajectories = _visual(visual_run)
    export_chat(trajectories, out, calls="structured", arguments="object")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(elsewhere)  # the file's image paths are relative to the file, not to the working directory
        dataset = load_chat(out)
    assert dataset.features["images"].feature.__class__.__name__ == "Image"
    first = trajectories[0]
    shown = [*first.prompt_messages[1].images, *first.turns[0].results[0].images]  # the overview, the crop
    assert [im.tobytes() for im in dataset[0]["images"]] == [im.to_pil().tobytes() for im in shown]
    chat_template = getattr(chat_template_utils, f"{template}_chat_template")
    batch = DataCollatorForVisionLanguageModeling(processor, chat_template=chat_template)([dataset[0], dataset[1]])
    assert batch["image_grid_thw"].shape[0] == 4  # two images per row
    text = tok.decode(batch["input_ids"][0]).replace("<|image_pad|>", "")
    marker = "<|vision_start|><|vision_end|>"
    assert text.count(marker) == 2
    prompt, after_crop = text.split(marker)[1], text.split(marker)[2]
    assert prompt.startswith(first.prompt_messages[1].content[:40])
    assert first.turns[0].results[0].text in prompt  # the crop's text, then its image
    assert after_crop.startswith("<|im_end|>\n<|im_start|>assistant\n<answer>")


def test_sft_trainer_trains_a_vision_model_on_the_export(visual_run: Path, tmp_path: Path) -> None:
    """TRL's real `SFTTrainer` on the export with a tiny Qwen3-VL: it takes the vision path (the
    `images` column) and the images reach the loss, whose gradient moves the vision tower."""
    pytest.importorskip("trl", reason="the TRL checks need trl (pip install toolenv[trl]); CI installs it")
    import os

    import torch
    import transformers
    from trl import SFTConfig, SFTTrainer
    from trl.trainer.sft_trainer import DataCollatorForVisionLanguageModeling

    from toolenv.export import load_chat

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    processor, config, _ = tiny_qwen3_vl()
    out = tmp_path / "sft.jsonl"
    assert main(["export", str(visual_run), "--out", str(out), "--calls", "structured", "--arguments", "object"]) == 0
    torch.manual_seed(0)
    model = transformers.Qwen3VLForConditionalGeneration(config)
    before = {n: p.detach().clone() for n, p in model.named_parameters() if n.startswith("model.visual.")}
    assert before
    args = SFTConfig(
        output_dir=str(tmp_path / "train"),
        max_steps=1,
        per_device_train_batch_size=2,
        max_length=None,  # the tiny tokenizer makes long rows; a cut would cut image tokens
        learning_rate=1e-2,
        report_to=[],
        save_strategy="no",
        use_cpu=True,
        dataloader_num_workers=0,
    )
    trainer = SFTTrainer(model=model, args=args, train_dataset=load_chat(out), processing_class=processor)
    assert isinstance(trainer.data_collator, DataCollatorForVisionLanguageModeling)
    result = trainer.train()
    assert torch.isfinite(torch.tensor(result.training_loss))
    moved = [n for n, p in model.named_parameters() if n in before and not torch.equal(before[n], p)]
    assert moved, "the vision tower got no gradient: the images never reached the model"


# ---------------------------------------------------------------------- the tools the model saw
def test_cli_adds_the_tools_of_an_env_or_a_file(run_dir: Path, tmp_path: Path) -> None:
    """`--tools` puts the schemas the model was given on every line: an env's `tool_schemas()`
    (the env made from its id) or a JSON file of schemas."""
    import gymnasium as gym

    out = tmp_path / "sft.jsonl"
    assert main(["export", str(run_dir), "--out", str(out), "--tools", "toolenv/Chinook-v0"]) == 0
    env = gym.make("toolenv/Chinook-v0").unwrapped
    expected = env.tool_schemas()  # type: ignore[attr-defined]
    env.close()
    assert [json.loads(x)["tools"] for x in out.read_text().splitlines()] == [expected, expected]
    schemas = tmp_path / "tools.json"
    schemas.write_text(json.dumps([add.schema()]))
    assert main(["export", str(run_dir), "--out", str(out), "--tools", str(schemas)]) == 0
    assert [json.loads(x)["tools"] for x in out.read_text().splitlines()] == [[add.schema()], [add.schema()]]


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (None, "--tools: no file named"),
        ("{not json", "--tools: {path} is not valid JSON"),
        ('{"name": "add"}', "--tools: {path} must hold a list of OpenAI function schemas"),
        ('[{"name": "add"}]', "--tools: {path} must hold a list of OpenAI function schemas"),
    ],
)
def test_cli_tools_that_are_not_schemas_are_one_line_and_write_nothing(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str | None, why: str
) -> None:
    path = tmp_path / "tools.json"
    if content is not None:
        path.write_text(content)
    out = tmp_path / "sft.jsonl"
    assert main(["export", str(run_dir), "--out", str(out), "--tools", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("toolenv export: error: " + why.format(path=path)) and err.count("\n") == 1, err
    assert not out.exists()


def test_an_export_with_tools_renders_to_what_a_transformers_model_read(tmp_path: Path) -> None:
    """A real `TransformersAgent` run (it gives the template the env's tools) recording its prompt
    ids: the export with `--tools`, rendered by the same chat template, is the text the model read
    at its last turn, then its last action."""
    pytest.importorskip("toolenv_agents.hf", reason="the reference agents (agents/)")
    pytest.importorskip("transformers", reason="the transformers agent needs transformers")
    from toolenv.integrations.verl.tiny import build_tiny_qwen2
    from toolenv_agents.hf import TransformersAgent

    agent = TransformersAgent(build_tiny_qwen2(tmp_path), max_new_tokens=12, record_prompt_ids=True)
    run = tmp_path / "run"
    toolenv.rollout(lambda: toolenv.ToolEnv(tools=[add], tasks=TASKS[:1], max_turns=3), agent, out=run)
    (schemas := tmp_path / "tools.json").write_text(json.dumps([add.schema()]))
    out = tmp_path / "sft.jsonl"
    assert main(["export", str(run), "--out", str(out), "--tools", str(schemas)]) == 0
    (line,) = [json.loads(x) for x in out.read_text().splitlines()]
    (t,) = read_trajectories(run / "trajectories.jsonl")
    assert len(t.turns) == 3 and t.turns[-1].prompt_token_ids
    tok = agent.tokenizer
    prompt = tok.apply_chat_template(
        line["messages"][:-1], tools=line["tools"], add_generation_prompt=True, tokenize=False
    )
    assert prompt == tok.decode(t.turns[-1].prompt_token_ids)
    whole = tok.apply_chat_template(line["messages"], tools=line["tools"], tokenize=False)
    assert whole == prompt + t.turns[-1].action + "<|im_end|>\n"


# ---------------------------------------------------------------------- token-level export
class Tokens(Agent):
    """Records token ids as a server would: turn 1's prompt continues turn 0's prompt and
    completion; turn 2's does not (a template that re-renders an earlier turn)."""

    async def act(self, observation: str, messages: list[toolenv.Message], env_info: EnvInfo) -> toolenv.AgentAction:
        turn = env_info.turn
        prompt = [[1, 2, 3], [1, 2, 3, 10, 11, 4, 5], [1, 2, 9, 12, 6]][turn]
        ids = [[10, 11], [12, 13, 14], [15]][turn]
        logprobs = [[-0.5, -0.25], [-1.0, float("-inf"), -0.125], None][turn]
        text = ['<tool_call>{"name": "add", "arguments": </tool_call>', CALL, "<answer>5</answer>"][turn]
        return toolenv.AgentAction(text=text, token_ids=ids, logprobs=logprobs, prompt_token_ids=prompt)


def test_token_export_writes_exact_ids_with_a_loss_mask(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`--format tokens`: per trajectory the exact ids the model read and wrote, with a mask on the
    generated ones (TRL's pre-tokenized `input_ids`/`assistant_masks`) and their logprobs; a turn
    whose prompt does not continue the sequence so far starts a new row; trajectories without ids
    are left out, counted in a warning."""
    run = tmp_path / "run"
    toolenv.rollout(lambda: toolenv.ToolEnv(tools=[add], tasks=TASKS, max_turns=4), Tokens(), out=run)
    text_run = tmp_path / "text"
    toolenv.rollout(lambda: toolenv.ToolEnv(tools=[add], tasks=TASKS[:1], max_turns=4), Scripted(), out=text_run)
    out = tmp_path / "tokens.jsonl"
    assert main(["export", str(run), str(text_run), "--out", str(out), "--format", "tokens", "--success-only"]) == 0
    captured = capsys.readouterr()
    assert f"wrote 1 of 3 trajectories to {out}" in captured.out
    assert captured.err.count("\n") == 1 and "1 kept trajectory has no token ids" in captured.err
    first, second = [json.loads(x) for x in out.read_text().splitlines()]
    assert first["input_ids"] == [1, 2, 3, 10, 11, 4, 5, 12, 13, 14]
    assert first["assistant_masks"] == [0, 0, 0, 1, 1, 0, 0, 1, 1, 1]
    assert first["logprobs"] == [None, None, None, -0.5, -0.25, None, None, -1.0, None, -0.125]  # -inf: null
    assert first["metadata"] == {"task_id": "right", "sample": 0, "reward": 1.0, "env_id": "", "turns": [0, 1]}
    assert second == {
        "input_ids": [1, 2, 9, 12, 6, 15],
        "assistant_masks": [0, 0, 0, 0, 0, 1],
        "logprobs": None,  # the turn's logprobs are unknown
        "metadata": {"task_id": "right", "sample": 0, "reward": 1.0, "env_id": "", "turns": [2, 2]},
    }


def test_token_export_loads_as_trls_pretokenized_dataset(tmp_path: Path) -> None:
    """The rows are what TRL's `SFTTrainer` takes as already tokenized: its labels mask the prompt."""
    pytest.importorskip("trl", reason="the TRL checks need trl (pip install toolenv[trl]); CI installs it")
    from datasets import load_dataset

    run = tmp_path / "run"
    toolenv.rollout(lambda: toolenv.ToolEnv(tools=[add], tasks=TASKS[:1], max_turns=4), Tokens(), out=run)
    out = tmp_path / "tokens.jsonl"
    assert toolenv.export.export_tokens(read_trajectories(run / "trajectories.jsonl"), out) == 1
    dataset = load_dataset("json", data_files=str(out), split="train")
    assert dataset[0]["input_ids"] == [1, 2, 3, 10, 11, 4, 5, 12, 13, 14]
    assert dataset[0]["assistant_masks"] == [0, 0, 0, 1, 1, 0, 0, 1, 1, 1]


def test_cli_refuses_to_write_over_a_runs_trajectories(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`--out` naming the trajectories being read would replace the run with its export: refused."""
    path = run_dir / "trajectories.jsonl"
    before = path.read_bytes()
    assert main(["export", str(run_dir), "--out", str(path)]) == 2
    err = capsys.readouterr().err
    assert err == f"toolenv export: error: --out {path} is the trajectories file of a run being exported\n"
    assert path.read_bytes() == before


def test_cli_refuses_a_run_given_twice(run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A run named twice (twice alike, or as its folder and its file) would put every episode in
    the data twice: one line, exit 2, nothing written."""
    out = tmp_path / "sft.jsonl"
    for again in (run_dir, run_dir / "trajectories.jsonl", run_dir / ".." / run_dir.name):
        assert main(["export", str(run_dir), str(again), "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert err == (
            f"toolenv export: error: {again} is {run_dir} again (the same trajectories file): "
            "its episodes would be read twice\n"
        )
    assert not out.exists()


def test_a_failed_write_keeps_the_previous_export(run_dir: Path, tmp_path: Path) -> None:
    """An export that fails halfway (a trajectory the writer cannot take) leaves the previous file whole."""
    out = tmp_path / "sft.jsonl"
    trajs = read_trajectories(run_dir / "trajectories.jsonl")
    assert export_chat(trajs, out) == 2
    before = out.read_bytes()

    def failing() -> Any:
        yield trajs[0]
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        export_chat(failing(), out)
    assert out.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["sft.jsonl"]


# ---------------------------------------------------------------------- text a server cut
class HalfEmoji(Agent):
    """Answers with half an emoji, a lone surrogate, as a server that cut a character sends it."""

    async def act(self, observation: str, messages: list[toolenv.Message], env_info: EnvInfo) -> str:
        return "It is <answer>5</answer> \ud83d"


def test_an_in_memory_trajectory_with_a_lone_surrogate_exports(tmp_path: Path) -> None:
    """A rollout kept in memory (no `out`) holds the text as the agent gave it; its export is
    written as the trajectory file would be, U+FFFD for the lone surrogate, not a failed export."""
    res = toolenv.rollout(lambda: toolenv.ToolEnv(tools=[add], tasks=TASKS[:1], max_turns=2), HalfEmoji())
    assert res.trajectories[0].turns[0].action.endswith("\ud83d")
    out = tmp_path / "sft.jsonl"
    assert export_chat(res.trajectories, out) == 1
    (line,) = [json.loads(x) for x in out.read_text(encoding="utf-8").splitlines()]
    assert line["messages"][-1]["content"] == "It is <answer>5</answer> \ufffd"


# ---------------------------------------------------------------------- per-message training weights
def _weights(messages: list[dict[str, Any]]) -> list[int | None]:
    """Each assistant message's weight (None: it has none); no other role may carry one."""
    assert all("weight" not in m for m in messages if m["role"] != "assistant")
    return [m.get("weight") for m in messages if m["role"] == "assistant"]


def test_weights_mark_the_turns_the_env_could_not_parse(run_dir: Path, tmp_path: Path) -> None:
    """`weights=True`: OpenAI's fine-tuning `weight`, 0 on the turn with a parse error, 1 on the call and
    the answer; the messages are otherwise those of the plain export, which has no weight (the default)."""
    trajs = read_trajectories(run_dir / "trajectories.jsonl")
    for calls in ("text", "structured"):
        weighted = chat_messages(trajs[0], calls=calls, weights=True)  # type: ignore[arg-type]
        assert _weights(weighted) == [0, 1, 1]
        plain = chat_messages(trajs[0], calls=calls)  # type: ignore[arg-type]
        assert _weights(plain) == [None, None, None]
        assert [{k: v for k, v in m.items() if k != "weight"} for m in weighted] == plain
    assert export_chat(trajs, tmp_path / "w.jsonl", weights=True) == 2
    lines = [json.loads(x) for x in (tmp_path / "w.jsonl").read_text().splitlines()]
    assert [_weights(line["messages"]) for line in lines] == [[0, 1, 1], [0, 1, 1]]


class Rambler(Agent):
    """Text with no call and no answer, a call the tool refuses (bad argument), a good call, the answer."""

    async def act(self, observation: str, messages: list[toolenv.Message], env_info: EnvInfo) -> str:
        bad = '<tool_call>{"name": "add", "arguments": {"a": "two", "b": 3}}</tool_call>'
        return ["Let me think about it.", bad, CALL, "<answer>5</answer>"][env_info.turn]


def test_a_turn_with_no_action_weighs_0_and_a_failed_tool_call_1(tmp_path: Path) -> None:
    """A turn with neither a call nor an answer (the env replied there was none) is not trained on; a
    well-formed call the tool answered with an error is a turn the env ran, and is."""
    res = toolenv.rollout(lambda: toolenv.ToolEnv(tools=[add], tasks=TASKS[:1], max_turns=5), Rambler())
    (t,) = res.trajectories
    assert t.success and not t.turns[1].parsed.errors and t.turns[1].results[0].is_error
    assert _weights(chat_messages(t, weights=True)) == [0, 1, 1, 1]


def test_cli_weights_in_chat_and_token_exports(tmp_path: Path) -> None:
    """`--weights`: the chat export's assistant messages carry the weight; the token export's
    `assistant_masks` is 0 on the tokens of the turn with a parse error."""
    run = tmp_path / "run"
    toolenv.rollout(lambda: toolenv.ToolEnv(tools=[add], tasks=TASKS[:1], max_turns=4), Tokens(), out=run)
    chat, tokens = tmp_path / "chat.jsonl", tmp_path / "tokens.jsonl"
    assert main(["export", str(run), "--out", str(chat), "--weights", "--calls", "structured"]) == 0
    (line,) = [json.loads(x) for x in chat.read_text().splitlines()]
    assert _weights(line["messages"]) == [0, 1, 1]
    assert main(["export", str(run), "--out", str(tokens), "--format", "tokens", "--weights"]) == 0
    first, second = [json.loads(x) for x in tokens.read_text().splitlines()]
    assert first["input_ids"] == [1, 2, 3, 10, 11, 4, 5, 12, 13, 14]
    assert first["assistant_masks"] == [0, 0, 0, 0, 0, 0, 0, 1, 1, 1]  # turn 0's broken call: masked
    assert second["assistant_masks"] == [0, 0, 0, 0, 0, 1]
    assert main(["export", str(run), "--out", str(tokens), "--format", "tokens"]) == 0
    assert json.loads(tokens.read_text().splitlines()[0])["assistant_masks"] == [0, 0, 0, 1, 1, 0, 0, 1, 1, 1]


def test_weights_in_the_vision_layout(tmp_path: Path) -> None:
    """A turn with a good call and a broken one weighs 0 (it teaches the broken call too); the
    weight sits on the assistant message of TRL's vision layout as well."""
    res = toolenv.rollout(lambda: toolenv.ToolEnv(tools=[snap], tasks=TASKS[:1], max_turns=4), Snapper())
    assert export_chat(res.trajectories, tmp_path / "sft.jsonl", weights=True) == 1
    (line,) = [json.loads(x) for x in (tmp_path / "sft.jsonl").read_text().splitlines()]
    assert "images" in line and _weights(line["messages"]) == [1, 0, 1]


def test_trl_tokenizes_a_weighted_export_as_the_plain_one(run_dir: Path, tmp_path: Path) -> None:
    """TRL 1.16's SFT data path passes each message to the chat template as it is: the `weight`
    key loads (`datasets`, a null on the other roles) and changes no token, and TRL does not
    use it (what the docs say)."""
    pytest.importorskip("trl", reason="the TRL checks need trl (pip install toolenv[trl]); CI installs it")
    import tempfile

    from datasets import load_dataset
    from transformers import AutoTokenizer
    from trl.data_utils import _tokenize

    from toolenv.integrations.verl.tiny import build_tiny_qwen2

    tokenizer: Any = AutoTokenizer.from_pretrained(build_tiny_qwen2(Path(tempfile.mkdtemp())))
    trajs = read_trajectories(run_dir / "trajectories.jsonl")
    ids = []
    for weights in (False, True):
        out = tmp_path / f"{weights}.jsonl"
        export_chat(trajs, out, calls="structured", arguments="object", weights=weights)
        row = load_dataset("json", data_files=str(out), split="train")[0]
        ids.append(_tokenize(tokenizer, row["messages"], tools=[add.schema()])["input_ids"])
    assert ids[0] == ids[1]


# ---------------------------------------------------------------------- a reasoning model's thinking
class Thinker(Agent):
    """A reasoning model behind a server's reasoning parser, as the `openai` agent records it: the
    thinking in the action's `metadata["reasoning"]`, the content (the action) without it."""

    async def act(self, observation: str, messages: list[toolenv.Message], env_info: EnvInfo) -> toolenv.AgentAction:
        turn = env_info.turn
        text = [CALL, "<answer>5</answer>"][turn]
        return toolenv.AgentAction(text=text, metadata={"reasoning": ["I should add 2 and 3.", "It said 5."][turn]})


def test_the_thinking_of_a_reasoning_model_is_exported(run_dir: Path, tmp_path: Path) -> None:
    """Each assistant message carries the turn's thinking as `reasoning_content`, the field vLLM and
    SGLang return it in and Qwen3's chat template (TRL's too) renders as `<think>`: without it an
    SFT on a reasoning model's rollouts teaches it to answer without thinking."""
    run = tmp_path / "run"
    toolenv.rollout(lambda: toolenv.ToolEnv(tools=[add], tasks=TASKS[:1], max_turns=3), Thinker(), out=run)
    (t,) = read_trajectories(run / "trajectories.jsonl")
    for calls in ("text", "structured"):
        msgs = [m for m in chat_messages(t, calls=calls) if m["role"] == "assistant"]  # type: ignore[arg-type]
        assert [m.get("reasoning_content") for m in msgs] == ["I should add 2 and 3.", "It said 5."]
    assert all("reasoning_content" not in m for m in chat_messages(_trajectory(run_dir, "right")))  # none recorded
    pytest.importorskip("trl", reason="the TRL checks need trl (pip install toolenv[trl]); CI installs it")
    import tempfile

    from transformers import AutoTokenizer
    from trl.chat_template_utils import qwen3_chat_template

    from toolenv.integrations.verl.tiny import build_tiny_qwen2

    tokenizer: Any = AutoTokenizer.from_pretrained(build_tiny_qwen2(Path(tempfile.mkdtemp())))
    msgs = chat_messages(t, calls="structured", arguments="object")
    text = tokenizer.apply_chat_template(msgs, tools=[add.schema()], chat_template=qwen3_chat_template, tokenize=False)
    assert "<think>\nI should add 2 and 3.\n</think>" in text and "<think>\nIt said 5.\n</think>" in text


class Stuck(Agent):
    """Only broken calls: no turn worth training on."""

    async def act(self, observation: str, messages: list[toolenv.Message], env_info: EnvInfo) -> str:
        return '<tool_call>{"name": "add", "arguments": </tool_call>'


class TokensThenGivesUp(Tokens):
    """`Tokens`, whose last turn (a row of its own) holds neither a call nor an answer."""

    async def act(self, observation: str, messages: list[toolenv.Message], env_info: EnvInfo) -> toolenv.AgentAction:
        action = await super().act(observation, messages, env_info)
        return action.model_copy(update={"text": "I give up."}) if env_info.turn == 2 else action


def test_with_weights_an_episode_or_row_with_nothing_to_train_on_is_left_out(tmp_path: Path) -> None:
    """Every weight 0 is nothing to learn (and a batch of such rows has no loss to average): with
    `weights` such an episode gets no line, and a token row whose mask is left all 0 is not written."""
    stuck = toolenv.rollout(lambda: toolenv.ToolEnv(tools=[add], tasks=TASKS[:1], max_turns=2), Stuck())
    assert export_chat(stuck.trajectories, tmp_path / "plain.jsonl") == 1
    assert export_chat(stuck.trajectories, tmp_path / "w.jsonl", weights=True) == 0
    res = toolenv.rollout(lambda: toolenv.ToolEnv(tools=[add], tasks=TASKS[:1], max_turns=3), TokensThenGivesUp())
    (t,) = res.trajectories
    assert t.truncated and [trains_on(turn) for turn in t.turns] == [False, True, False]
    assert export_tokens(res.trajectories, tmp_path / "t.jsonl", weights=True) == 1
    (row,) = [json.loads(x) for x in (tmp_path / "t.jsonl").read_text().splitlines()]
    assert row["assistant_masks"] == [0, 0, 0, 0, 0, 0, 0, 1, 1, 1] and row["metadata"]["turns"] == [0, 1]
    assert export_tokens(stuck.trajectories, tmp_path / "none.jsonl", weights=True) == 0
    assert export_tokens(res.trajectories, tmp_path / "all.jsonl") == 1
    assert len((tmp_path / "all.jsonl").read_text().splitlines()) == 2  # without weights: both rows


def test_a_private_export_stays_private_when_written_again(run_dir: Path, tmp_path: Path) -> None:
    """The file replaced keeps its permissions: data a user made readable to themselves alone
    (`chmod 600`) is not left readable by others by the next export over it; a new file gets
    the umask's."""
    import os
    import stat

    out = tmp_path / "sft.jsonl"
    trajs = read_trajectories(run_dir / "trajectories.jsonl")
    export_chat(trajs, out)
    os.chmod(out, 0o600)
    export_chat(trajs, out)
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    fresh = tmp_path / "new.jsonl"
    umask = os.umask(0o022)
    os.umask(umask)
    export_chat(trajs, fresh)
    assert stat.S_IMODE(fresh.stat().st_mode) == 0o666 & ~umask


# ---------------------------------------------------------------------- non-finite rewards
def _strict_json(text: str) -> Any:
    """JSON as RFC 8259 has it: NaN and Infinity are no JSON numbers (JavaScript's JSON.parse,
    serde_json and OpenAI's fine-tuning upload refuse them), so a line holding one is refused."""

    def refuse(constant: str) -> Any:
        raise ValueError(f"{constant} is not JSON")

    return json.loads(text, parse_constant=refuse)


def test_min_reward_leaves_out_an_episode_whose_reward_is_nan(run_dir: Path, tmp_path: Path) -> None:
    """A NaN reward (a reward function that divided by zero) is not "at least" any reward:
    `--min-reward` leaves it out, as it leaves out any reward below the bound."""
    right = _trajectory(run_dir, "right")
    nan = right.model_copy(update={"reward": float("nan"), "sample": 1})
    assert export_chat([right, nan], tmp_path / "chat.jsonl", min_reward=0.0) == 1
    (line,) = [json.loads(x) for x in (tmp_path / "chat.jsonl").read_text().splitlines()]
    assert line["metadata"]["sample"] == 0


@pytest.mark.parametrize("reward", [float("nan"), float("inf"), float("-inf")])
def test_an_export_with_a_non_finite_reward_is_strict_json(run_dir: Path, tmp_path: Path, reward: float) -> None:
    """Every line of an export is JSON any reader takes: a non-finite reward in `metadata`, which
    JSON has no number for, is null (as a non-finite logprob is in a token export), not a bare `NaN`."""
    right = _trajectory(run_dir, "right").model_copy(update={"reward": reward})
    with_tokens = right.model_copy(
        update={"turns": [t.model_copy(update={"prompt_token_ids": [1], "token_ids": [2]}) for t in right.turns[:1]]}
    )
    assert export_chat([right], tmp_path / "chat.jsonl") == 1
    assert export_tokens([with_tokens], tmp_path / "tokens.jsonl") == 1
    for name in ("chat.jsonl", "tokens.jsonl"):
        (line,) = [_strict_json(x) for x in (tmp_path / name).read_text().splitlines()]
        assert line["metadata"]["reward"] is None


@pytest.mark.parametrize("source", ["tools.jsn", "mytools.JSON", "toolenv/Nope-v0"])
def test_cli_tools_that_name_neither_a_file_nor_an_env_say_so(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], source: str
) -> None:
    """A --tools file name with a typo was read as an env id: the error was Gymnasium's alone,
    `Environment `tools.jsn` doesn't exist. Did you mean: `Hopper`?`, naming no option."""
    out = tmp_path / "sft.jsonl"
    assert main(["export", str(run_dir), "--out", str(out), "--tools", source]) == 2
    err = capsys.readouterr().err
    start = f"toolenv export: error: --tools {source}: no such file, nor an env id Gymnasium knows ("
    assert err.startswith(start) and err.count("\n") == 1, err
    assert not out.exists()
