"""The HTML report in a real browser (headless Chromium, 1400x900): after layout, the verdict, the
culprit's stop cell and every row's stop point are inside the viewport, and nothing runs off the
right edge. ``.ci/run`` installs Debian's ``chromium``; elsewhere the test skips saying why."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from lightning_ncclx.analysis import analyze_folder
from lightning_ncclx.report import render_html

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "analysis"))
from synth import collectives, dump, entry, write  # noqa: E402

WIDTH, HEIGHT = 1400, 900
_MEASURE = """<script>window.addEventListener('load',function(){
function r(e){var b=e.getBoundingClientRect();return [b.left,b.top,b.right,b.bottom];}
var out={inner:[window.innerWidth,window.innerHeight],scrollWidth:document.documentElement.scrollWidth,
verdict:r(document.getElementById('verdict')),stop:r(document.getElementById('culprit-stop')),
states:Array.prototype.map.call(document.querySelectorAll('.st'),r)};
document.getElementById('culprit-stop').click();out.detail=document.getElementById('detail').textContent;
var p=document.createElement('pre');p.id='rects';p.textContent=JSON.stringify(out);document.body.appendChild(p);});
</script>"""


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        path = shutil.which(name)
        if path:
            return path
    pytest.skip("no Chromium on this machine (.ci/run installs Debian's chromium: apt-get install -y chromium)")


def _browser(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    cmd = [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
           f"--user-data-dir={tmp_path / 'profile'}", f"--window-size={WIDTH},{HEIGHT}", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def _hung_job(folder: Path) -> Path:
    """16 ranks on 4 hosts; rank 13 skipped the newest all_reduce from a deeply nested call site."""
    world = 16
    groups = {"0": ("default_pg", list(range(world))), "1": ("undefined", list(range(8, 16)))}
    deep = "/very/long/path/" + "/".join(f"package_{i}" for i in range(12)) + "/training_loop_module.py"
    for r in range(world):
        es = collectives(30 if r == 13 else 31, last_state="completed" if r == 13 else "started",
                         frames=[{"name": "step", "filename": deep, "line": 4242}])
        if r >= 8:
            es.append(entry(100, 1, pg=("1", "undefined"), t_ns=es[5]["time_created_ns"] + 1))
        write(folder, f"rank_{r:05d}.nccl.fr.pkl", dump(es, groups))
        (folder / f"rank_{r:05d}.context.json").write_text(json.dumps(
            {"rank": r, "host": f"gpu-node-{r // 4:03d}.cluster.example", "world_size": world, "phase": "train_step"}))
    return folder


def test_verdict_and_culprit_stop_cell_are_on_screen_at_1400x900(tmp_path):
    summary = analyze_folder(_hung_job(tmp_path / "dumps"))
    assert summary.culprit_ranks == (13,)
    page = render_html(summary)
    measured = tmp_path / "measured.html"
    measured.write_text(page.replace("</main></body>", f"</main>{_MEASURE}</body>"))
    done = _browser(["--virtual-time-budget=3000", "--dump-dom", measured.as_uri()], tmp_path)
    found = re.search(r'<pre id="rects">(.*?)</pre>', done.stdout)
    assert found, f"no measurements from Chromium (rc {done.returncode}): {done.stderr[-2000:]}"
    m = json.loads(found.group(1).replace("&quot;", '"'))
    width, height = m["inner"]
    assert width == WIDTH, m

    def on_screen(rect: list[float]) -> bool:
        left, top, right, bottom = rect
        return left >= 0 and top >= 0 and right <= width and bottom <= height and right > left

    assert on_screen(m["verdict"]), m
    assert on_screen(m["stop"]), m
    assert m["states"] and all(on_screen(r) for r in m["states"]), m  # every row's stop point
    assert m["scrollWidth"] <= width, m  # nothing runs off the right edge
    assert m["detail"].startswith("rank 13 "), m  # a click shows the cell's details

    shot = tmp_path / "report.png"
    done = _browser([f"--screenshot={shot}", (tmp_path / "measured.html").as_uri()], tmp_path)
    assert shot.is_file() and shot.stat().st_size > 10_000, done.stderr[-2000:]


_MEASURE_RECOVERED = """<script>window.addEventListener('load',function(){
function r(e){var b=e.getBoundingClientRect();return [b.left,b.top,b.right,b.bottom];}
var banner=document.getElementById('recovered');
var out={inner:[window.innerWidth,window.innerHeight],banner:banner?r(banner):null,
verdict:r(document.getElementById('verdict')),text:banner?banner.textContent:'',
color:banner?getComputedStyle(banner).backgroundColor:''};
var p=document.createElement('pre');p.id='rects';p.textContent=JSON.stringify(out);document.body.appendChild(p);});
</script>"""


def test_a_recovered_event_says_so_first_on_screen(tmp_path):
    folder = _hung_job(tmp_path / "dumps")
    (folder / "collection.json").write_text(json.dumps({"recovery": {"recovered": True, "lasted_seconds": 11.8,
                                                                     "ranks_moved_on": 16}}))
    summary = analyze_folder(folder)
    measured = tmp_path / "measured.html"
    measured.write_text(render_html(summary).replace("</main></body>", f"</main>{_MEASURE_RECOVERED}</body>"))
    done = _browser(["--virtual-time-budget=3000", "--dump-dom", measured.as_uri()], tmp_path)
    found = re.search(r'<pre id="rects">(.*?)</pre>', done.stdout)
    assert found, f"no measurements from Chromium (rc {done.returncode}): {done.stderr[-2000:]}"
    m = json.loads(found.group(1).replace("&quot;", '"'))
    assert m["banner"] is not None, m
    left, top, right, bottom = m["banner"]
    assert 0 <= top and bottom <= m["verdict"][1] and right > left, m  # above the verdict, on screen
    assert m["text"].startswith("RECOVERED: recovered after 11.8 s: not a hang"), m
    assert m["color"] not in ("", "rgba(0, 0, 0, 0)"), m  # a banner, not plain text
