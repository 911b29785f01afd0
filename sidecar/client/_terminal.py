"""What the CLI lets reach a terminal: text that cannot steer it.

A capability's summary, an upstream's error message or an agent's description
is data someone else wrote. Printed raw, an ESC starts a terminal escape
sequence (colours, cursor moves, a window title, a hyperlink), BEL rings, CR
rewrites the line already shown, and a bidi override (U+202E) makes text read
backwards, so ``capd list`` could show a row that is not what the daemon said.
Everything the CLI prints for a person therefore goes through :func:`echo`,
which escapes such characters visibly, in the form Python's ``repr`` uses:
``\\x1b``, ``\\x07``, ``\\r``, ``\\u202e``.

What is escaped (:func:`printable`):

- every C0 control (U+0000-U+001F) except ``\\n`` and ``\\t``, DEL (U+007F) and
  every C1 control (U+0080-U+009F; U+009B is a one-byte CSI on some terminals);
- the invisible direction controls: U+061C, U+200E, U+200F, U+202A-U+202E and
  U+2066-U+2069;
- U+2028 and U+2029, line and paragraph separators some terminals and most
  line-splitting readers (``str.splitlines``) take for a line break;
- the invisible characters that hide text or split a name without showing:
  U+200B (zero-width space), U+2060-U+2064 (word joiner, invisible operators),
  U+FEFF (zero-width no-break space);
- lone surrogates (U+D800-U+DFFF), which JSON can carry but UTF-8 cannot: raw,
  they would stop the CLI with a UnicodeEncodeError.

Ordinary text (``é``, ``日本``, emoji, the zero-width joiner inside an emoji
sequence) is left as it is. A backslash is not doubled: the human rendering is
for reading, and ``--json`` is the exact form.

Line breaks. ``printable`` keeps ``\\n`` and ``\\t``, because the rendered text
is laid out with them: that is how a table has rows and an error sentence on
stderr keeps the lines of, say, a reload's list of declaration errors. A value
that must stay on its own row of a table goes through :func:`one_line` first,
which escapes ``\\n`` and ``\\t`` too, so that a summary holding a newline cannot
draw a row of its own. The renderers (``_render.py``) do that for every value
they put in a row; ``printable`` then guards the whole text at the one place it
is written.

Machine formats. ``--json`` output is never touched: ``json.dumps`` escapes
every control but DEL, which terminals ignore, and the output must be the HTTP
body byte for byte. Other text in a format a program reads (a pretty-JSON
rendering, Prometheus metrics, a Codex TOML file, a completion script, unit
files) is a :class:`Document`: written exactly as it is when redirected, so a
file such as ``capd export --format openai > tools.json`` holds what the daemon
sent, and escaped like any other text when the stream is a terminal, where a
person reads it (GNU ``ls`` makes the same choice for file names).
"""

from __future__ import annotations

import sys
from typing import TextIO

_SHORT = {0x09: "\\t", 0x0A: "\\n", 0x0D: "\\r"}


def _escape(code: int) -> str:
    if code in _SHORT:
        return _SHORT[code]
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


_CONTROLS = (*range(0x00, 0x20), 0x7F, *range(0x80, 0xA0))
_DIRECTION = (0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A))
_SEPARATORS = (0x2028, 0x2029)
_INVISIBLE = (0x200B, *range(0x2060, 0x2065), 0xFEFF)
_SURROGATES = range(0xD800, 0xE000)

# str.translate tables: code point -> its visible escape.
_ONE_LINE = {code: _escape(code)
             for code in (*_CONTROLS, *_DIRECTION, *_SEPARATORS, *_INVISIBLE, *_SURROGATES)}
_PRINTABLE = {code: escape for code, escape in _ONE_LINE.items() if code not in (0x09, 0x0A)}


def printable(text: str) -> str:
    """``text`` with every character that could steer a terminal escaped visibly.

    Keeps ``\\n`` and ``\\t`` (the layout of the text); escapes the other C0
    controls, DEL, the C1 controls, the bidi and direction marks, the line and
    paragraph separators and lone surrogates. Never raises.
    """
    return text.translate(_PRINTABLE)


def one_line(value: object) -> str:
    """:func:`printable` of ``str(value)``, with ``\\n`` and ``\\t`` escaped too: a value for
    one table cell."""
    return str(value).translate(_ONE_LINE)


class Document(str):
    """Text in a machine format (JSON, Prometheus text, TOML, a script).

    :func:`echo` writes it exactly as it is unless the stream is a terminal.
    """

    __slots__ = ()


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except ValueError:  # a closed stream is no terminal; the write will say so
        return False


def echo(text: str, *, err: bool = False, end: str = "\n") -> None:
    """Write ``text`` and ``end`` to stdout, or to stderr with ``err``: the one way
    the CLI prints anything but ``--json``.

    Text is escaped with :func:`printable`; a :class:`Document` is written
    unchanged unless the stream is a terminal. Raises what the stream's write
    raises (``BrokenPipeError`` when the reader has gone: ``main`` handles it).
    """
    stream = sys.stderr if err else sys.stdout
    if not isinstance(text, Document) or _is_terminal(stream):
        text = printable(text)
    stream.write(text + end)
