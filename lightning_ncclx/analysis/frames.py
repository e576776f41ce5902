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


def _scalar(value: Any) -> str:
    """A frame field as text; a container (which ``str`` would expand, however deep or
    memo-shared) reads as ``?``."""
    if isinstance(value, str):
        return value[:500]
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value) if abs(value) < 1e18 else "?"
    return "?"


def innermost_user_frame(frames: Any) -> str | None:
    """The innermost frame outside library code from a flight-recorder ``frames`` list
    (innermost first, dicts with name/filename/line); the innermost frame if all are library."""
    if not isinstance(frames, list) or not frames:
        return None
    first = None
    for fr in frames:
        if type(fr) is not dict:
            continue
        if first is None:
            first = fr
        filename = fr.get("filename")
        if not is_library_file(filename if type(filename) is str else _scalar(filename)):
            return _text(fr)
    return None if first is None else _text(first)


def _text(fr: dict) -> str:
    filename, line, func = fr.get("filename"), fr.get("line"), fr.get("name")
    if type(filename) is str and type(line) is int and type(func) is str:  # the common case, fast
        return f"{filename}:{line} in {func}"
    return format_frame(_scalar(filename), _scalar(line), _scalar(func))


def format_frames(frames: Any, limit: int = 12) -> tuple[str, ...]:
    if not isinstance(frames, list):
        return ()
    out = []
    for fr in frames[:limit]:
        if isinstance(fr, dict):
            out.append(_text(fr))
    return tuple(out)


# Linear: no lazy group before a trailing ``\s*$`` (a long run of spaces made that quadratic).
_FRAME_LINE = re.compile(r'File "(?P<file>[^"\n]{1,4096})", line (?P<line>\d{1,12}),? in (?P<func>[^\n]*)')
MAX_STACK_LINE = 8192


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


# What a main thread is doing when its innermost frames are library code: (file fragment,
# function names or None for any, description). The first entry matching any frame wins, so
# the specific waits come before the generic ones (a data loader waits on a queue and a lock).
_ACTIVITIES: tuple[tuple[str, frozenset[str] | None, str], ...] = (
    ("torch/utils/data/", None, "waiting for the data loader"),
    ("torch/distributed/checkpoint/", None, "in distributed checkpointing (torch.distributed.checkpoint)"),
    ("torch/serialization.py", frozenset({"save", "_save", "load", "_load"}),
     "reading or writing a checkpoint (torch.save/load)"),
    ("torch/cuda/__init__.py", frozenset({"synchronize"}), "in torch.cuda.synchronize (waiting for the GPU)"),
    ("torch/distributed/distributed_c10d.py", frozenset({"_store_based_barrier", "monitored_barrier"}),
     "in a store-based barrier (not a recorded collective)"),
    ("torch/distributed/elastic/", None, "in torch elastic (rendezvous or agent)"),
    ("/queue.py", frozenset({"get", "put"}), "blocked on a queue"),
    ("/threading.py", frozenset({"wait", "join", "acquire"}), "waiting on a lock, event or thread"),
    ("/subprocess.py", frozenset({"wait", "communicate", "_wait", "_communicate"}), "waiting for a subprocess"),
)


def main_thread_activity(text: str) -> str | None:
    """What library code the main thread of a stacks file is in, when it is a known waiting spot
    (data loader, checkpoint, GPU sync, store barrier, locks); None otherwise."""
    blocks = _thread_blocks(text.splitlines())
    if not blocks:
        return None
    header, frames = next((b for b in blocks if _is_main_header(b[0])), blocks[0])
    if "most recent call first" not in header.lower():
        frames = list(reversed(frames))
    for fragment, funcs, description in _ACTIVITIES:
        for filename, line, func in frames:
            if fragment in filename.replace("\\", "/") and (funcs is None or func in funcs):
                return f"{description}: {format_frame(filename, line, func)}"
    return None


def _is_main_header(header: str) -> bool:
    low = header.lower()
    return "mainthread" in low or "main thread" in low or "(main)" in low


def _thread_blocks(lines: Iterable[str]) -> list[tuple[str, list[tuple[str, str, str]]]]:
    blocks: list[tuple[str, list[tuple[str, str, str]]]] = []
    for line in lines:
        match = _FRAME_LINE.search(line[:MAX_STACK_LINE])
        if match and match["func"].strip():
            if not blocks:
                blocks.append(("", []))
            blocks[-1][1].append((match["file"], match["line"], match["func"].strip()))
        elif line.strip() and not line[:1].isspace() and "thread" in line.lower():
            blocks.append((line, []))
    return [b for b in blocks if b[1]]
