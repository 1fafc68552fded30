"""Rewards: rule-based, model-judged and tool-verified, composed by weight."""

from toolenv.rewards.base import Reward, RewardSpec, WeightedSum, get_reward, register_reward, reward_names
from toolenv.rewards.match import ExactMatch, TokenF1, exact_match, normalize_answer, token_f1

__all__ = [
    "ExactMatch",
    "Reward",
    "RewardSpec",
    "TokenF1",
    "WeightedSum",
    "exact_match",
    "get_reward",
    "normalize_answer",
    "register_reward",
    "reward_names",
    "token_f1",
]
