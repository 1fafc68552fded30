"""`UnicodeText`: any string is in the space; copies stay independent where it matters."""

from __future__ import annotations

import copy

import pytest
from gymnasium.vector.utils import batch_space

from toolenv import UnicodeText


def test_any_unicode_string_within_bounds_is_contained() -> None:
    space = UnicodeText(16, min_length=1)
    assert space.contains("é 😀 <a>\n")
    assert not space.contains("") and not space.contains("x" * 17) and not space.contains(b"bytes")
    space.seed(0)
    sample = space.sample()
    assert space.contains(sample) and 0 < len(sample) <= 16


def test_copies_sample_on_their_own_generators() -> None:
    a = UnicodeText()
    a.seed(7)
    b = copy.deepcopy(a)
    assert b == a and b.max_length == a.max_length
    assert a.sample() == b.sample()  # same state copied...
    b.seed(8)
    assert [a.sample() for _ in range(3)] != [b.sample() for _ in range(3)]  # ...but not shared
    batched = batch_space(a, 3)
    assert all(s == a and s.np_random is not a.np_random for s in batched.spaces)


def test_spaces_share_one_charset() -> None:
    """Each env holds two spaces and a vector env one more per env. Gymnasium's Text gives
    every space (and every deep copy) its own 100-entry charset set and tuple, which every
    full collection walks: ~4 µs per space, a third of what an idle env costs the collector
    (docs/benchmarks.md, concurrency). Here all of them share one."""
    spaces = [*batch_space(UnicodeText(), 50).spaces, *(UnicodeText(n) for n in (1, 8, 1 << 20))]
    assert len({id(s._char_set) for s in spaces}) == 1
    assert len({id(s._char_list) for s in spaces}) == 1
    assert len({id(s._char_index) for s in spaces}) == 1


def test_spaces_built_after_the_first_equal_what_gymnasium_builds() -> None:
    import string

    from gymnasium import spaces

    UnicodeText()  # the first space builds the shared charset through Gymnasium
    for seed in (5, None):  # a seedless space sets Space's attributes itself
        ours = UnicodeText(64, min_length=1, seed=seed)
        theirs = spaces.Text(64, min_length=1, charset=string.printable, seed=seed)
        assert {k for k in vars(ours) if k != "sample_max_length"} == set(vars(theirs))
        for key, value in vars(theirs).items():
            if key != "_np_random" or seed is None:
                assert getattr(ours, key) == value, key
    ours, theirs = (
        UnicodeText(64, min_length=1, seed=5),
        spaces.Text(64, min_length=1, charset=string.printable, seed=5),
    )
    assert [ours.np_random.integers(1000) for _ in range(5)] == [theirs.np_random.integers(1000) for _ in range(5)]


def test_sampling_respects_a_min_length_above_the_sample_length() -> None:
    for space in (UnicodeText(1000, min_length=500), UnicodeText(400, min_length=300, sample_max_length=10)):
        space.seed(0)
        sample = space.sample()
        assert space.contains(sample) and len(sample) == space.min_length


def test_flattening_free_text_is_refused_with_what_to_do_instead() -> None:
    """Text's flattening maps characters through its charset: a prompt with `é` failed inside
    `reset` with a bare KeyError, an ASCII one became a 4 MB int array per observation."""
    import gymnasium as gym
    from gymnasium.wrappers import FlattenObservation

    space = UnicodeText(max_length=1 << 20)
    with pytest.raises(TypeError, match="Tokenize the text"):
        gym.spaces.flatten_space(space)
    with pytest.raises(TypeError, match="Tokenize the text"):
        gym.spaces.flatten(space, "Combien coûte un café ?")
    env = gym.make("toolenv/ToolEnv-v0", tools=[], tasks=[{"question": "café ?", "answer": "2€"}])
    try:
        with pytest.raises(TypeError, match="FlattenObservation"):
            FlattenObservation(env)
    finally:
        env.close()
