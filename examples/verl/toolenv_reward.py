"""verl custom reward function scoring with the env's own reward (reward.custom_reward_function.path=this file).

Only needed when the episode does not run through ToolEnvAgentLoop, which returns the env's reward itself.
"""

from toolenv.integrations.verl.reward import compute_score

__all__ = ["compute_score"]
