"""A source range, shared by name resolution, rules and every output format."""
from __future__ import annotations


# A plain class, not a dataclass: importing dataclasses (and the inspect module it imports) costs every start-up
# about 20 ms. Immutable, compared and hashed by value, like the frozen dataclass it replaces.
class Span:
    """A source range: 1-based lines, 0-based columns counted in characters (not bytes)."""

    def __init__(self, line: int, col: int, end_line: int, end_col: int):
        d = self.__dict__  # stored directly: __setattr__ refuses (spans are built by the hundred thousand)
        d["line"] = line
        d["col"] = col
        d["end_line"] = end_line
        d["end_col"] = end_col

    def _key(self) -> tuple:
        return (self.line, self.col, self.end_line, self.end_col)

    def __eq__(self, other):
        if other.__class__ is self.__class__:
            return self._key() == other._key()
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        return (f"{self.__class__.__qualname__}(line={self.line!r}, col={self.col!r}, end_line={self.end_line!r}, "
                f"end_col={self.end_col!r})")

    def __setattr__(self, name, value):
        raise AttributeError(f"cannot assign to field {name!r}")

    def __delattr__(self, name):
        raise AttributeError(f"cannot delete field {name!r}")
