"""Zoom in with the crop tool on toolenv/VisualSearch-v0 and answer (the oracle's moves)."""

from __future__ import annotations

import json

import gymnasium as gym

import toolenv  # noqa: F401 - registers the toolenv/* env ids
from toolenv_vision import box_in


def main() -> None:
    env = gym.make("toolenv/VisualSearch-v0", num_tasks=5)
    obs, info = env.reset(seed=0)
    task = env.unwrapped.episode.task
    print(obs[-300:])
    print("overview image:", info["messages"][-1].images[0].width, "px wide")
    # The crop tool reads pixels of the overview the model sees (the question states its size),
    # so a box known in the full image's pixels is scaled down first; then 4 px of margin.
    width, height = task.context["overview"]
    x1, y1, x2, y2 = box_in(task.context["box"], task.context["size"], "pixels", (width, height))
    bbox = [max(x1 - 4, 0), max(y1 - 4, 0), min(x2 + 4, width), min(y2 + 4, height)]
    call = {"name": "crop", "arguments": {"bbox": bbox, "units": "pixels"}}
    obs, reward, terminated, truncated, info = env.step(f"<tool_call>{json.dumps(call)}</tool_call>")
    crop = info["tool_results"][0]
    print(crop.text)
    crop.images[0].to_pil().save("/dev/null", format="PNG")  # a real PIL image
    obs, reward, terminated, truncated, info = env.step(f"<answer>{task.answer}</answer>")
    print(json.dumps({"reward": reward, "crop_size": [crop.images[0].width, crop.images[0].height]}))
    env.close()


if __name__ == "__main__":
    main()
