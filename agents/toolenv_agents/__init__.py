"""Reference agents for toolenv, registered in the `toolenv.agents` entry-point group.

- `openai`: any OpenAI-compatible chat or completions server (vLLM, SGLang, OpenAI).
- `transformers`: a local Hugging Face model with its chat template.
- `oracle`: the env's scripted policy from the `toolenv.oracles` group.
- `replay`: actions from a JSONL file keyed by task id.

Modules are imported on first use so that listing agents stays cheap.
"""

from __future__ import annotations

__all__ = ["__version__"]

__version__ = "0.1.0"
