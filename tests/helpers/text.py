"""Text in the forms parsers read differently."""

from __future__ import annotations


def fullwidth(text: str) -> str:
    """``text`` in full-width forms (U+FF01...), which IDNA maps back to ASCII."""
    return "".join(chr(ord(c) + 0xFEE0) for c in text)
