"""Write the calculator demo dataset for verl and score two answers with the env's reward.

    python examples/verl/demo_data.py --out data/calc.parquet

The same file comes from the CLI:

    toolenv verl-data toolenv/ToolEnv-v0 --out data/calc.parquet \
        --env-kwargs '{"tools": ["toolenv.integrations.verl.demo:Calculator"], "tasks": "tasks.jsonl"}'
"""

from __future__ import annotations

import argparse

from toolenv.integrations.verl import build_rows, compute_score, write_parquet
from toolenv.integrations.verl.demo import DEMO_TASKS

CALCULATOR = "toolenv.integrations.verl.demo:Calculator"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="data/calc.parquet")
    args = parser.parse_args()

    rows = build_rows("toolenv/ToolEnv-v0", env_kwargs={"tools": [CALCULATOR], "tasks": DEMO_TASKS})
    path = write_parquet(rows, args.out)
    print(f"wrote {len(rows)} rows to {path}")
    print("prompt:", rows[0]["prompt"][-1]["content"])

    # What verl's reward hook would do with a finished response (tool output included).
    extra = rows[0]["extra_info"]
    for response in ("<tool_response>\n42\n</tool_response> <answer>42</answer>", "<answer>41</answer>"):
        result = compute_score(rows[0]["data_source"], response, rows[0]["reward_model"]["ground_truth"], extra)
        print(f"{response[-20:]!r}: score {result['score']}")


if __name__ == "__main__":
    main()
