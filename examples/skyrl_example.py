"""A toolenv env as SkyRL-train's generator sees it, through skyrl-gym.

    pip install "toolenv[skyrl]" toolenv-sql
    python examples/skyrl_example.py

1. `register` adds `toolenv/Spider-v0` (and the generic `toolenv` id) to skyrl-gym's
   registry; in a real run, call it in SkyRL's entrypoint before training.
2. `dataset_rows` writes SkyRL-train's rows (`prompt`, `env_class`, `reward_spec`,
   `extra_info`); in a real run, save them as parquet for `data.train_data`.
3. Per sample, SkyRL's generator takes `prompt` and `env_class` off the row, passes the
   rest as `extras` (adding its `generator.max_turns`), makes the env with
   `skyrl_gym.make`, calls `init(prompt)`, then `step(model_text)` until `done`.
   Here a scripted "model" plays that loop: one SQL query, then the answer.
"""

from __future__ import annotations

import json

import skyrl_gym

from toolenv.integrations.skyrl import close_pooled_envs, dataset_rows, register

ENV_ID = "toolenv/Spider-v0"


def main() -> None:
    register(ENV_ID)
    rows = dataset_rows(ENV_ID, n=2)
    print(f"{len(rows)} rows; columns: {sorted(rows[0])}")

    row = dict(rows[0])
    prompt, env_class = row.pop("prompt"), row.pop("env_class")
    extras = {**row, "max_turns": 4}  # SkyRL's generator sets extras["max_turns"] = generator.max_turns
    env = skyrl_gym.make(env_class, env_config={}, extras=extras)
    chat, _ = env.init(prompt)
    print("question:", chat[-1]["content"].rsplit("Question:", 1)[-1].strip())

    gold = json.loads(row["extra_info"]["task"])["answer"]
    script = [f"Let me count first.\n<sql>{gold}</sql>", f"<answer>{gold}</answer>"]
    for turn, text in enumerate(script, 1):
        out = env.step(text)  # SkyRL places this reward at the end of the turn's tokens
        print(f"step {turn}: reward={out['reward']} done={out['done']}")
        for message in out["observations"]:  # SkyRL renders these as the next chat turn
            print(f"  [{message['role']}] {message['content']!r}")
        if out["done"]:
            break
    print("metrics:", env.get_metrics())  # what SkyRL aggregates per env_class
    env.close()
    close_pooled_envs()


if __name__ == "__main__":
    main()
