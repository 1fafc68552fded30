"""VisualSearch-v0: deterministic tasks, the oracle scores 1.0, and the crop really shows the code."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
from gymnasium.utils.env_checker import check_env
from PIL import Image, ImageChops

import toolenv
import toolenv_vision
from toolenv_vision import CodeOverlay, CropArgs, CropTool, code_patch, generate_tasks, task_image, visualsearch_oracle
from toolenv_vision.envs import DEFAULT_OVERVIEW_SIZE, make_visualsearch_env


def test_tasks_are_deterministic_and_extend_by_count() -> None:
    a, b = generate_tasks(20, seed=3), generate_tasks(20, seed=3)
    assert [t.model_dump() for t in a] == [t.model_dump() for t in b]
    assert [t.id for t in generate_tasks(30, seed=3)][:20] == [t.id for t in a]
    assert [t.answer for t in generate_tasks(20, seed=4)] != [t.answer for t in a]


def test_oracle_scores_one_on_every_task() -> None:
    env = make_visualsearch_env()
    assert len(env.tasks) == 200

    async def run_all() -> list[float]:
        rewards = []
        for task in env.tasks:
            obs, _ = await env.areset(options={"task": task})
            total, turn = 0.0, 0
            while True:
                obs, r, term, trunc, info = await env.astep(visualsearch_oracle(task, turn, obs))
                total += float(r)
                turn += 1
                if term or trunc:
                    break
            rewards.append(total)
        return rewards

    rewards = asyncio.run(run_all())
    assert rewards == [1.0] * 200


def test_the_crop_shows_the_drawn_code() -> None:
    env = make_visualsearch_env(num_tasks=12)
    exact = CropTool(view_from_task=False)  # pixels of the full task image: crop exactly the code's box
    assert len(env.tasks) == 12  # no tasks would pass the loop below without a check
    for task in env.tasks:
        env.reset(options={"task": task})
        _, _, _, _, info = env.step(visualsearch_oracle(task, 0, ""))
        (result,) = info["tool_results"]
        assert not result.is_error, result.text
        render = task.context["render"]
        expected = code_patch(task.answer, tuple(render["fg"]), tuple(render["bg"]))
        # the oracle's box (overview pixels, rounded outwards) covers the code, pasted there unchanged
        x1, y1, x2, y2 = task.context["box"]
        c1, d1, c2, d2 = result.metadata["bbox"]
        assert c1 <= x1 and d1 <= y1 and c2 >= x2 and d2 >= y2, (task.id, result.metadata["bbox"])
        region = task_image(task.context).crop((c1, d1, c2, d2))
        assert region.crop((x1 - c1, y1 - d1, x2 - c1, y2 - d1)).tobytes() == expected.tobytes()
        exact_result = exact.crop(CropArgs(bbox=task.context["box"], units="pixels"), task)
        assert not exact_result.is_error, exact_result.text
        crop = exact_result.images[0].to_pil().convert("RGB")
        # the crop is the code patch enlarged: shrink it back and compare pixel by pixel
        back = crop.resize(expected.size, Image.Resampling.NEAREST)
        diff = ImageChops.difference(back, expected)
        mean = sum(diff.tobytes()) / (expected.width * expected.height * 3)
        assert mean < 12, (task.id, mean)


def test_overview_is_too_coarse_and_rides_in_the_first_message() -> None:
    env = make_visualsearch_env(num_tasks=2)
    obs, info = env.reset(options={"task_index": 0})
    (image,) = info["messages"][-1].images
    assert max(image.width, image.height) <= DEFAULT_OVERVIEW_SIZE
    full = task_image(env.tasks[0].context)
    assert max(full.size) / max(image.width, image.height) >= 2.5  # the code shrinks to a few pixels
    assert "crop" in obs
    # JPEG: a photo overview is a fraction of its PNG size, and decodes to the same picture.
    assert image.mime == "image/jpeg" and image.to_pil().size == (image.width, image.height)
    png = toolenv.ToolImage.from_pil(image.to_pil())
    assert len(image.data) * 3 < len(png.data)


def test_wrong_answer_scores_zero_and_hermes_is_default() -> None:
    env = make_visualsearch_env(num_tasks=1)
    env.reset(options={"task_index": 0})
    assert isinstance(env.parser, toolenv.get_parser("hermes").__class__)
    assert env.step("<answer>NOPE</answer>")[1] == 0.0


def test_checker_passes() -> None:
    check_env(gym.make("toolenv/VisualSearch-v0", num_tasks=5).unwrapped)
    results = __import__("toolenv.checker", fromlist=["check_env"]).check_env(make_visualsearch_env(num_tasks=5))
    assert all(r.ok for r in results), [r for r in results if not r.ok]


def test_example_runs() -> None:
    example = Path(__file__).resolve().parents[3] / "examples" / "vision_example.py"
    out = subprocess.run([sys.executable, str(example)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    last = json.loads(out.stdout.strip().splitlines()[-1])
    assert last["reward"] == 1.0 and last["crop_size"][0] >= 224


def test_cropping_the_whole_picture_shows_no_more_than_the_overview() -> None:
    # At 1024x1024 a crop of [0, 0, 1, 1] showed the code legibly: one fixed action, no search.
    env = make_visualsearch_env(num_tasks=3)
    for task in env.tasks:
        env.reset(options={"task": task})
        call = '<tool_call>{"name": "crop", "arguments": {"bbox": [0, 0, 1, 1]}}</tool_call>'
        (result,) = env.step(call)[4]["tool_results"]
        assert not result.is_error, result.text
        (whole,) = result.images
        assert whole.width * whole.height <= DEFAULT_OVERVIEW_SIZE**2, (whole.width, whole.height)
        assert whole.width / task.context["size"][0] < 0.5  # the ~9 px capitals shrink to under 4.5 px
    # a crop around the code is still enlarged, and a caller's own limit still wins
    env.reset(options={"task": env.tasks[0]})
    (result,) = env.step(visualsearch_oracle(env.tasks[0], 0, ""))[4]["tool_results"]
    assert result.metadata["zoom"] > 2
    (tool,) = make_visualsearch_env(num_tasks=1, max_pixels=1024 * 1024).tools
    assert tool.max_pixels == 1024 * 1024


def test_a_code_that_is_an_article_is_not_the_empty_answer() -> None:
    # SQuAD normalisation drops "a", "an" and "the": the code "A" became "", which an empty
    # answer (or "the") matched for a full reward.
    env = make_visualsearch_env(num_tasks=60, code_length=1)
    task = next(t for t in env.tasks if t.answer == "A")
    for answer, reward in [("", 0.0), ("the", 0.0), ("A", 1.0), ("a", 1.0), (" A. ", 1.0), ("C", 0.0)]:
        env.reset(options={"task": task})
        _, r, terminated, _, info = env.step(f"<answer>{answer}</answer>")
        assert terminated and r == reward, (answer, r)
        assert set(info["reward_components"]) == {"exact_match"}
    other = next(t for t in env.tasks if t.answer == "C")
    env.reset(options={"task": other})
    assert env.step("<answer>c</answer>")[1] == 1.0


def test_spaces_inside_a_code_are_ignored_like_punctuation() -> None:
    # The docs promise case, punctuation and spacing ignored: "J6-TA" matched "J6TA", "J6 TA" did not.
    env = make_visualsearch_env(num_tasks=1)
    (task,) = env.tasks
    code = task.answer
    assert code is not None and len(code) == 4
    for answer, reward in [
        (code, 1.0),
        (f"{code[:2]}-{code[2:]}", 1.0),
        (f"{code[:2]} {code[2:]}", 1.0),
        (" ".join(code.lower()), 1.0),
        (code[:3], 0.0),
    ]:
        env.reset(options={"task": task})
        assert env.step(f"<answer>{answer}</answer>")[1] == reward, answer


def test_generated_tasks_use_the_photos_of_the_image_root(tmp_path: Path) -> None:
    # make_visualsearch_env(image_root=...) generated tasks over the bundled photo names, which the
    # env then looked for under the given root: every reset raised "image 'chelsea.png' not found".
    Image.open(Path(toolenv_vision.DATA_DIR) / "coffee.png").save(tmp_path / "mine.png")
    Image.open(Path(toolenv_vision.DATA_DIR) / "coins.png").convert("RGB").save(tmp_path / "other.jpg")
    (tmp_path / "notes.txt").write_text("not a photo")
    env = make_visualsearch_env(num_tasks=6, image_root=tmp_path)
    assert {t.context["image"] for t in env.tasks} == {"mine.png", "other.jpg"}
    for task in env.tasks:
        _, info = env.reset(options={"task": task})
        assert info["messages"][-1].images
        (result,) = env.step(visualsearch_oracle(task, 0, ""))[4]["tool_results"]
        assert not result.is_error, result.text
        assert env.step(visualsearch_oracle(task, 1, ""))[1] == 1.0
    assert [t.context["image"] for t in generate_tasks(3, photos=["mine.png"], image_root=tmp_path)] == ["mine.png"] * 3


def test_a_task_whose_recipe_is_a_code_overlay_resets() -> None:
    # task_image takes context["render"] as a dict or a CodeOverlay; the overview made at reset
    # keyed its cache with json.dumps, so a task built in Python with a CodeOverlay raised
    # "TypeError: Object of type CodeOverlay is not JSON serializable" out of reset.
    env = make_visualsearch_env(num_tasks=1)
    (task,) = env.tasks
    typed = task.model_copy(update={"context": {**task.context, "render": CodeOverlay(**task.context["render"])}})
    _, plain = env.reset(options={"task": task})
    _, info = env.reset(options={"task": typed})
    assert info["messages"][-1].images[0].data == plain["messages"][-1].images[0].data
    (result,) = env.step(visualsearch_oracle(typed, 0, ""))[4]["tool_results"]
    assert not result.is_error, result.text


def test_unicode_quotes_stops_and_full_width_forms_are_ignored_like_ascii_punctuation() -> None:
    # CodeMatch promised punctuation ignored, but only ASCII's: the right code in curly quotes
    # (“J6TA”), before a Chinese full stop (Qwen's), in full-width letters or with a zero-width
    # space scored 0, a wrong reward for a right answer.
    env = make_visualsearch_env(num_tasks=1)
    (task,) = env.tasks
    code = task.answer
    assert code is not None
    wide = "".join(chr(ord(c) + 0xFEE0) for c in code)  # Ｊ６ＴＡ: the full-width forms
    for answer, reward in [
        (f"“{code}”", 1.0),
        (f"«{code}»", 1.0),
        (f"{code}。", 1.0),
        (f"「{code}」", 1.0),
        (wide, 1.0),
        (f"{code[:2]}\u200b{code[2:]}", 1.0),
        (f"{code[:2]}\u2013{code[2:]}", 1.0),
        (f"“{code[:3]}”", 0.0),
        ("“”", 0.0),
    ]:
        env.reset(options={"task": task})
        assert env.step(f"<answer>{answer}</answer>")[1] == reward, answer
