"""Env step overhead with a trivial in-process tool: toolenv against GEM and SkyRL-gym, in one run.

Every framework gets the same model turn, a Hermes-style
`<tool_call>{"name": "noop", "arguments": {"x": 1}}</tool_call>`, and a tool
that only answers "ok", written the way each framework expects:

- toolenv: a `Tool` with a typed `Args` model (the call is validated), via
  `step` (sync) and `astep` (async).
- GEM (`gem-llm`): a `BaseTool` whose `execute_action` parses the call, inside
  `ToolEnvWrapper` around a minimal `gem.core.Env`.
- SkyRL-gym (`skyrl-gym`): a `BaseTextEnv` whose `step` parses the call and runs
  a `ToolGroup` `@tool`, returning its `BaseTextEnvStepOutput`.

The peers' tools parse with a regex and `json.loads` (their own idiom) and do no
typed validation; the "bare parse" row is that parse alone. The "typed floor" row is the
least any typed step does: toolenv's parse into a ToolCall, Pydantic validation of the
arguments and the tool's run, with no turn, record, messages, reward or info.
Episodes are 8 steps long and every figure is per step with the reset amortised
in: toolenv keeps the whole episode (turns, messages) for rewards and reports,
and an endless episode would measure Python's garbage collector walking it.
The peers live in a separate venv, `.venv-bench` (see `peers_env.py`): the whole
measurement runs there, in one process, so every row shares one interpreter. The subjects
take turns, round after round (`interleaved`), and each ratio to the fastest peer is the median
of the ratios within a round: the host's speed drifts too much for blocks timed minutes apart.
With `--quick` and no `.venv-bench`, only toolenv is measured, and the output says so.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import peers_env
from _common import interleaved, machine, median, table, write

ACTION = '<tool_call>{"name": "noop", "arguments": {"x": 1}}</tool_call>'
TURNS = 8  # steps per episode; every framework resets between episodes, and the reset is in the figure
_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


def episodes(episode: Callable[[], None]) -> Callable[[int], None]:
    """A subject for `interleaved`: `k` episodes (a reset and TURNS steps each)."""

    def run(k: int) -> None:
        for _ in range(k):
            episode()

    return run


def turns(fn: Callable[[], Any]) -> Callable[[int], None]:
    """A subject for `interleaved`: `fn` TURNS times per unit, so it compares with an episode."""

    def run(k: int) -> None:
        for _ in range(k * TURNS):
            fn()

    return run


def bare_parse(action: str) -> tuple[str, dict[str, Any]] | None:
    """What the peers' tools do to read a call: find the block, decode the JSON."""
    m = _CALL.search(action)
    if m is None:
        return None
    obj = json.loads(m.group(1))
    return obj["name"], obj.get("arguments", {})


# ---------------------------------------------------------------------- toolenv
def toolenv_runners() -> dict[str, Callable[[int], None]]:
    from pydantic import BaseModel

    import toolenv

    class Noop(toolenv.Tool):
        """Do nothing."""

        name = "noop"

        class Args(BaseModel):
            x: int

        async def run(self, args: Any, ctx: toolenv.ToolContext) -> toolenv.ToolResult:
            return toolenv.ToolResult(text="ok")

    def make() -> toolenv.ToolEnv:
        return toolenv.ToolEnv(tools=[Noop()], tasks=[{"question": "q", "answer": "a"}], max_turns=10**9)

    env = make()
    env.reset(seed=0)
    obs = env.step(ACTION)[0]
    assert "ok" in obs, obs

    def episode() -> None:
        env.reset()
        for _ in range(TURNS):
            env.step(ACTION)

    aenv = make()
    loop = asyncio.new_event_loop()  # one loop for every round, as a trainer's worker keeps one

    async def aepisodes(k: int) -> None:
        for _ in range(k):
            await aenv.areset()
            for _ in range(TURNS):
                await aenv.astep(ACTION)

    # The typed floor: what any typed step must do at the least (find and decode the call into
    # a ToolCall, validate its arguments with the Args model, run the tool), with no turn,
    # record, messages, reward or info.
    parser = toolenv.get_parser("hermes")
    validate = Noop.Args.__pydantic_validator__.validate_python
    noop = Noop()
    ctx = toolenv.ToolContext(task=toolenv.Task(question="q"))

    def typed_floor() -> Any:
        call = parser.parse(ACTION).tool_calls[0]
        coro = noop.run(validate(call.arguments), ctx)
        try:
            coro.send(None)
        except StopIteration as stop:
            return stop.value
        raise RuntimeError("the tool suspended")

    assert typed_floor().text == "ok"
    return {
        "toolenv astep": lambda k: loop.run_until_complete(aepisodes(k)),
        "toolenv step": episodes(episode),
        "toolenv typed floor (parse+validate+run)": turns(typed_floor),
    }


# ---------------------------------------------------------------------- GEM
def gem_runner() -> Callable[[int], None]:
    from gem.core import Env  # type: ignore[import-not-found,unused-ignore]
    from gem.tools.base_tool import BaseTool  # type: ignore[import-not-found,unused-ignore]
    from gem.tools.tool_env_wrapper import ToolEnvWrapper  # type: ignore[import-not-found,unused-ignore]

    class QuestionEnv(Env):  # type: ignore[misc]
        """One question; an answer ends the episode."""

        def reset(self, seed: int | None = None) -> tuple[str, dict[str, Any]]:
            return "q", {}

        def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
            return "", 0.0, True, False, {}

    class NoopTool(BaseTool):  # type: ignore[misc]
        tool_type = "noop"
        name = "noop"

        def instruction_string(self) -> str:
            return 'Call <tool_call>{"name": "noop", "arguments": {"x": 1}}</tool_call>.'

        def execute_action(self, action: str) -> tuple[bool, bool, str, str]:
            parsed = bare_parse(action)
            if parsed is None or parsed[0] != self.name:
                return False, False, "", action
            return True, False, "ok", action

    env = ToolEnvWrapper(QuestionEnv(), tools=[NoopTool()], max_tool_uses=None)
    env.reset(seed=0)
    assert env.step(ACTION)[0] == "ok"

    def episode() -> None:
        env.reset()
        for _ in range(TURNS):
            env.step(ACTION)

    return episodes(episode)


# ---------------------------------------------------------------------- SkyRL-gym
def skyrl_runner() -> Callable[[int], None]:
    from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput  # type: ignore[import-not-found,unused-ignore]
    from skyrl_gym.tools.core import ToolGroup, tool  # type: ignore[import-not-found,unused-ignore]

    class NoopGroup(ToolGroup):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__(name="noop_group")

        @tool  # type: ignore[untyped-decorator]
        def noop(self, x: int) -> str:
            return "ok"

    class NoopEnv(BaseTextEnv):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.max_turns = 10**9
            self.init_tool_groups([NoopGroup()])

        def step(self, action: str) -> BaseTextEnvStepOutput:
            self.turns += 1
            parsed = bare_parse(action)
            if parsed is None:
                return BaseTextEnvStepOutput(observations=[], reward=0.0, done=True, metadata={})
            name, args = parsed
            out = self._execute_tool(self.tool_to_toolgroup[name], name, [args["x"]])
            return BaseTextEnvStepOutput(
                observations=[{"role": "user", "content": out}], reward=0.0, done=False, metadata={}
            )

    prompt = [{"role": "user", "content": "q"}]
    env = NoopEnv()
    env.init(prompt)
    assert env.step(ACTION)["observations"][0]["content"] == "ok"

    def episode() -> None:  # SkyRL makes one env per trajectory (its generator does)
        e = NoopEnv()
        e.init(prompt)
        for _ in range(TURNS):
            e.step(ACTION)
        e.close()

    return episodes(episode)


# ---------------------------------------------------------------------- worker and driver
def measure(n: int, rounds: int) -> dict[str, Any]:
    """Every framework importable here, in this process, in turns: seconds per step of each
    round, and what was skipped."""
    subjects: dict[str, Callable[[int], None]] = {
        "bare regex + json.loads (the peers' parse)": turns(lambda: bare_parse(ACTION))
    }
    subjects.update(toolenv_runners())
    skipped: dict[str, str] = {}
    versions: dict[str, str] = {}
    from importlib import metadata

    for label, dist, runner in [
        ("GEM ToolEnvWrapper", "gem-llm", gem_runner),
        ("SkyRL BaseTextEnv", "skyrl-gym", skyrl_runner),
    ]:
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            skipped[label] = f"{dist} is not installed in {sys.prefix}"
            continue
        subjects[label] = runner()
    for dist in ("toolenv", "pydantic", "gymnasium"):
        versions[dist] = metadata.version(dist)
    per_round = interleaved(subjects, max(1, n // TURNS // rounds), rounds)
    return {
        "rounds": {k: [v / TURNS for v in vs] for k, vs in per_round.items()},
        "skipped": skipped,
        "versions": versions,
        "python": peers_env.shown(sys.executable),
    }


PEERS = ("GEM ToolEnvWrapper", "SkyRL BaseTextEnv")


def round_ratios(rounds: dict[str, list[float]], name: str) -> list[float]:
    """`name`'s time over the fastest peer's, within each round."""
    peers = [p for p in PEERS if p in rounds]
    return [t / min(rounds[p][i] for p in peers) for i, t in enumerate(rounds[name])]


def report(result: dict[str, Any], quick: bool, n: int, out: Path | None, note: str) -> None:
    rounds: dict[str, list[float]] = result["rounds"]
    sec = {k: median(v) for k, v in rounds.items()}
    has_peers = any(p in rounds for p in PEERS)
    ratios = {k: median(round_ratios(rounds, k)) for k in rounds} if has_peers else {}
    rows = [
        [name, s * 1e6, min(rounds[name]) * 1e6, ratios.get(name, float("nan"))]
        for name, s in sorted(sec.items(), key=lambda kv: kv[1])
    ]
    table(rows, ["env step", "µs/step (median)", "best round", "× fastest peer (within rounds)"])
    print(f"{len(next(iter(rounds.values())))} rounds, the subjects in turns; medians over rounds")
    for label, why in result["skipped"].items():
        print(f"not measured: {label}: {why}")
    if has_peers:
        astep = ratios["toolenv astep"]
        print(
            f"goal: toolenv's step overhead at most the fastest peer's: astep {astep:.2f}×, "
            f"step {ratios['toolenv step']:.2f}× ({'met' if astep <= 1.0 else 'NOT met'})"
        )
    if note:
        print(note)
    write(
        "peers_step",
        {
            "quick": quick,
            "n": n,
            "action": ACTION,
            "turns_per_episode": TURNS,
            "us_per_step": {k: v * 1e6 for k, v in sec.items()},
            "us_per_step_by_round": {k: [x * 1e6 for x in v] for k, v in rounds.items()},
            "ratio_to_fastest_peer": ratios,
            "ratio_to_toolenv_astep": {k: v / sec["toolenv astep"] for k, v in sec.items()},
            "skipped": result["skipped"],
            "versions": result["versions"],
            "measured_with": result["python"],
            "note": note,
        },
        out,
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--quick", action="store_true", help="a few seconds; numbers are not meaningful")
    p.add_argument("--out", type=Path, default=None, help="JSON output path")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    n, rounds = (240, 3) if args.quick else (30_000, 15)
    if args.worker:  # inside .venv-bench: measure and hand the numbers back as JSON
        print(json.dumps(measure(n, rounds)))
        return 0

    note = ""
    if not args.quick:
        peers_env.ensure()
    if peers_env.PY.exists():
        proc = subprocess.run(
            [str(peers_env.PY), str(Path(__file__).resolve()), "--worker", *(["--quick"] if args.quick else [])],
            capture_output=True,
            text=True,
            cwd=Path(__file__).resolve().parent,
            check=False,
        )
        if proc.returncode != 0:
            print(proc.stderr, file=sys.stderr)
            print(f"bench_peers_step: the worker in {peers_env.shown(peers_env.VENV)} failed", file=sys.stderr)
            return 1
        result = json.loads(proc.stdout.strip().splitlines()[-1])
    else:
        absent = peers_env.shown(peers_env.VENV)
        note = f"{absent} is absent (--quick does not create it): toolenv only, peers not measured"
        result = measure(n, rounds)
    venv = Path(result["python"]).parent.parent.name
    print(f"machine: {machine()['processor']}, {machine()['cpus']} CPUs; measured with {venv}/bin/python")
    report(result, args.quick, n, args.out, note)
    return 0


if __name__ == "__main__":
    sys.exit(main())
