"""Name -> factory registries behind ``fedrisk list`` and config resolution.

Example:
    >>> reg = Registry("partitioner")
    >>> @reg.register("iid", "uniformly random equal split")
    ... def iid(): ...
    >>> reg.names()
    ['iid']
    >>> reg.get("iid").__name__
    'iid'
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from fedrisk.errors import unknown_name

T = TypeVar("T", bound=Callable[..., Any])


@dataclass(frozen=True)
class Entry(Generic[T]):
    name: str
    obj: T
    description: str


class Registry(Generic[T]):
    """A named collection of factories with one-line descriptions."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, Entry[T]] = {}

    def register(self, name: str, description: str) -> Callable[[T], T]:
        def deco(obj: T) -> T:
            self.add(name, obj, description)
            return obj

        return deco

    def add(self, name: str, obj: T, description: str) -> None:
        if name in self._entries:
            raise KeyError(f"{self.kind} {name!r} registered twice")
        self._entries[name] = Entry(name, obj, description)

    def get(self, name: str) -> T:
        try:
            return self._entries[name].obj
        except KeyError:
            raise unknown_name(self.kind, name, self._entries) from None

    def names(self) -> list[str]:
        return sorted(self._entries)

    def entries(self) -> list[Entry[T]]:
        return [self._entries[n] for n in self.names()]

    def __contains__(self, name: object) -> bool:
        return name in self._entries
