"""A Gymnasium Text space that admits any unicode string.

`gymnasium.spaces.Text` only contains strings drawn from its charset (alphanumeric
by default), so model text with spaces, punctuation or non-Latin script would not
be "in" the space. `UnicodeText` keeps Text's sampling (printable characters, for
the env checker) but accepts every `str` within its length bounds.
"""

from __future__ import annotations

import copy
import string
from typing import Any

import numpy as np
from gymnasium import spaces
from gymnasium.vector.utils import shared_memory

__all__ = ["UnicodeText"]


class _SharedCharset:
    """Text's charset structures for `string.printable`, built once."""

    def __init__(self) -> None:
        self.parts: tuple[Any, ...] | None = None

    def get(self, space: spaces.Text) -> tuple[Any, ...]:
        if self.parts is None:
            self.parts = (space._char_set, space._char_list, space._char_index, space._char_str)
        return self.parts


_PRINTABLE = _SharedCharset()
_STR = np.dtype(str)


class UnicodeText(spaces.Text):
    """Any unicode string of `min_length`..`max_length` characters."""

    def __init__(
        self, max_length: int = 1 << 20, *, min_length: int = 0, sample_max_length: int = 256, seed: Any = None
    ) -> None:
        # Every instance has the same charset: share Text's per-instance copies of it. Each env
        # holds two spaces, and the collector walks each copy's 100-entry set and tuple on
        # every full collection (~4 µs per space, a third of an idle ToolEnv's cost to it).
        # Building them is also most of Text's 70 µs constructor, which the first space pays.
        parts = _PRINTABLE.parts
        if parts is not None and type(max_length) is int and type(min_length) is int and 0 <= min_length <= max_length:
            self.min_length, self.max_length = min_length, max_length
            if seed is None:  # what `Space.__init__(dtype=str)`, Text's last call, sets (each env builds two)
                self._shape, self.dtype, self._np_random = None, _STR, None  # type: ignore[assignment]
            else:
                spaces.Space.__init__(self, dtype=str, seed=seed)
        else:  # the first space, or bounds for Gymnasium to check (and raise its own error)
            super().__init__(max_length, min_length=min_length, charset=string.printable, seed=seed)
            parts = _PRINTABLE.get(self)
        self._char_set, self._char_list, self._char_index, self._char_str = parts
        self.sample_max_length = max(self.min_length, min(sample_max_length, self.max_length))

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and self.min_length <= len(x) <= self.max_length

    def sample(self, mask: Any = None, probability: Any = None) -> str:
        """A random printable string of `min_length` to `sample_max_length` characters."""
        if mask is None and probability is None:
            length = int(self.np_random.integers(self.min_length, self.sample_max_length + 1))
            mask = (length, None)
        return super().sample(mask=mask, probability=probability)

    def __deepcopy__(self, memo: dict[int, Any]) -> UnicodeText:
        # Gymnasium's `batch_space` deep-copies the space once per sub-env; the copies keep
        # sharing the charset (it never changes) and get their own generator.
        for part in _PRINTABLE.get(self):
            memo[id(part)] = part
        new = type(self).__new__(type(self))
        memo[id(self)] = new
        new.__dict__.update({k: copy.deepcopy(v, memo) for k, v in vars(self).items()})
        return new

    def __repr__(self) -> str:
        return f"UnicodeText({self.min_length}, {self.max_length})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, UnicodeText) and (self.min_length, self.max_length) == (
            other.min_length,
            other.max_length,
        )

    __hash__ = spaces.Text.__hash__


@shared_memory.create_shared_memory.register(UnicodeText)
def _refuse_shared_memory(space: UnicodeText, n: int = 1, ctx: Any = None) -> Any:
    # Gymnasium's shared-memory encoding of Text maps characters through the charset and
    # garbles any other character; refusing is better than silently corrupting observations.
    raise TypeError(
        "toolenv observations are free text and cannot travel through Gymnasium's shared memory. "
        'Use gym.make_vec(..., vectorization_mode="vector_entry_point") (toolenv\'s own concurrent vector env) '
        'or pass vector_kwargs={"shared_memory": False} to the async vector env.'
    )


_NO_FLATTEN = (
    "toolenv observations are free text, which has no fixed-size numeric form: Gymnasium's flatten "
    "(FlattenObservation, flatten_space) would encode any character outside its charset wrongly. "
    "Tokenize the text with your model's tokenizer instead."
)


@spaces.utils.flatten_space.register(UnicodeText)
def _refuse_flatten_space(space: UnicodeText) -> Any:
    # Text's flattening maps characters through its charset (printable ASCII here): a prompt
    # with any other character fails with a bare KeyError, an ASCII one becomes a 4 MB array.
    raise TypeError(_NO_FLATTEN)


@spaces.utils.flatten.register(UnicodeText)
def _refuse_flatten(space: UnicodeText, x: Any) -> Any:  # type: ignore[misc]  # Space[str] vs the fallback's Space[T]
    raise TypeError(_NO_FLATTEN)
