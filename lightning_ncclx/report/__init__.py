"""Summary -> text / JSON / Markdown / HTML, and the files a dump event leaves behind.
No analysis logic lives here.

Example::

    from lightning_ncclx.analysis import analyze_folder
    from lightning_ncclx.report import render_text, write_reports
    summary = analyze_folder(folder)
    print(render_text(summary))
    write_reports(summary, folder)   # summary.json, summary.txt, summary.html
"""

from __future__ import annotations

import json
import os
import stat
import tempfile
from pathlib import Path

from lightning_ncclx.analysis.model import Summary
from lightning_ncclx.report.html import render_html
from lightning_ncclx.report.text import render_markdown, render_text

__all__ = ["render_html", "render_json", "render_markdown", "render_text", "write_atomic", "write_reports"]


def render_json(summary: Summary) -> str:
    """The documented JSON form (``docs/summary-json.md``)."""
    return json.dumps(summary.to_dict(), indent=2, sort_keys=False) + "\n"


def write_atomic(path: Path, text: str) -> Path:
    """Write ``text`` so readers never see half a file: a temporary file in the target's folder,
    then ``os.replace``. A symlink is written through (its target is replaced, the link kept); a
    target that is not a regular file (``/dev/stdout``, a FIFO, a terminal) is written directly;
    an existing file keeps its mode, a new one gets the umask's. Unencodable characters (lone
    surrogates from odd file names) are written as ``\\udcXX`` escapes. Raises OSError."""
    path = Path(path)
    data = text.encode("utf-8", errors="backslashreplace")
    try:
        st = os.stat(path)  # follows symlinks
    except FileNotFoundError:
        st = None
    if st is not None and not stat.S_ISREG(st.st_mode):
        with open(path, "wb") as fh:  # /dev/stdout, a pipe or terminal: no rename possible
            fh.write(data)
        return path
    real = Path(os.path.realpath(path)) if path.is_symlink() else path
    real.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{real.name}.", suffix=".tmp", dir=real.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.chmod(tmp, stat.S_IMODE(st.st_mode) if st is not None else 0o666 & ~_umask())
        os.replace(tmp, real)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_reports(summary: Summary, folder: str | os.PathLike) -> dict[str, Path]:
    """Write summary.json, summary.txt and summary.html into ``folder``; returns format -> path."""
    folder = Path(folder)
    return {
        "json": write_atomic(folder / "summary.json", render_json(summary)),
        "text": write_atomic(folder / "summary.txt", render_text(summary)),
        "html": write_atomic(folder / "summary.html", render_html(summary)),
    }
