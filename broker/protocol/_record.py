"""Immutable value records for the per-message hot path (PUBLISH, its acks, Message, Route).

Most of the project's value types are frozen, slotted dataclasses.  The few built once or
more per application message are not: a frozen dataclass builds each instance in a generated
Python ``__init__`` that sets every field through ``object.__setattr__``, and that stays
interpreted even when the module is compiled with mypyc (measured in a compiled module:
Publish 0.63 µs, Message 0.78 µs per instance, against 0.07 µs for a class with an explicit
``__init__`` and ``Final`` attributes; docs/performance.md, "Compiled hot path").

So these records are written out: ``__slots__``, an explicit ``__init__`` whose attributes are
declared ``Final`` (mypy rejects assignments; compiled, the attributes are read-only at run
time) and this base class, which gives the dataclass value semantics from the class's
``__match_args__`` (the field names in constructor order): ``==``, ``hash``, ``repr`` and
:meth:`Record.replace` (``dataclasses.replace`` for records).  These are not on a hot path and
cost O(fields).
"""

from __future__ import annotations

from typing import Any, ClassVar, Self

__all__ = ["Record"]


class Record:
    """Base of the hand-written immutable records; subclasses list their fields in
    ``__match_args__`` (constructor order) and set them once in ``__init__``."""

    __slots__ = ()
    __match_args__: ClassVar[tuple[str, ...]] = ()

    def _values(self) -> tuple[object, ...]:
        return tuple(getattr(self, name) for name in self.__match_args__)

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        assert isinstance(other, Record)
        return self._values() == other._values()

    def __hash__(self) -> int:
        return hash((type(self).__name__, self._values()))

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in self.__match_args__)
        return f"{type(self).__name__}({fields})"

    def replace(self, **changes: Any) -> Self:
        """A copy with ``changes`` applied (unknown names raise TypeError)."""
        values: dict[str, Any] = {name: getattr(self, name) for name in self.__match_args__}
        unknown = set(changes) - set(values)
        if unknown:
            raise TypeError(f"{type(self).__name__} has no field {', '.join(sorted(unknown))}")
        values.update(changes)
        return type(self)(**values)
