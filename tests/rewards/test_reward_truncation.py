"""Outcome rewards on an episode that ends by truncation, not by an answer."""

from __future__ import annotations

import toolenv
from toolenv.rewards import reward_info

SPEC = {"exact_match": 1.0, "answer_avoidance_penalty": 0.5, "format": 1.0, "tool_call_penalty": 0.1}


def test_the_max_turns_step_is_scored_by_the_outcome_rewards() -> None:
    """The step that reaches `max_turns` ends the episode: its reward holds the final
    components (the answer avoidance penalty for no answer), as a terminating step's does."""
    env = toolenv.ToolEnv(tasks=[{"question": "q", "answer": "x"}], reward=SPEC, max_turns=2)
    env.reset(seed=0)
    _, r1, _, trunc1, info1 = env.step("thinking...")
    _, r2, term, trunc2, info2 = env.step("still thinking...")
    assert not trunc1 and r1 == 0.0 and info1["reward_components"]["answer_avoidance_penalty"] == 0.0
    assert trunc2 and not term
    assert info2["reward_components"] == {
        "exact_match": 0.0,
        "answer_avoidance_penalty": -1.0,
        "format": 0.0,
        "tool_call_penalty": 0.0,
    }
    assert r2 == -0.5 and info2["episode_stats"]["return"] == -0.5
    assert env.episode is not None and env.episode.final_components == {
        "exact_match": 0.0,
        "answer_avoidance_penalty": -1.0,
        "format": 0.0,
        "tool_call_penalty": 0.0,
    }
    env.close()


def test_truncate_scores_the_unanswered_episode_once() -> None:
    """`truncate()` (a trainer stopped generating) scores the final rewards onto the last turn,
    once: a second call, or one after the episode ended, adds nothing."""
    env = toolenv.ToolEnv(tasks=[{"question": "q", "answer": "x"}], reward=SPEC, max_turns=4)
    env.reset(seed=0)
    env.step("thinking...")
    assert env.truncate() == -0.5
    assert env.truncate() == 0.0
    assert env.episode is not None
    assert env.episode.turns[-1].reward == -0.5
    assert env.episode.turns[-1].reward_components["answer_avoidance_penalty"] == -1.0
    env.close()


def test_a_judge_is_not_asked_about_a_truncated_episode() -> None:
    """No answer, no request: the judge records why it scored 0 (no server runs here; a call
    would fail and be recorded as an error instead)."""
    judge = toolenv.rewards.LLMJudge(base_url="http://127.0.0.1:9/v1", retries=0, timeout=1.0)
    env = toolenv.ToolEnv(tasks=[{"question": "q", "answer": "x"}], reward=[(judge, 1.0)], max_turns=1)
    env.reset(seed=0)
    _, r, _, trunc, info = env.step("thinking...")
    env.close()
    assert trunc and r == 0.0 and info["reward_components"] == {"judge": 0.0}
    assert env.episode is not None and reward_info(env.episode)["judge"]["skipped"] == "no answer"
