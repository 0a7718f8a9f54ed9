"""`marinbuild report`: one self-contained HTML file, loaded in a real headless Chromium (Debian `chromium`)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import threading
import zlib
from pathlib import Path

from .fixtures_ssh import pids_with_env, wait_for
from .helpers import marinbuild, marinbuild_in_process, plan_json, write_marinfile

MARINFILE = """
from marinbuild import step, versioned, ResourceConfig

def prepare(cfg):
    print("prepared", cfg["n"])

data = step("data/prepare", prepare, {"n": versioned(3)})
# Attempt 1 is preempted on worker 1 (the test flips its metadata answer and kills it); attempt 2 runs.
tpu = step("train/tpu", config={"data": data}, resources=ResourceConfig.with_tpu("v4-16"),
           cmd='if [ "$MARINBUILD_ATTEMPT" = 1 ] && [ "$MARINBUILD_WORKER_ID" = 1 ]; then '
               'touch "$MARINBUILD_OUTPUT/started"; exec sleep 3033; fi; echo training on $MARINBUILD_WORKER_ID')
flaky = step("eval/flaky", cmd="echo evaluating; exit 4", config={"model": tpu}, max_retries_failure=1)
summary = step("summary", cmd="echo never", config={"e": flaky})
"""

CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--host-resolver-rules=MAP * ~NOTFOUND",
]


def _chromium() -> str:
    found = shutil.which("chromium")
    assert found is not None, "these tests need a real headless Chromium: apt-get install chromium"
    return found


def _browser(tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    profile = tmp / f"profile-{len(list(tmp.glob('profile-*')))}"
    return subprocess.run(
        [_chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args],
        capture_output=True, text=True, timeout=120, check=False,
    )


def _png_pixels(path: Path) -> tuple[int, int, bytes]:
    """Width, height and the decompressed image data of a PNG (filter bytes included)."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, width, height = 8, b"", 0, 0
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, height = struct.unpack(">II", body[:8])
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    return width, height, zlib.decompress(idat)


def test_report_renders_dag_timeline_and_hours_in_headless_chromium(project, fleet, tmp_path):
    write_marinfile(project, MARINFILE)
    cluster = fleet.write_cluster(project / "cluster.toml", [("a", "v4-16", [0, 1])], python=sys.executable)
    tpu_out = Path(plan_json(project, "--cluster", str(cluster))["train/tpu"]["output_path"])
    victim = fleet.hosts[1]

    def preempt() -> None:
        wait_for(lambda: (tpu_out / "started").exists(), timeout=90)
        victim.set_preempted(True)
        for pid in pids_with_env(f"FAKE_HOST_ID={victim.index}", f"HOME={victim.home}", "MARINBUILD_ATTEMPT=1"):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    preempter = threading.Thread(target=preempt)
    preempter.start()
    ran = marinbuild("run", "--cluster", str(cluster), "--no-sync", "-k", cwd=project,
                     env={"MARINBUILD_RETRY_BASE_DELAY": "0.01"})
    preempter.join()
    assert ran.returncode == 1, ran.stdout + ran.stderr  # eval/flaky fails twice; summary never starts

    made = marinbuild_in_process("report", "summary", "-o", "run.html", cwd=project)
    assert made.returncode == 0, made.stderr
    assert made.stderr.strip() == "marinbuild: wrote run.html (4 steps, 5 attempts)"
    page = project / "run.html"
    text = page.read_text()
    # Self-contained: nothing to fetch (no URL, no external script, style or image).
    assert not re.search(r"https?:|src=|href=|@import|url\(", text)

    dom = _browser(tmp_path, "--dump-dom", page.as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    html = dom.stdout
    assert 'data-ready="1"' in html  # the inline script ran
    assert "4 steps, 5 attempts drawn" in html
    nodes = {step: status for status, step in re.findall(r'<g class="node status-(\w+)" data-step="([^"]+)"', html)}
    assert nodes == {"data/prepare": "SUCCESS", "train/tpu": "SUCCESS", "eval/flaky": "FAILED", "summary": "NONE"}
    assert len(re.findall(r'<path class="edge"', html)) == 3
    bars = re.findall(r'<g class="bar kind-(\w+) ?(\w*)" data-step="([^"]+)" data-attempt="(\d+)" '
                      r'data-kind="\w+" data-group="([^"]+)"', html)
    assert sorted((step, int(n), kind, mark) for kind, mark, step, n, _ in bars) == [
        ("data/prepare", 1, "SUCCESS", ""),
        ("eval/flaky", 1, "FAILED", "failed"),
        ("eval/flaky", 2, "FAILED", "failed"),
        ("train/tpu", 1, "PREEMPTED", "preempted"),
        ("train/tpu", 2, "SUCCESS", ""),
    ]
    groups = {step: group for _, _, step, _, group in bars}
    assert groups["train/tpu"].endswith("· tpu") and groups["data/prepare"].endswith("· local")
    assert groups["train/tpu"].split(" · ")[0] == groups["data/prepare"].split(" · ")[0]  # one runner
    # The timeline's bars follow the recorded start times: the TPU step ran after its input.
    xs = {(step, n): float(x) for step, n, x in re.findall(
        r'data-step="([^"]+)" data-attempt="(\d+)"[^>]*><title>[^<]*</title><rect x="([\d.]+)"', html)}
    assert xs[("data/prepare", "1")] < xs[("train/tpu", "1")] < xs[("train/tpu", "2")] < xs[("eval/flaky", "1")] < xs[("eval/flaky", "2")]
    assert re.search(r'data-step="train/tpu" data-attempt="1"[^>]*>.*?<text class="mark"[^>]*>P</text>', html)

    # Per step: resources, attempts, hours held; totals at the foot.
    per_step = re.search(r'<table id="steps">.*?</table>', html, re.S)
    assert per_step is not None
    rows = dict(re.findall(r'<tr data-step="([^"]+)">(.*?)</tr>', per_step.group(0)))
    cells = {k: re.findall(r"<td>(.*?)</td>", v) for k, v in rows.items()}
    assert cells["train/tpu"][3] == "1x v4-16 (8 chips)"
    assert cells["eval/flaky"][4] == "2 (2 failed)"
    assert cells["train/tpu"][4] == "2 (1 preempted)"
    # The preempted attempt held its chips too: both attempts count.
    chip_hours = sum(8 * a["duration_s"] / 3600 for a in json.loads((tpu_out / "attempts.json").read_text())["attempts"])
    assert float(cells["train/tpu"][6]) == round(chip_hours, 4 if chip_hours < 0.01 else 2)
    assert re.search(r'data-total="attempts"><span>attempts</span><b>5 \(3 not successful\)</b>', html)
    assert '<tr class="totals"><td>total</td>' in html

    shot = tmp_path / "report.png"
    taken = _browser(tmp_path, "--window-size=1400,1100", f"--screenshot={shot}", page.as_uri())
    assert taken.returncode == 0, taken.stderr[-2000:]
    width, height, pixels = _png_pixels(shot)
    assert (width, height) == (1400, 1100)
    assert len(set(pixels)) > 50  # drawn: text, coloured boxes and bars, not a blank page


def test_report_of_steps_that_never_ran_and_a_bad_output_folder(project, tmp_path):
    write_marinfile(project, 'from marinbuild import step\nstep("a", cmd="true")\n')
    made = marinbuild_in_process("report", cwd=project)
    assert made.returncode == 0, made.stderr
    text = (project / "report.html").read_text()
    assert 'id="timeline-empty"' in text and 'data-step="a" data-status="NONE"' in text
    bad = marinbuild_in_process("report", "-o", "no/such/dir/r.html", cwd=project)
    assert bad.returncode == 2 and bad.stderr.startswith("marinbuild: error: cannot write no/such/dir/r.html")
    assert not (project / "no").exists()
    # `-o -`: the page on standard output (to pipe or mail it), no file named "-".
    piped = marinbuild_in_process("report", "-o", "-", cwd=project)
    assert piped.returncode == 0, piped.stderr
    assert piped.stdout.startswith("<!DOCTYPE html>") and 'data-step="a" data-status="NONE"' in piped.stdout
    assert not (project / "-").exists() and "standard output" in piped.stderr


def test_the_report_of_one_step_says_one_step(project):
    write_marinfile(project, """
from marinbuild import step, versioned
step("only", cmd="true", config={"n": versioned(1)})
""")
    assert marinbuild("run", "-q", cwd=project).returncode == 0
    made = marinbuild_in_process("report", "-o", "one.html", cwd=project)
    assert made.returncode == 0 and made.stderr.strip() == "marinbuild: wrote one.html (1 step, 1 attempt)", made.stderr


def test_a_curves_name_that_is_a_folder_or_not_utf8_in_some_output_is_skipped_there(project):
    write_marinfile(project, """
import os
from marinbuild import step, versioned, this_output_path

def write(cfg):
    path = os.path.join(cfg["out"], "log.jsonl")
    if cfg["kind"] == "folder":
        os.mkdir(path)
    elif cfg["kind"] == "binary":
        open(path, "wb").write(b"\\xff\\xfe\\x00 not text")
    else:
        open(path, "w").write('{"step": 0, "loss": 1}\\n{"step": 1, "loss": 0.5}\\n')

for kind in ("folder", "binary", "good"):
    step(f"t/{kind}", write, {"kind": versioned(kind), "out": this_output_path()})
""")
    assert marinbuild("run", "-q", cwd=project).returncode == 0
    made = marinbuild_in_process("report", "--curves", "log.jsonl", "-o", "r.html", cwd=project)
    assert made.returncode == 0, made.stderr
    page = (project / "r.html").read_text()
    assert re.findall(r'<polyline class="curve" data-step="([^"]+)"', page) == ["t/good"]


def test_the_per_step_table_names_only_the_retries_a_step_used(project):
    write_marinfile(project, """
import os
from marinbuild import step, versioned, this_output_path

def flaky(cfg):
    if not os.path.exists(cfg["mark"]):
        open(cfg["mark"], "w").close()
        raise SystemExit(3)

step("calm", cmd="true", config={"n": versioned(1)})
step("flaky", flaky, {"n": versioned(2), "mark": os.path.abspath("failed-once"), "out": this_output_path()},
     max_retries_failure=1)
""")
    ran = marinbuild("run", "-q", cwd=project, env={"MARINBUILD_RETRY_BASE_DELAY": "0.01"})
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert marinbuild_in_process("report", "-o", "r.html", cwd=project).returncode == 0
    table = (project / "r.html").read_text().split('id="steps"')[1].split("</table>")[0]
    cells = {name: re.findall(r"<td>(.*?)</td>", row)[9] for name, row in
             re.findall(r'<tr data-step="([^"]+)">(.*?)</tr>', table)}
    assert cells == {"calm": "", "flaky": "failures 1/1"}, cells
