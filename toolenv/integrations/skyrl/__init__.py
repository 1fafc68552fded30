"""Train any toolenv env with SkyRL-train through skyrl-gym's text-env API (`pip install toolenv[skyrl]`).

    from toolenv.integrations.skyrl import dataset_rows, register

    register("toolenv/Spider-v0")          # in SkyRL's entrypoint, before training
    rows = dataset_rows("toolenv/Spider-v0")  # write to parquet for data.train_data

- `ToolEnvTextEnv`: a skyrl-gym `BaseTextEnv` that runs one toolenv episode per SkyRL sample.
- `register`: adds toolenv env ids (and the generic `"toolenv"` id) to skyrl-gym's registry; a
  custom env by its factory with `entry_point=`.
- `dataset_rows` / `adataset_rows`: SkyRL-train's dataset rows (`prompt`, `env_class`,
  `reward_spec`, `extra_info`, `data_source`).
- `task_options`: the `reset` options for the task a row names; `close_pooled_envs`: close the idle pooled envs.

Names load on first use, so building rows does not import skyrl_gym and `import toolenv`
never does.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS: dict[str, str] = {
    "ToolEnvTextEnv": "toolenv.integrations.skyrl.env",
    "register": "toolenv.integrations.skyrl.env",
    "close_pooled_envs": "toolenv.integrations.skyrl.env",
    "dataset_rows": "toolenv.integrations.skyrl.rows",
    "adataset_rows": "toolenv.integrations.skyrl.rows",
    "task_options": "toolenv.integrations.skyrl.rows",
    "DEFAULT_ENV_CLASS": "toolenv.integrations.skyrl.rows",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'toolenv.integrations.skyrl' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
