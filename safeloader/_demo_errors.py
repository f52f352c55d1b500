"""The demo's error text: what a run raised, in one line (``safeloader.demo``'s table and progress lines)."""

from __future__ import annotations

import re

ERROR_LIMIT = 160  # characters of an error shown in a progress line

# torch re-raises a worker's exception in the parent as
# "Caught X in DataLoader worker process N.\nOriginal Traceback (most recent call last):\n...",
# the worker's traceback as text, its last unindented lines being "module.X: message".
_ORIGINAL_TRACEBACK = "Original Traceback (most recent call last):"
_EXCEPTION_LINE = re.compile(r"^(?P<type>[A-Za-z_][\w.]*)(?::[ ]?(?P<message>.*))?$")


def shorten(text: str, limit: int) -> str:
    """``text`` on one line, at most ``limit`` characters, cut at a word boundary with "..." if longer."""
    text = " ".join(text.split())
    if len(text) <= limit:
        return text
    cut = text[: limit - 3]
    space = cut.rfind(" ")
    if space > limit // 2:  # else one long word: cut inside it rather than lose most of the text
        cut = cut[:space]
    return cut.rstrip(" ,;:.") + "..."


def _original_exception(traceback_text: str) -> tuple[str, str] | None:
    """(type name, message) of the last exception of a formatted traceback, or None."""
    lines = traceback_text.splitlines()
    frames = [i for i, line in enumerate(lines) if line.startswith("  File ")]
    start = frames[-1] + 1 if frames else 0
    for i in range(start, len(lines)):
        line = lines[i]
        if not line or line.startswith(" "):  # the frame's source line, carets
            continue
        match = _EXCEPTION_LINE.match(line)
        if not match:
            return None
        message = [match.group("message") or "", *lines[i + 1 :]]
        return match.group("type").rsplit(".", 1)[-1], " ".join(part.strip() for part in message if part.strip())
    return None


def describe_error(error: BaseException, limit: int = ERROR_LIMIT) -> str:
    """The error's type and its own message (for one torch re-raised from a worker, the worker's
    original), cut at a word boundary when long."""
    text = str(error).strip()
    if _ORIGINAL_TRACEBACK in text:
        original = _original_exception(text.split(_ORIGINAL_TRACEBACK, 1)[1])
        if original is not None:
            name, message = original
            return shorten(f"{name}: {message}" if message else name, limit)
    name = type(error).__name__
    return shorten(f"{name}: {text}" if text else name, limit)
