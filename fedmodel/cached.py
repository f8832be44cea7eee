"""``cached_property``: a property computed at its first read and kept in the instance.

The package's objects whose facts are found once (a compiled program's row counts and
structure, a layout's sizes) read them through this descriptor. It is
:func:`functools.cached_property` without the lock that Python 3.11's takes on every first
read (Python 3.12 dropped it): with thousands of parties, each first read of each fact
is on the set-up's path. Two threads reading a value not found yet may both compute it;
the facts cached so are functions of their instance, so both find the same value.

Examples
--------
>>> class Box:
...     @cached_property
...     def volume(self):
...         print("computed")
...         return 6
>>> box = Box()
>>> box.volume
computed
6
>>> box.volume
6
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["cached_property"]


class cached_property:  # noqa: N801 - named as functools' descriptor
    """A non-data descriptor: the first read of the attribute on an instance calls the
    method and stores its value in the instance's ``__dict__`` under the attribute's
    name, where every later read finds it (``del obj.attr`` forgets it)."""

    def __init__(self, func: Callable[[Any], Any]):
        self.func = func
        self.attrname: str | None = None
        self.__doc__ = func.__doc__
        self.__module__ = func.__module__

    def __set_name__(self, owner: type, name: str) -> None:
        if self.attrname is not None and name != self.attrname:
            raise TypeError(
                f"cannot assign the same cached_property to two names ({self.attrname!r} "
                f"and {name!r})"
            )
        self.attrname = name

    def __get__(self, instance: Any, owner: type | None = None) -> Any:
        if instance is None:
            return self
        value = instance.__dict__[self.attrname] = self.func(instance)
        return value
