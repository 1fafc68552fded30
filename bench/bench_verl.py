"""verl integration: agent-loop overhead per turn, and per-trajectory async rollout against a turn barrier.

1. Overhead per turn, generation excluded (a server that answers at once with scripted
   tokens; the time inside `generate` is subtracted). Side by side on the same episodes
   (3 calculator calls, then the answer) and the tiny offline Qwen2 tokenizer:
     env.astep alone             toolenv's parse + tool call + observation + reward
     ToolEnvAgentLoop            the above plus verl's continuous-token bookkeeping
     verl ToolAgentLoop+adapter  verl's built-in loop calling the tool through ToolEnvBaseTool

2. Rollout throughput on a simulated workload: episodes with 0-5 tool turns, per-turn
   generation latency (uniform) and tool latency (log-normal, heavy tail), all as real
   asyncio sleeps in a scripted server and a `work` tool run by the real ToolEnv:
     turn-synchronous batch      every turn, all live episodes generate, then all call tools;
                                 each phase waits for the slowest episode (RL-Factory's loop)
     per-trajectory async        each episode runs its own turns (what verl's AgentLoopWorker does
                                 with one agent loop per sample), same driver code
     ToolEnvAgentLoop            the real loop, one asyncio task per episode
   and reports the speedup of per-trajectory async over the turn barrier.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import random
import re
import tempfile
import time
from typing import Any

from _common import median, parse_args, table, write
from pydantic import BaseModel, Field

import toolenv
from toolenv.integrations.verl.demo import Calculator
from toolenv.integrations.verl.tiny import build_tiny_qwen2

CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "6 * 7"}}\n</tool_call>'


def rollout_config(response_length: int = 4096, max_turns: int = 64) -> Any:
    from omegaconf import OmegaConf

    multi_turn = {
        "format": "hermes",
        "max_user_turns": max_turns,
        "max_assistant_turns": max_turns,
        "max_parallel_calls": 1,
        "max_tool_response_length": 4096,
        "tool_response_truncate_side": "middle",
    }
    rollout = {"prompt_length": 2048, "response_length": response_length, "full_determinism": False}
    return OmegaConf.create(
        {
            "actor_rollout_ref": {"rollout": {**rollout, "multi_turn": multi_turn}},
            "data": {"apply_chat_template_kwargs": {}},
        }
    )


_CONFIG: list[Any] = []


def make_loop(cls: Any, tokenizer: Any, server: Any, tools: list[Any]) -> Any:
    """A loop built as verl's worker builds one per sample (one config object shared by all)."""
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap
    from verl.utils.dataset.rl_dataset import RLHFDataset

    if not _CONFIG:
        _CONFIG.append(rollout_config())
    cfg = _CONFIG[0]
    return cls(
        trainer_config=DictConfigWrap(cfg),
        server_manager=server,
        tokenizer=tokenizer,
        processor=None,
        dataset_cls=RLHFDataset,
        data_config=DictConfigWrap(cfg.data),
        hf_model_type="qwen2",
        tools=ToolListWrap(tools),
    )


class TimedServer:
    """Scripted replies keyed by how many tool results the prompt holds; records time spent inside."""

    def __init__(self, tokenizer: Any, replies: list[str], delay: Any = None) -> None:
        self.tokenizer = tokenizer
        self.replies = [tokenizer.encode(r + "<|im_end|>", add_special_tokens=False) for r in replies]
        self.delay = delay
        self.inside = 0.0
        self.calls = 0

    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any], **kw: Any):
        from verl.workers.rollout.replica import TokenOutput

        t0 = time.perf_counter()
        self.calls += 1
        text = self.tokenizer.decode(prompt_ids[-400:])
        turn = text.count("<tool_response>")
        ids = self.replies[min(turn, len(self.replies) - 1)]
        if self.delay is not None:
            ids = await self.delay(self.tokenizer.decode(prompt_ids), turn)
        self.inside += time.perf_counter() - t0
        return TokenOutput(token_ids=ids, log_probs=[-0.1] * len(ids))


# ---------------------------------------------------------------------------------------------- part 1
async def overhead(tokenizer: Any, episodes: int) -> dict[str, float]:
    from verl.experimental.agent_loop.tool_agent_loop import ToolAgentLoop

    from toolenv.integrations.verl.agent_loop import ToolEnvAgentLoop
    from toolenv.integrations.verl.base_tool import ToolEnvBaseTool
    from toolenv.integrations.verl.data import abuild_rows

    replies = [CALL, CALL, CALL, "The answer is <answer>42</answer>"]
    calc = "toolenv.integrations.verl.demo:Calculator"
    row = (
        await abuild_rows(
            "toolenv/ToolEnv-v0", env_kwargs={"tools": [calc], "tasks": [{"question": "6*7?", "answer": "42"}]}
        )
    )[0]
    kwargs = {"raw_prompt": row["prompt"], "extra_info": row["extra_info"], "tools_kwargs": {}}
    turns = len(replies)

    env = toolenv.ToolEnv(tools=[Calculator()], tasks=[{"question": "6*7?", "answer": "42"}], max_turns=10)
    texts = [tokenizer.decode(tokenizer.encode(r, add_special_tokens=False), skip_special_tokens=True) for r in replies]
    per_turn: dict[str, list[float]] = {"env.astep alone": [], "ToolEnvAgentLoop": [], "verl ToolAgentLoop+adapter": []}
    with contextlib.redirect_stdout(io.StringIO()):  # BaseTool prints its schema
        adapter = ToolEnvBaseTool(tool=Calculator())
    for _ in range(episodes):
        t0 = time.perf_counter()
        await env.areset()
        for text in texts:
            await env.astep(text)
        per_turn["env.astep alone"].append((time.perf_counter() - t0) / turns)

        server = TimedServer(tokenizer, replies)
        loop = make_loop(ToolEnvAgentLoop, tokenizer, server, [])
        t0 = time.perf_counter()
        out = await loop.run({}, **kwargs)
        assert out.reward_score == 1.0
        per_turn["ToolEnvAgentLoop"].append((time.perf_counter() - t0 - server.inside) / server.calls)

        server = TimedServer(tokenizer, replies)
        loop = make_loop(ToolAgentLoop, tokenizer, server, [adapter])
        t0 = time.perf_counter()
        await loop.run({}, **kwargs)
        per_turn["verl ToolAgentLoop+adapter"].append((time.perf_counter() - t0 - server.inside) / server.calls)
    return {k: median(v) * 1e3 for k, v in per_turn.items()}


# ---------------------------------------------------------------------------------------------- part 2
class Work(toolenv.Tool):
    """Do some work that takes `ms` milliseconds (stands for a search, a query, a sandbox run)."""

    name = "work"

    class Args(BaseModel):
        ms: float = Field(ge=0, le=10_000)

    async def run(self, args: Any, ctx: toolenv.ToolContext) -> toolenv.ToolResult:
        await asyncio.sleep(args.ms / 1e3)
        return toolenv.ToolResult(text="done")


def workload(episodes: int, scale: float, seed: int = 0) -> list[list[tuple[float, float]]]:
    """Per episode, per turn: (generation ms, tool ms); the last turn answers (tool ms 0)."""
    rng = random.Random(seed)
    plans = []
    for _ in range(episodes):
        tool_turns = rng.randint(0, 5)
        plan = [
            (rng.uniform(20, 120) * scale, min(rng.lognormvariate(3.7, 1.0), 800) * scale) for _ in range(tool_turns)
        ]
        plan.append((rng.uniform(20, 120) * scale, 0.0))
        plans.append(plan)
    return plans


def sim_server(tokenizer: Any, plans: list[list[tuple[float, float]]]) -> TimedServer:
    async def delay(prompt: str, turn: int) -> list[int]:
        episode = int(re.findall(r"Episode (\d+)", prompt)[-1])
        gen_ms, tool_ms = plans[episode][turn]
        await asyncio.sleep(gen_ms / 1e3)
        last = turn == len(plans[episode]) - 1
        text = (
            "<answer>ok</answer>"
            if last
            else f'<tool_call>\n{{"name": "work", "arguments": {{"ms": {tool_ms:.3f}}}}}\n</tool_call>'
        )
        return tokenizer.encode(text + "<|im_end|>", add_special_tokens=False)

    return TimedServer(tokenizer, [""], delay=delay)


def sim_tasks(n: int) -> list[dict[str, Any]]:
    return [{"id": str(i), "question": f"Episode {i}: do the work.", "answer": "ok"} for i in range(n)]


async def text_driver(tokenizer: Any, plans: list[list[tuple[float, float]]], synchronous: bool) -> float:
    """Text-level multi-turn driver; `synchronous` puts a barrier after each generate and each tool phase."""
    server = sim_server(tokenizer, plans)
    envs = [toolenv.ToolEnv(tools=[Work()], tasks=sim_tasks(len(plans)), max_turns=64) for _ in plans]
    histories: list[list[dict[str, Any]]] = []
    for i, env in enumerate(envs):
        _, info = await env.areset(options={"task_index": i})
        histories.append([m.to_openai() for m in info["messages"]])

    async def generate(i: int) -> str:
        text = tokenizer.apply_chat_template(histories[i], tokenize=False, add_generation_prompt=True)
        ids = tokenizer.encode(text, add_special_tokens=False)
        out = await server.generate(str(i), prompt_ids=ids, sampling_params={})
        return str(tokenizer.decode(out.token_ids, skip_special_tokens=True))

    async def act(i: int, action: str) -> bool:
        _, _, terminated, truncated, info = await envs[i].astep(action)
        histories[i].extend(m.to_openai() for m in info["messages"])
        return bool(terminated or truncated)

    async def episode(i: int) -> None:
        while not await act(i, await generate(i)):
            pass

    t0 = time.perf_counter()
    if synchronous:
        live = list(range(len(plans)))
        while live:
            actions = await asyncio.gather(*(generate(i) for i in live))  # barrier: slowest generation
            done = await asyncio.gather(*(act(i, a) for i, a in zip(live, actions, strict=True)))  # slowest tool
            live = [i for i, d in zip(live, done, strict=True) if not d]
    else:
        await asyncio.gather(*(episode(i) for i in range(len(plans))))
    return time.perf_counter() - t0


async def agent_loop_rollout(tokenizer: Any, plans: list[list[tuple[float, float]]]) -> float:
    from toolenv.integrations.verl.agent_loop import ToolEnvAgentLoop
    from toolenv.integrations.verl.data import abuild_rows

    rows = await abuild_rows(
        "toolenv/ToolEnv-v0", env_kwargs={"tools": ["bench_verl:Work"], "tasks": sim_tasks(len(plans)), "max_turns": 64}
    )
    server = sim_server(tokenizer, plans)
    t0 = time.perf_counter()
    outs = await asyncio.gather(
        *(
            make_loop(ToolEnvAgentLoop, tokenizer, server, []).run(
                {}, raw_prompt=r["prompt"], extra_info=r["extra_info"]
            )
            for r in rows
        )
    )
    elapsed = time.perf_counter() - t0
    assert all(o.reward_score == 1.0 for o in outs), [o.extra_fields["toolenv_stop_reason"] for o in outs]
    return elapsed


async def main_async(quick: bool) -> dict[str, Any]:
    from transformers import AutoTokenizer

    with tempfile.TemporaryDirectory() as tmp:
        tokenizer = AutoTokenizer.from_pretrained(build_tiny_qwen2(tmp, with_model=False))

    episodes = 5 if quick else 40
    ms = await overhead(tokenizer, episodes)
    print(f"\nAgent-loop overhead per turn, generation excluded (median of {episodes} episodes x 4 turns)")
    base = ms["verl ToolAgentLoop+adapter"]
    table([[k, v, v / base] for k, v in ms.items()], ["path", "ms/turn", "x verl tool_agent"])

    n, scale = (16, 0.25) if quick else (64, 1.0)
    plans = workload(n, scale)
    ideal_async = max(sum(g + t for g, t in p) for p in plans) / 1e3
    ideal_sync = 0.0
    for turn in range(max(len(p) for p in plans)):
        live = [p[turn] for p in plans if len(p) > turn]
        ideal_sync += (max(g for g, _ in live) + max(t for _, t in live)) / 1e3
    sync_s = await text_driver(tokenizer, plans, synchronous=True)
    async_s = await text_driver(tokenizer, plans, synchronous=False)
    loop_s = await agent_loop_rollout(tokenizer, plans)
    print(f"\nRollout of {n} episodes (0-5 tool turns each; latencies x{scale})")
    rows = [
        ["turn-synchronous batch", sync_s, n / sync_s, 1.0, ideal_sync],
        ["per-trajectory async", async_s, n / async_s, sync_s / async_s, ideal_async],
        ["ToolEnvAgentLoop (async)", loop_s, n / loop_s, sync_s / loop_s, ideal_async],
    ]
    table(rows, ["mode", "wall s", "episodes/s", "speedup", "ideal s"])
    return {
        "quick": quick,
        "overhead_ms_per_turn": ms,
        "rollout": {
            "episodes": n,
            "latency_scale": scale,
            "turns": [len(p) for p in plans],
            "turn_synchronous_s": sync_s,
            "per_trajectory_async_s": async_s,
            "tool_env_agent_loop_s": loop_s,
            "ideal_turn_synchronous_s": ideal_sync,
            "ideal_async_s": ideal_async,
            "speedup_agent_loop_vs_turn_synchronous": sync_s / loop_s,
            "speedup_async_vs_turn_synchronous": sync_s / async_s,
        },
    }


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    write("verl", asyncio.run(main_async(args.quick)), args.out)


if __name__ == "__main__":
    main()
