"""Griffe extension for the API pages: docstrings as a reader of the site sees them.

Two things the dynamic inspection (``force_inspection: true``) would otherwise show:

- an attribute whose value is a builtin (an options field defaulting to ``"serial"``, ``1e-4``
  or ``True``) has no docstring of its own, and ``value.__doc__`` is the builtin type's
  ("Create a new string object..."): such a docstring is dropped, so the field is documented
  only where its class documents it (its numpy ``Parameters`` / ``Attributes`` entry, which
  lists a string option's accepted values);
- Sphinx roles (``:class:`Result```, ``:meth:`~Result.compare```) are not Markdown: each
  becomes a code span of its target's name.
"""

from __future__ import annotations

import re
from inspect import cleandoc
from typing import Any

import griffe

BUILTIN_DOCS = {
    cleandoc(t.__doc__)
    for t in (str, int, float, bool, complex, bytes, tuple, list, dict, set, frozenset, type(None))
    if t.__doc__
}
ROLE = re.compile(
    r":(?:py:)?(?:class|meth|func|attr|data|mod|obj|exc|const|ref|term):`(~?)([^`]+)`"
)


def markdown_roles(text: str) -> str:
    """``:role:`target``` -> ```target``` (``~a.b`` -> ```b```, an explicit title kept)."""

    def span(match: re.Match) -> str:
        short, target = match.group(1), match.group(2)
        titled = re.fullmatch(r"(.+?)\s*<(.+)>", target)
        if titled:
            return f"`{titled.group(1)}`"
        return f"`{target.rsplit('.', 1)[-1] if short else target}`"

    return ROLE.sub(span, text)


class PlainDocstrings(griffe.Extension):
    """Drop builtin types' docstrings from attributes; turn Sphinx roles into code spans."""

    def on_object(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        docstring = obj.docstring
        if docstring is None:
            return
        if obj.is_attribute and docstring.value in BUILTIN_DOCS:
            obj.docstring = None
            return
        docstring.value = markdown_roles(docstring.value)
