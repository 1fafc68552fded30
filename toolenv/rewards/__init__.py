"""Rewards: rule-based, model-judged and tool-verified, composed by weight.

Importing this package registers every built-in name (`reward_names()` lists them).
"""

from toolenv.rewards.base import (
    Reward,
    RewardSpec,
    WeightedSum,
    get_reward,
    record_reward_info,
    register_reward,
    reward_info,
    reward_names,
)
from toolenv.rewards.format import FormatReward, has_block, turn_is_well_formed
from toolenv.rewards.judge import (
    DEFAULT_JUDGE_PROMPT,
    JudgeError,
    LLMJudge,
    parse_judgement,
)
from toolenv.rewards.match import ExactMatch, TokenF1, exact_match, normalize_answer, token_f1
from toolenv.rewards.math_answer import MathVerify
from toolenv.rewards.penalties import (
    ActionPenalties,
    AnswerAvoidancePenalty,
    InvalidCallPenalty,
    ToolCallPenalty,
    ToolSuccessBonus,
    TurnReward,
    count_invalid,
    count_tool_successes,
    is_infra_error,
)
from toolenv.rewards.verify import ToolVerified

__all__ = [
    "DEFAULT_JUDGE_PROMPT",
    "ActionPenalties",
    "AnswerAvoidancePenalty",
    "ExactMatch",
    "FormatReward",
    "InvalidCallPenalty",
    "JudgeError",
    "LLMJudge",
    "MathVerify",
    "Reward",
    "RewardSpec",
    "TokenF1",
    "ToolCallPenalty",
    "ToolSuccessBonus",
    "ToolVerified",
    "TurnReward",
    "WeightedSum",
    "count_invalid",
    "count_tool_successes",
    "exact_match",
    "get_reward",
    "has_block",
    "is_infra_error",
    "normalize_answer",
    "parse_judgement",
    "record_reward_info",
    "register_reward",
    "reward_info",
    "reward_names",
    "token_f1",
    "turn_is_well_formed",
]
