"""Domain layer: which characters a name the service shows may hold, and how long text is cut.

Queue names, item groups and failure reasons end up in logs, listings, the CLI's tables and the
console, each on one line; a name holding ESC, BEL or NUL would reach a terminal as a command. One
rule serves them all.
"""

from __future__ import annotations

import unicodedata

from querator.domain.errors import InvalidRequestError

#: Control characters (C0, DEL, C1), surrogates and line or paragraph separators. Format characters
#: (the zero-width joiner of emoji) are allowed.
_NOT_PRINTABLE = frozenset({"Cc", "Cs", "Zl", "Zp"})


def check_printable(value: str, what: str) -> str:
    """``value``, or ``InvalidRequestError`` naming ``what`` when it holds a control character."""
    # isprintable() is one C loop; the category lookup runs only for the rare names it flags (spaces,
    # format characters, other scripts' marks), which are allowed or refused by category.
    if not value.isprintable() and any(unicodedata.category(c) in _NOT_PRINTABLE for c in value):
        raise InvalidRequestError(f"{what} may not hold control characters", field=what)
    return value


def clip_utf8(value: str, limit: int, *, keep_end: bool = False) -> str:
    """``value`` cut to at most ``limit`` bytes of UTF-8, at a character boundary: its start kept
    (``keep_end``: its end, as for the tail of a log), and ``…`` where it was cut."""
    data = value.encode()
    if len(data) <= limit:
        return value
    mark = "\u2026"
    room = limit - len(mark.encode())
    if keep_end:
        return mark + data[len(data) - room :].decode(errors="ignore")
    return data[:room].decode(errors="ignore") + mark


__all__ = ["check_printable", "clip_utf8"]
