"""Crop tool latency: the whole tool call (validate, crop, resize, PNG encode) against a bare Pillow crop+resize."""

from __future__ import annotations

import asyncio
import statistics
import time

from _common import parse_args, table, write
from PIL import Image

from toolenv import ToolCall, ToolCaller, ToolContext
from toolenv_vision import CropTool, generate_tasks, task_image


def main() -> None:
    args = parse_args(__doc__ or "")
    n = 20 if args.quick else 300
    tasks = generate_tasks(20, seed=0)
    tool = CropTool(view_from_task=False)  # the tasks' `box` is in the task image's own pixels
    caller = ToolCaller([tool])

    async def tool_calls() -> list[float]:
        out = []
        for i in range(n):
            task = tasks[i % len(tasks)]
            x1, y1, x2, y2 = task.context["box"]
            call = ToolCall(name="crop", arguments={"bbox": [x1 - 8, y1 - 8, x2 + 8, y2 + 8]}, id="c")
            t0 = time.perf_counter()
            (res,), _ = await caller.invoke([call], ToolContext(task=task))
            out.append(time.perf_counter() - t0)
            assert not res.is_error, res.text
        return out

    def bare() -> list[float]:
        out = []
        for i in range(n):
            task = tasks[i % len(tasks)]
            x1, y1, x2, y2 = task.context["box"]
            img = task_image(task.context)
            t0 = time.perf_counter()
            region = img.crop((x1 - 8, y1 - 8, x2 + 8, y2 + 8))
            region.resize((224 * region.width // region.height, 224), Image.Resampling.LANCZOS)
            out.append(time.perf_counter() - t0)
        return out

    for t in tasks:  # warm the render cache: both sides then crop cached images
        task_image(t.context)
    tool_s = asyncio.run(tool_calls())
    bare_s = bare()
    tm, bm = statistics.median(tool_s) * 1e3, statistics.median(bare_s) * 1e3
    table([["crop tool call", tm, tm / bm], ["bare Pillow crop+resize", bm, 1.0]], ["path", "median ms", "× bare"])
    write("vision", {"quick": args.quick, "n": n, "tool_ms": tm, "bare_ms": bm}, args.out)


if __name__ == "__main__":
    main()
