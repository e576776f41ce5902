"""Call-site helpers: which frame of a stack is the user's code (not torch, Lightning or stdlib)."""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any, Iterable

_LIBRARY_MARKERS = ("site-packages/", "dist-packages/", "<frozen ", "lightning_ncclx/", "/torch/", "/lightning/")
_STDLIB = re.compile(r"/lib(64)?/python3\.\d+/(?!site-packages)")


@lru_cache(maxsize=4096)
def is_library_file(filename: str) -> bool:
    """True for torch/Lightning/stdlib frames: they never say where the user's code is."""
    name = filename.replace("\\", "/")
    if name.startswith(("site-packages/", "torch/", "lightning/")):
        return True
    return any(m in name for m in _LIBRARY_MARKERS) or bool(_STDLIB.search(name))


def format_frame(filename: str, line: Any, func: str) -> str:
    return f"{filename}:{line} in {func}"


def innermost_user_frame(frames: Any) -> str | None:
    """The innermost frame outside library code from a flight-recorder ``frames`` list
    (innermost first, dicts with name/filename/line); the innermost frame if all are library."""
    if not isinstance(frames, list) or not frames:
        return None
    first = None
    for fr in frames:
        if not isinstance(fr, dict):
            continue
        if first is None:
            first = fr
        if not is_library_file(str(fr.get("filename", "?"))):
            return _text(fr)
    return None if first is None else _text(first)


def _text(fr: dict) -> str:
    return format_frame(str(fr.get("filename", "?")), fr.get("line", "?"), str(fr.get("name", "?")))


def format_frames(frames: Any, limit: int = 12) -> tuple[str, ...]:
    if not isinstance(frames, list):
        return ()
    out = []
    for fr in frames[:limit]:
        if isinstance(fr, dict):
            out.append(format_frame(str(fr.get("filename", "?")), fr.get("line", "?"), str(fr.get("name", "?"))))
    return tuple(out)


_FRAME_LINE = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+),? in (?P<func>.+?)\s*$')


def main_thread_user_frame(text: str) -> str | None:
    """From a stacks file (``traceback`` or ``faulthandler`` style, any thread headers), the main
    thread's innermost user frame; None when no frame is found."""
    blocks = _thread_blocks(text.splitlines())
    if not blocks:
        return None
    main = next((b for b in blocks if _is_main_header(b[0])), blocks[0])
    header, frames = main
    if "most recent call first" not in header.lower():
        frames = list(reversed(frames))  # traceback style lists the innermost frame last
    for filename, line, func in frames:
        if not is_library_file(filename):
            return format_frame(filename, line, func)
    return format_frame(*frames[0]) if frames else None


def _is_main_header(header: str) -> bool:
    low = header.lower()
    return "mainthread" in low or "main thread" in low or "(main)" in low


def _thread_blocks(lines: Iterable[str]) -> list[tuple[str, list[tuple[str, str, str]]]]:
    blocks: list[tuple[str, list[tuple[str, str, str]]]] = []
    for line in lines:
        match = _FRAME_LINE.search(line)
        if match:
            if not blocks:
                blocks.append(("", []))
            blocks[-1][1].append((match["file"], match["line"], match["func"]))
        elif line.strip() and not line[:1].isspace() and "thread" in line.lower():
            blocks.append((line, []))
    return [b for b in blocks if b[1]]
