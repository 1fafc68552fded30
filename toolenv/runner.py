"""The rollout runner: an agent against an env, many episodes at once, one JSON line per episode.

Episodes run as coroutines in one event loop, `concurrency` at a time, each
worker owning one env (`gym.make(env_id).unwrapped`, stepped with
`areset`/`astep`). Each finished trajectory is appended to
`OUT/trajectories.jsonl` and flushed, so a run stopped by Ctrl-C keeps what it
wrote and a second run with the same `OUT` skips the finished (task id, sample)
pairs; it refuses the file of another run (another env, agent, model, seed, env arguments,
or a task changed under its id), and one run at a time holds `OUT/.lock`. Agent and env
failures end their episode with `Trajectory.error`, never the run, and so does a value the
trajectory cannot be written with (it is written as null and named in `error`).
`OUT/summary.json` holds the summary of every trajectory in the file: it is removed when a
run starts and written when it ends (Ctrl-C and SIGTERM included).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import math
import re
import time
from collections import Counter
from collections.abc import Callable, Coroutine, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import IO, Any, TypeVar

from pydantic import ValidationError

from toolenv import _aio
from toolenv.agent import Agent, AgentAction, EnvInfo, load_agent
from toolenv.env import ToolEnv
from toolenv.gc_tuning import gen0_threshold_for, tuned_gc
from toolenv.registry import resolved_tools
from toolenv.report.console import Progress
from toolenv.report.summary import Summary, SummaryBuilder
from toolenv.run_output import RunOutput, reaches
from toolenv.trajectory import CallStats, Trajectory, TurnRecord, dump_json, plain_value
from toolenv.types import Task, load_tasks

__all__ = ["RolloutResult", "arollout", "rollout", "run_episode"]

_SECRET_WORDS = ("key", "token", "secret", "password", "authorization")

EnvSpec = str | Callable[[], Any]
T = TypeVar("T")
#: Where a run's trajectories keep their images (see `rollout`).
IMAGE_MODES = ("inline", "files")


@dataclass
class RolloutResult:
    """What a rollout produced: every trajectory in the output (earlier runs' included; none
    with `keep_trajectories=False`), their summary, and how many episodes ran or were skipped."""

    trajectories: list[Trajectory]
    summary: Summary
    out: Path | None = None
    new: int = 0
    skipped: int = 0
    #: Of the `new` episodes, those that ended with an error (a server down fails them all).
    new_errors: int = 0


# ---------------------------------------------------------------------- envs and tasks
def _make_env(env: EnvSpec, env_kwargs: Mapping[str, Any]) -> tuple[ToolEnv, str]:
    """A bare ToolEnv and its id."""
    if isinstance(env, str):
        import gymnasium as gym

        import toolenv._gym

        if env.rpartition(":")[2] not in gym.registry:  # each call reads every entry point (~4 ms)
            toolenv._gym.register_envs()
        made = gym.make(env, **resolved_tools(env_kwargs))  # `--env-arg tools=["sql"]`: tools of its own
        env_id = _bare_id(env)  # `module:ns/Name-v0` is `ns/Name-v0`, its module imported first
    else:
        if env_kwargs:
            raise ValueError("env_kwargs are only used with an env id; pass them to your factory instead")
        made = env()
        spec = getattr(made, "spec", None)
        env_id = getattr(spec, "id", "") or ""
    bare = getattr(made, "unwrapped", made)
    if not isinstance(bare, ToolEnv):
        raise TypeError(f"{env_id or env!r} built {type(bare).__name__}, not a toolenv.ToolEnv")
    return bare, env_id


def _select_tasks(first: ToolEnv, tasks: Any, n: int | None) -> list[Task]:
    chosen = load_tasks(tasks) if tasks is not None else list(first.tasks)
    if not chosen:
        raise ValueError("the env has no tasks; pass tasks=... (or --tasks FILE)")
    if n is not None:
        if n < 1:
            raise ValueError(f"n must be at least 1, got {n}")
        if n > len(chosen):
            raise ValueError(f"asked for {n} episodes but there are only {len(chosen)} tasks (use samples for repeats)")
        chosen = chosen[:n]
    dupes = sorted(k for k, c in Counter(t.id for t in chosen).items() if c > 1)
    if dupes:
        raise ValueError(f"task ids must be unique for a resumable run; repeated: {', '.join(dupes[:5])}")
    return chosen


# ---------------------------------------------------------------------- one episode
def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def _error(where: str, exc: BaseException) -> str:
    msg = str(exc).strip() or type(exc).__name__
    return f"{where}: {type(exc).__name__}: {msg}"[:2000]


class _EpisodeTimeout(Exception):
    """The episode's time ran out (told apart from an agent's or tool's own TimeoutError)."""


def _within(deadline: float | None, aw: Coroutine[Any, Any, T]) -> Coroutine[Any, Any, T]:
    """`aw` itself when there is no deadline (no wrapper per await), else `_before(deadline, aw)`."""
    return aw if deadline is None else _before(deadline, aw)


async def _before(deadline: float, aw: Coroutine[Any, Any, T]) -> T:
    """Await `aw`, or cancel it and raise _EpisodeTimeout when the loop clock passes `deadline`.

    Not `asyncio.wait_for`: its TimeoutError could not be told apart from one the agent or
    a tool raises itself. Like it, a timed-out call is cancelled and awaited, so it is over
    (and the env free for the next episode) when this returns.
    """
    remaining = deadline - asyncio.get_running_loop().time()
    if remaining <= 0:
        aw.close()
        raise _EpisodeTimeout
    task = asyncio.ensure_future(aw)
    try:
        done, _ = await asyncio.wait([task], timeout=remaining)
    except asyncio.CancelledError:  # the run is being stopped: take the call down with it, and
        await _aio.cancel_and_wait(task)  # wait for it, so it is over before the run closes its env
        raise
    if not done:
        await _aio.cancel_and_wait(task)  # a stop of the run arriving meanwhile still comes through
        raise _EpisodeTimeout
    return task.result()


def _timed_out(timeout: float | None, where: str) -> str:
    return f"episode timed out after {timeout:g} s, during {where}"


def _stopping(exc: BaseException) -> bool:
    """Whether `exc` stops the run rather than its episode: a CancelledError while this task is
    being cancelled (Ctrl-C, SIGTERM, a failed worker). One an agent or env lets out of its own
    work (a request it cancelled itself) ends its episode, as any other error does; Python 3.10
    cannot tell the two apart, so there it stops the run, as before."""
    if not isinstance(exc, asyncio.CancelledError):
        return False
    cancelling = getattr(asyncio.current_task(), "cancelling", None)
    return cancelling is None or cancelling() > 0


def _not_spawned(agent: Agent, task: Task, exc: Exception, **fields: Any) -> Trajectory:
    """The trajectory of an episode that never started: `agent.spawn()` raised `exc`."""
    return Trajectory(
        agent=agent.label,
        model=agent.model,
        task=task,
        started_at=_now(),
        error=_error("agent failed to start", exc),
        **fields,
    )


async def run_episode(
    env: ToolEnv,
    agent: Agent,
    task: Task,
    *,
    env_id: str = "",
    sample: int = 0,
    seed: int | None = None,
    success_threshold: float = 1.0,
    timeout: float | None = None,
    episode: int | None = None,
) -> Trajectory:
    """Play one episode of `task` with `agent` (already spawned for it) and record it.

    `episode` is its number in the rollout (`EnvInfo.episode`), for agents that seed by it.

    Never raises for agent or env failures: they end the episode with `error` set. With
    `timeout`, an episode still running after that many seconds ends the same way, with
    the turns it finished.
    """
    if timeout is not None and not timeout > 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    start = time.perf_counter()
    deadline = None if timeout is None else asyncio.get_running_loop().time() + timeout
    traj = Trajectory(
        env_id=env_id, agent=agent.label, model=agent.model, task=task, sample=sample, seed=seed, started_at=_now()
    )
    try:
        native = agent.uses_native_tools(env.parser)
    except Exception as exc:  # noqa: BLE001 - recorded in the trajectory
        traj.error = _error("agent failed to say how it sends the tools", exc)
        traj.duration_s = time.perf_counter() - start
        return traj
    try:
        options: dict[str, Any] = {"task": task, "native_tools": True} if native else {"task": task}
        obs, info = await _within(deadline, env.areset(seed=seed, options=options))
    except _EpisodeTimeout:
        traj.error = _timed_out(timeout, "env reset")
        traj.duration_s = time.perf_counter() - start
        return traj
    except (Exception, asyncio.CancelledError) as exc:  # recorded in the trajectory
        if _stopping(exc):
            raise
        traj.error = _error("env reset failed", exc)
        traj.duration_s = time.perf_counter() - start
        return traj
    ep = env.episode
    assert ep is not None
    messages = list(info.get("messages", []))
    traj.episode_id, traj.prompt, traj.prompt_messages = ep.episode_id, obs, list(messages)
    schemas = env.tool_schemas()
    done = False
    try:
        agent.reset(task)
    except Exception as exc:  # noqa: BLE001
        traj.error, done = _error("agent reset failed", exc), True
    while not done:
        turn = len(ep.turns)
        env_info = EnvInfo(env_id, task, turn, env.max_turns, schemas, env.parser, episode, sample)
        t0 = time.perf_counter()
        try:
            action = await _within(deadline, agent.act(obs, list(messages), env_info))
            if isinstance(action, str):
                action = AgentAction(text=action)
            if not isinstance(action, AgentAction):
                raise TypeError(f"act() returned {type(action).__name__}, not an AgentAction")
        except _EpisodeTimeout:
            traj.error = _timed_out(timeout, f"the agent's turn {turn}")
            break
        except (Exception, asyncio.CancelledError) as exc:  # a failing agent ends its episode only
            if _stopping(exc):
                raise
            traj.error = _error(f"agent failed on turn {turn}", exc)
            break
        t1 = time.perf_counter()
        try:
            # A pre-parsed turn (native tool calls) runs as given; only then is `parsed` passed, so
            # an env whose `astep` predates it still steps text.
            stepped = env.astep(action.text) if action.parsed is None else env.astep(action.text, parsed=action.parsed)
            obs, reward, term, trunc, info = await _within(deadline, stepped)
        except _EpisodeTimeout:
            traj.error = _timed_out(timeout, f"env step {turn}")
            break
        except (Exception, asyncio.CancelledError) as exc:  # a failing env ends its episode only
            if _stopping(exc):
                raise
            traj.error = _error(f"env step failed on turn {turn}", exc)
            break
        t2 = time.perf_counter()
        rec = ep.turns[-1]
        turn_reward, components = float(reward), rec.reward_components  # read only: the record copies it
        if not math.isfinite(turn_reward) or not all(map(math.isfinite, components.values())):
            # An env that does not use WeightedSum (which refuses these) may still return one:
            # record it as an error with a finite reward, so the line reads back and averages hold.
            bad = {k: v for k, v in components.items() if not math.isfinite(v)} or {"reward": turn_reward}
            traj.error = (
                f"env step {turn} gave a non-finite reward "
                f"({', '.join(f'{k}={v!r}' for k, v in bad.items())}); recorded as 0"
            )
            turn_reward = 0.0
            components = {k: (v if math.isfinite(v) else 0.0) for k, v in components.items()}
            done = True
        traj.turns.append(
            TurnRecord(
                index=turn,
                action=action.text,
                parsed=rec.parsed,
                results=rec.results,
                calls=[CallStats.model_validate(r, from_attributes=True) for r in rec.records],
                observation=obs,
                reward=turn_reward,
                reward_components=components,
                agent_latency_s=t1 - t0,
                env_latency_s=t2 - t1,
                prompt_tokens=action.prompt_tokens,
                completion_tokens=action.completion_tokens,
                token_ids=action.token_ids,
                logprobs=action.logprobs,
                prompt_token_ids=action.prompt_token_ids,
                agent_metadata=action.metadata,
            )
        )
        messages.extend(info.get("messages", []))
        done = done or bool(term or trunc)
    traj.answer, traj.terminated, traj.truncated = ep.answer, ep.terminated, ep.truncated
    # What the env reports as `info["reward_info"]` at the end: without it a judge that is down
    # (every part scoring 0, the error recorded) looks like a model that scores 0.
    traj.reward_info = {str(k): _info_value(v) for k, v in ep.reward_info.items()}
    traj.reward = sum(t.reward for t in traj.turns)
    comps: dict[str, float] = {}
    for t in traj.turns:
        for k, v in t.reward_components.items():
            comps[k] = comps.get(k, 0.0) + v
    traj.reward_components = comps
    traj.success = traj.error is None and reaches(traj.reward, success_threshold)
    traj.duration_s = time.perf_counter() - start
    return traj


def _info_value(value: Any) -> Any:
    """A reward info value as JSON can hold it: numpy-like values as plain numbers and lists,
    bytes as text, anything else as its `str()`. Reward info is a diagnosis, so a value JSON
    cannot hold is kept readable rather than made an error of the episode (`RunOutput.write`)."""
    if value is None or isinstance(value, str | bool | int | float):
        return value
    if isinstance(value, Mapping):
        return {str(k): _info_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_info_value(v) for v in value]
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("utf-8", errors="replace")
    plain = plain_value(value)
    return str(value) if plain is value else _info_value(plain)


def _who(agent: str, model: str | None) -> str:
    return f"agent {agent!r}" + (f" (model {model!r})" if model is not None else "")


def _bare_id(env_id: str) -> str:
    """A Gymnasium id without the `module:` Gymnasium imports before making it."""
    return env_id.rpartition(":")[2]


def _check_same_run(path: Path, previous: Trajectory, env_id: str, agent: Agent) -> None:
    """Resuming is running the same command again: refuse a file of another env, agent or model
    (an id written with its module prefix, as earlier versions kept it, is the same env)."""
    if env_id and _bare_id(previous.env_id) != env_id:
        raise ValueError(f"{path} holds trajectories of {previous.env_id!r}, not {env_id!r}")
    if (previous.agent, previous.model) != (agent.label, agent.model):
        theirs, ours = _who(previous.agent, previous.model), _who(agent.label, agent.model)
        raise ValueError(
            f"{path} holds trajectories of {theirs}, not {ours}; "
            "use another output directory, or --overwrite (overwrite=True) to start again"
        )


def _task_digest(task: Task, *, read_back: bool) -> str:
    """What a trajectory line holds of `task`, as a digest that two tasks share when a resume
    may treat them as one: `read_back` first passes `task` through a line and back, as the
    file's tasks were (a tuple is a list then, a number answer its text, NaN the text "NaN").
    Keys are sorted, and an image is its SHA-256 whether inline or in `images/`."""
    line = dump_json(Trajectory(env_id="", agent="", task=task)).text
    if read_back:
        with contextlib.suppress(ValidationError):  # a task that would not read back stays as written
            line = dump_json(Trajectory.model_validate_json(line)).text
    text = json.dumps(
        _image_digests(json.loads(line)["task"]), sort_keys=True, ensure_ascii=False, separators=(",", ":")
    )
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def _image_digests(value: Any) -> Any:
    """`value` (JSON) with each image, base64 inline or named in `images/`, as its SHA-256."""
    if isinstance(value, list):
        return [_image_digests(v) for v in value]
    if not isinstance(value, dict):
        return value
    if value.keys() == {"data", "mime", "width", "height"} and isinstance(value["data"], str):
        # pydantic writes an image URL-safe (`-`, `_`); a line written another way may hold `+`, `/`
        text = value["data"].replace("-", "+").replace("_", "/")
        with contextlib.suppress(ValueError):
            return {**value, "data": hashlib.sha256(base64.b64decode(text, validate=True)).hexdigest()}
    if value.keys() == {"file", "mime", "width", "height"} and isinstance(value["file"], str):
        return {k: v for k, v in value.items() if k != "file"} | {"data": value["file"].partition(".")[0]}
    return {k: _image_digests(v) for k, v in value.items()}


def _changed_tasks(path: Path, changed: list[str]) -> ValueError:
    """The refusal of a resume whose tasks changed under their ids (the first few named)."""
    names = ", ".join(repr(c) for c in changed[:5]) + (", ..." if len(changed) > 5 else "")
    return ValueError(
        f"{path} holds trajectories of {len(changed)} task{'s' if len(changed) > 1 else ''} changed since "
        f"they ran (the same id, another question, answer, context or metadata): {names}; use another "
        "output directory, or --overwrite (overwrite=True) to start again"
    )


def _check_same_config(output: RunOutput, seed: int | None, env_kwargs: Mapping[str, Any]) -> None:
    """Resuming is running the same run: refuse earlier episodes that ran with another seed
    (each reset with its own `seed + i`) or other env arguments (`max_turns`, `parser`...), as
    `run.json` records them. A run.json without them (or none) is not checked."""
    before = output.previous_config()
    kwargs = _redact(env_kwargs)
    # An object JSON cannot hold (a parser) is in run.json as its text, its address in it: only
    # its name is compared. The rest as run.json holds it (a tuple is a list there).
    objects = {k for k, v in kwargs.items() if not _is_json(v)}
    now = {"seed": seed, "env_kwargs": json.loads(json.dumps(kwargs, default=str))}
    if isinstance(before.get("env_kwargs"), dict) and objects <= before["env_kwargs"].keys():
        before["env_kwargs"] = {k: ("..." if k in objects else v) for k, v in before["env_kwargs"].items()}
        now["env_kwargs"] = {k: ("..." if k in objects else v) for k, v in now["env_kwargs"].items()}
    for name, value in now.items():
        if name in before and before[name] != value:
            raise ValueError(
                f"{output.dir} ran with {name} {before[name]!r}, not {value!r}; use another output "
                "directory, or --overwrite (overwrite=True) to start again"
            )


def _is_json(value: Any) -> bool:
    """Whether `value` is JSON as it is (run.json records anything else as its text)."""
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True


async def _close_envs(envs: list[ToolEnv]) -> None:
    """Close each env, best effort: the run's data is written by then."""
    for e in envs:
        with contextlib.suppress(Exception):
            await e.aclose()


def _redact(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """`kwargs` for run.json, a value whose name suggests a secret as `***`, and the password of
    any URL in it (`http://user:***@host`, a proxy's basic auth). A number, a bool or None is no
    secret: `max_tokens` or `return_token_ids` names a setting worth keeping."""
    return {
        k: ("***" if any(w in k.lower() for w in _SECRET_WORDS) and not _plain(v) else _without_passwords(v))
        for k, v in kwargs.items()
    }


#: The password of a URL's `user:password@` (its scheme and user kept, to tell what it was).
_URL_PASSWORD = re.compile(r"(\b[A-Za-z][A-Za-z0-9+.-]*://[^/\s:@]*:)[^/\s@]+(@)")


def _without_passwords(value: Any) -> Any:
    """`value` with the password of each URL in its text as `***`, in nested lists and dicts too."""
    if isinstance(value, str):
        return _URL_PASSWORD.sub(r"\1***\2", value) if "@" in value else value
    if isinstance(value, Mapping):
        return {k: _without_passwords(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_without_passwords(v) for v in value]
    return value


def _plain(value: Any) -> bool:
    """Whether `value` is a number, a bool or None (which no key or token is)."""
    return value is None or isinstance(value, (bool, int, float))


# ---------------------------------------------------------------------- the runner
async def arollout(
    env: EnvSpec,
    agent: str | Agent,
    *,
    n: int | None = None,
    tasks: str | Path | Iterable[Task | Mapping[str, Any]] | None = None,
    samples: int = 1,
    concurrency: int = 8,
    out: str | Path | None = None,
    resume: bool = True,
    overwrite: bool = False,
    retry_errors: bool = False,
    env_kwargs: Mapping[str, Any] | None = None,
    agent_kwargs: Mapping[str, Any] | None = None,
    seed: int | None = 0,
    success_threshold: float = 1.0,
    progress: bool = False,
    progress_stream: IO[str] | None = None,
    on_trajectory: Callable[[Trajectory], None] | None = None,
    tune_gc: bool = True,
    images: str = "inline",
    episode_timeout: float | None = None,
    keep_trajectories: bool = True,
) -> RolloutResult:
    """Roll `agent` out on `env`; see `rollout` for the arguments."""
    if episode_timeout is not None and not episode_timeout > 0:
        raise ValueError(f"episode_timeout must be a positive number of seconds, got {episode_timeout!r}")
    if images not in IMAGE_MODES:
        raise ValueError(f"images must be one of {', '.join(IMAGE_MODES)}, got {images!r}")
    if samples < 1:
        raise ValueError(f"samples must be at least 1, got {samples}")
    if concurrency < 1:
        raise ValueError(f"concurrency must be at least 1, got {concurrency}")
    if seed is not None and seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed}")
    if math.isnan(success_threshold):
        raise ValueError("success_threshold must be a number, got nan")
    the_agent = load_agent(agent, **dict(agent_kwargs or {}))
    envs: list[ToolEnv] = []  # closed, with the agent, however the run ends (a refused resume too)
    async with contextlib.AsyncExitStack() as closing:
        closing.push_async_callback(the_agent.aclose)
        closing.push_async_callback(_close_envs, envs)
        first, env_id = _make_env(env, dict(env_kwargs or {}))
        envs.append(first)
        chosen = _select_tasks(first, tasks, n)
        work = [(i * samples + s, task, s) for i, task in enumerate(chosen) for s in range(samples)]
        output = RunOutput(Path(out), resume=resume, overwrite=overwrite, images=images) if out is not None else None
        if output is not None:
            closing.callback(output.unlock)
            _check_same_config(output, seed, env_kwargs or {})
        previous: list[Trajectory] = []  # kept only for the result (`keep_trajectories`)
        done_keys: set[tuple[str, int]] = set()
        totals = SummaryBuilder()  # fed as episodes end, so the closing summary is quick
        if output is not None:
            given: dict[str, str] | None = None  # task id -> digest, made when there is a line to check
            changed: set[str] = set()
            retry = {(task.id, sample) for _, task, sample in work} if retry_errors else set()
            for t in output.load(retry, success_threshold):
                _check_same_run(output.path, t, env_id, the_agent)
                if given is None:
                    given = {task.id: _task_digest(task, read_back=True) for task in chosen}
                want = given.get(t.task.id)  # a task no longer given is kept, unchecked
                if want is not None and t.task.id not in changed and _task_digest(t.task, read_back=False) != want:
                    changed.add(t.task.id)
                done_keys.add(t.key)
                totals.add(t)
                if keep_trajectories:
                    previous.append(t)
            if changed:  # named in the order of the task list
                raise _changed_tasks(output.path, [task.id for task in chosen if task.id in changed])
            output.start()
        todo = [w for w in work if (w[1].id, w[2]) not in done_keys]
        if output:
            output.write_config(
                {
                    "env_id": env if isinstance(env, str) else env_id,  # as given: a module prefix says what to import
                    "agent": the_agent.label,
                    "model": the_agent.model,
                    "episodes": len(work),
                    "samples": samples,
                    "concurrency": concurrency,
                    "seed": seed,
                    "success_threshold": success_threshold,
                    "tune_gc": tune_gc,
                    "images": images,
                    "episode_timeout": episode_timeout,
                    "env_kwargs": _redact(env_kwargs or {}),
                    "agent_kwargs": _redact(agent_kwargs or {}),
                    "started_at": _now(),
                }
            )
        # The first worker steps `first`; each other one builds its env when it takes its first task,
        # so episodes start at once rather than after every env is built (1,024 envs: ~16 ms), and a
        # build's cost lands in the first round of tool calls, which the later rounds outlast.
        queue: asyncio.Queue[tuple[int, Task, int]] = asyncio.Queue()
        for w in todo:
            queue.put_nowait(w)
        new: list[Trajectory] = []
        written = failed = 0
        started = time.perf_counter()
        bar = Progress(len(todo), enabled=progress, stream=progress_stream, label=env_id or "rollout")

        async def worker(w_env: ToolEnv | None) -> None:
            nonlocal written, failed
            while True:
                try:
                    index, task, sample = queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                if w_env is None:
                    w_env = _make_env(env, dict(env_kwargs or {}))[0]
                    envs.append(w_env)
                episode_seed = None if seed is None else seed + index
                try:
                    spawned = the_agent.spawn()
                except Exception as exc:  # noqa: BLE001 - an agent failure ends its episode only
                    traj = _not_spawned(the_agent, task, exc, env_id=env_id, sample=sample, seed=episode_seed)
                else:
                    traj = await run_episode(
                        w_env,
                        spawned,
                        task,
                        env_id=env_id,
                        sample=sample,
                        seed=episode_seed,
                        success_threshold=success_threshold,
                        timeout=episode_timeout,
                        episode=index + 1,  # its place in the whole run, also when resumed
                    )
                if output:
                    traj = output.write(traj)
                written += 1
                failed += traj.error is not None
                if keep_trajectories:
                    new.append(traj)
                totals.add(traj)  # after the write: the summary counts what the file holds
                if progress:  # a bar that draws nothing need not count
                    bar.update(traj)
                if on_trajectory is not None:
                    on_trajectory(traj)

        def restored(traj: Trajectory) -> None:
            totals.add(traj)
            if keep_trajectories:
                previous.append(traj)

        workers = min(concurrency, len(todo))
        interrupted = False
        try:
            with bar, tuned_gc(gen0_threshold_for(workers)) if tune_gc else contextlib.nullcontext():
                # A worker that fails (an env that cannot be built, a disk that is full) stops the
                # others rather than leaving them to write on after the run has failed.
                await _aio.gather_all([worker(first), *(worker(None) for _ in range(workers - 1))])
        except BaseException:  # stopped (Ctrl-C, SIGTERM) or failed: either way the run did not finish
            interrupted = True
            raise
        finally:
            if output:  # the earlier lines of reruns not written go back: the summary counts them
                output.restore(restored)
            everything = previous + new
            summary = totals.build(wall_time_s=time.perf_counter() - started, interrupted=interrupted)
            if output:
                output.close()
                output.write_summary(summary)
        return RolloutResult(
            everything, summary, Path(out) if out is not None else None, written, len(work) - len(todo), failed
        )


def rollout(
    env: EnvSpec,
    agent: str | Agent,
    *,
    n: int | None = None,
    tasks: str | Path | Iterable[Task | Mapping[str, Any]] | None = None,
    samples: int = 1,
    concurrency: int = 8,
    out: str | Path | None = None,
    resume: bool = True,
    overwrite: bool = False,
    retry_errors: bool = False,
    env_kwargs: Mapping[str, Any] | None = None,
    agent_kwargs: Mapping[str, Any] | None = None,
    seed: int | None = 0,
    success_threshold: float = 1.0,
    progress: bool = False,
    tune_gc: bool = True,
    images: str = "inline",
    episode_timeout: float | None = None,
    keep_trajectories: bool = True,
) -> RolloutResult:
    """Run `agent` on `env` for `n` tasks (all when None), `concurrency` episodes at a time.

    Args:
        env: an env id (`"toolenv/Spider-v0"`) made with `gym.make(env, **env_kwargs)`, or a
            zero-argument factory returning a ToolEnv (called once per concurrent worker).
        agent: an Agent, an agent plugin name (`"oracle"`, `"openai"`) or `"module:attr"`,
            built with `agent_kwargs`.
        n: the first `n` tasks of the env (or of `tasks`).
        tasks: tasks to run instead of the env's own (Tasks, dicts or a JSONL path).
        samples: attempts per task (trajectories carry `sample`).
        concurrency: episodes in flight at once.
        out: a directory for `trajectories.jsonl`, `summary.json` and `run.json`.
        resume: skip (task id, sample) pairs already in `out`. The file must hold the same
            env, agent and model, the same task under each id that is still given, and have run
            with the same `seed` and `env_kwargs` (else ValueError), and valid lines (a partial
            last line, from a killed run, is dropped; any other invalid line is a ValueError
            naming it). Earlier episodes' `success` is recomputed at `success_threshold`
            (their lines rewritten). Another run using `out` at the time is a RuntimeError.
        overwrite: start `out` afresh.
        retry_errors: on resume, rerun episodes that ended with an error (those of this run's
            tasks and samples; the others' stay as they are). Each earlier line is replaced by
            its rerun, and kept (in `trajectories.retrying.jsonl` meanwhile) if the run stops
            before that.
        seed: episode `i` resets with `seed + i` (None: unseeded); at least 0.
        success_threshold: an episode succeeds when its reward reaches this and it has no error.
        progress: draw a live progress bar on stderr.
        tune_gc: run the episodes inside `toolenv.tuned_gc()`, its young generation sized for
            `concurrency` episodes (`gen0_threshold_for`); the collector's settings are restored
            afterwards, and programs that set them themselves are left alone.
        images: `"inline"` keeps images base64 inside each JSON line; `"files"` writes each
            distinct image once to `out/images/` (named by its SHA-256) and the lines name the
            files; `read_trajectories` reads both.
        episode_timeout: seconds an episode may take, reset to last step; one that runs
            longer is stopped (its agent call or env step cancelled) and recorded with
            `error` set and the turns it finished. None: no limit.
        keep_trajectories: return every trajectory in the result. False: `trajectories` is
            empty and memory stays flat however many episodes run or are resumed (what
            `toolenv rollout` does); read `out` (or use `on_trajectory` with `arollout`).

    Returns:
        Every trajectory in `out` (this run's and earlier ones) and their summary.
    """
    return _aio.run(
        arollout(
            env,
            agent,
            n=n,
            tasks=tasks,
            samples=samples,
            concurrency=concurrency,
            out=out,
            resume=resume,
            overwrite=overwrite,
            retry_errors=retry_errors,
            env_kwargs=env_kwargs,
            agent_kwargs=agent_kwargs,
            seed=seed,
            success_threshold=success_threshold,
            progress=progress,
            tune_gc=tune_gc,
            images=images,
            episode_timeout=episode_timeout,
            keep_trajectories=keep_trajectories,
        )
    )
