"""Two rewards of one registered name in one spec (two judges, e.g. an ensemble), named apart by
a `key`, scored through a real ToolEnv and a real judge server on 127.0.0.1."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from _judge_server import FakeServer, Reply

import toolenv
from toolenv.rewards import LLMJudge, Reward, get_reward


@pytest.fixture
def server() -> Iterator[FakeServer]:
    with FakeServer() as s:
        yield s


def two_judges(url: str) -> list[dict[str, Any]]:
    base = {"name": "judge", "base_url": url, "api_key_env": None, "weight": 0.5}
    return [{**base, "model": "a"}, {**base, "key": "judge_b", "model": "b"}]


def test_a_key_names_a_list_items_component(server: FakeServer) -> None:
    spec = get_reward(two_judges(server.url))
    assert list(spec.parts) == ["judge", "judge_b"]
    a, b = (spec.parts[k][0] for k in ("judge", "judge_b"))
    assert isinstance(a, LLMJudge) and isinstance(b, LLMJudge)
    assert (a.model, b.model) == ("a", "b")
    assert b.name == "judge_b"  # the judge's own name (its log lines, its reward info) is the key
    assert spec.weights == {"judge": 0.5, "judge_b": 0.5}


def test_two_keyed_judges_score_and_report_apart(server: FakeServer) -> None:
    server.script = [Reply(reply_to=lambda prompt: "yes"), Reply(reply_to=lambda prompt: "yes")]
    env = toolenv.ToolEnv(
        tools=[], tasks=[{"question": "Capital of France?", "answer": "Paris"}], reward=two_judges(server.url)
    )
    try:
        env.reset(seed=0)
        *_, info = env.step("<answer>Paris</answer>")
    finally:
        env.close()
    assert info["reward_components"] == {"judge": 1.0, "judge_b": 1.0}
    assert {"judge", "judge_b"} <= set(info["reward_info"])
    assert sorted(r["body"]["model"] for r in server.requests) == ["a", "b"]


def test_a_key_in_a_mapping_spec_names_the_component() -> None:
    spec = get_reward({"exact_match": {"weight": 1.0, "key": "em"}, "f1": 0.5})
    assert list(spec.parts) == ["em", "f1"]
    assert spec.parts["em"][0].name == "exact_match"  # ExactMatch takes no `name`: the sum keys it


def test_a_key_works_for_a_reward_that_takes_no_name() -> None:
    spec = get_reward([{"name": "exact_match"}, {"name": "exact_match", "key": "em_again", "weight": 0.5}])
    assert spec.weights == {"exact_match": 1.0, "em_again": 0.5}


@pytest.mark.parametrize(
    "spec",
    [
        [{"name": "judge", "model": "a"}, {"name": "judge", "model": "b"}],
        [(LLMJudge(model="a"), 0.5), (LLMJudge(model="b"), 0.5)],
    ],
)
def test_duplicate_component_names_say_how_to_name_them_apart(spec: Any) -> None:
    with pytest.raises(ValueError, match="key") as caught:
        get_reward(spec)
    message = str(caught.value)
    assert "'judge'" in message and "name=" in message and "\n" not in message


@pytest.mark.parametrize("key", ["", 3, None])
def test_a_key_that_is_no_name_is_refused(key: object) -> None:
    with pytest.raises(ValueError, match="key"):
        get_reward([{"name": "exact_match", "key": key}])


def test_the_list_forms_settings_error_does_not_offer_name_as_a_setting() -> None:
    """In a list item `name` is the registered name: the settings the error lists say that a
    component is named by `key`."""
    with pytest.raises(ValueError) as caught:
        get_reward([{"name": "judge", "modle": "a"}])
    message = str(caught.value)
    settings = message.split("its settings: ")[1]
    assert "'modle'" in message and "`key`" in settings and "name" not in settings.split(", ")


def test_spec_forms_without_a_key_are_unchanged() -> None:
    class Mine(Reward):
        name = "mine"

    spec = get_reward(["f1", ("format", 0.2), {"name": "tool_call_penalty", "weight": 0.1}, Mine()])
    assert spec.weights == {"f1": 1.0, "format": 0.2, "tool_call_penalty": 0.1, "mine": 1.0}
