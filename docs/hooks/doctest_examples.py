"""Docstring examples in the API reference: ``>>>`` lines -> a ``pycon`` code block, doctest flags dropped.

Markdown has no doctest blocks: left alone, ``>>> x`` renders as three nested quotes around one run-on
paragraph, with ``# doctest: +SKIP`` in plain view. This griffe extension (loaded by mkdocstrings, see
mkdocs.yml) rewrites each docstring before it is rendered, so the sources keep Python's doctest form.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

DOCTEST_FLAGS = re.compile(r"\s*#\s*doctest:.*$")  # "# doctest: +SKIP" and the like, with the spaces before it
FENCE = "```"


def fence_examples(text: str) -> str:
    """Wrap every run of ``>>>`` / ``...`` lines and the output lines after them in a ``pycon`` fence.

    A run ends at a blank line or at a line indented less than its first ``>>>``; fenced blocks already in
    the text are left as they are.
    """
    out: list[str] = []
    indent: str | None = None  # the open example's indentation, None when outside one
    in_fence = False
    for line in text.split("\n"):
        stripped = line.lstrip()
        if indent is not None and (not stripped or not line.startswith(indent)):
            out += [indent + FENCE, ""]
            indent = None
        if stripped.startswith(FENCE):
            in_fence = not in_fence
        elif not in_fence and indent is None and stripped.startswith(">>>"):
            indent = line[:len(line) - len(stripped)]
            if out and out[-1].strip():
                out.append("")
            out.append(indent + FENCE + "pycon")
        out.append(DOCTEST_FLAGS.sub("", line) if indent is not None else line)
    if indent is not None:
        out.append(indent + FENCE)
    return "\n".join(out)


class DoctestExamples(griffe.Extension):
    """Fence the doctest examples of every object's docstring (see the module docstring)."""

    def on_object(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = fence_examples(obj.docstring.value)
