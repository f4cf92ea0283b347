"""Plain-data classes compared, hashed and shown by their fields, as dataclasses are, without importing dataclasses.

`import dataclasses` imports `inspect` (and `dis`, and the named tuples `inspect` builds with eval), and each
decorated class `exec`s its generated methods: about 20 ms of every start-up, the cached audit of a whole tree
and the pre-commit hook's `audit FILE` included. A class lists its fields in `_fields` and writes its own
`__init__`; `_compared` (default: `_fields`) are the fields equality and hashing use.
"""
from __future__ import annotations

from reprlib import recursive_repr


class Record:
    """Equal when of the same class with equal fields; unhashable, like a dataclass with eq=True."""

    __slots__ = ()
    _fields: tuple = ()
    _compared: tuple | None = None

    def _key(self) -> tuple:
        return tuple(getattr(self, f) for f in (self._compared or self._fields))

    def __eq__(self, other):
        if other.__class__ is self.__class__:
            return self._key() == other._key()
        return NotImplemented

    __hash__ = None

    @recursive_repr()  # a site names its document, which lists its sites: `...` where it loops, as dataclasses do
    def __repr__(self) -> str:
        return f"{self.__class__.__qualname__}({', '.join(f'{f}={getattr(self, f)!r}' for f in self._fields)})"


class FrozenRecord(Record):
    """A Record that cannot change once built (set its fields with `_set`), hashed by its compared fields."""

    __slots__ = ()

    def _set(self, **fields) -> None:
        try:
            attrs = self.__dict__  # (reading it is allowed; one update instead of a __setattr__ per field)
        except AttributeError:  # a subclass with __slots__ only
            for name, value in fields.items():
                object.__setattr__(self, name, value)
            return
        attrs.update(fields)

    def __hash__(self) -> int:
        return hash(self._key())

    def __setattr__(self, name, value):
        raise AttributeError(f"cannot assign to field {name!r}")

    def __delattr__(self, name):
        raise AttributeError(f"cannot delete field {name!r}")
