"""``show`` on hostile values: control characters from config and metrics never reach a terminal
(escaped as ``status`` escapes markers), and ``--csv`` cells that a spreadsheet would run as a
formula are neutralised with a leading ``'``."""

from __future__ import annotations

import csv
import fcntl
import io
import os
import pty
import struct
import subprocess
import sys
import termios

import pytest

from .helpers import cli_env, marinbuild, marinbuild_in_process, write_marinfile

MARINFILE = r'''
import json, os
from marinbuild import step, versioned, this_output_path

def train(cfg):
    with open(os.path.join(cfg["output"], "metrics.json"), "w") as f:
        json.dump({"note": cfg["note"], "loss": -0.5, "bell": "ding\u0007", "\u001b[2Jkey": 1}, f)

for i, note in enumerate(["=HYPERLINK(\"http://x\")", "+1+2", "-cmd", "@SUM(A1)", "\tTAB", "\rCR", "-0.25",
                          "\u001b[2J\u001b[Hcleared", "[bold]markup[/bold]"]):
    step(f"sweep/{i}", train, {"note": note, "tag": versioned(note), "output": this_output_path()})
'''

ESCAPES = ("\x1b", "\x07")


@pytest.fixture
def hostile(project):
    write_marinfile(project, MARINFILE)
    ran = marinbuild("run", cwd=project)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    return project


def test_show_csv_neutralises_cells_a_spreadsheet_would_run(hostile):
    # Bytes: text mode would turn the CR inside a quoted cell into a line break.
    result = subprocess.run([sys.executable, "-m", "marinbuild", "show", "sweep/*", "--metrics", "metrics.json", "--csv"],
                            cwd=hostile, env=cli_env(), capture_output=True, check=False)
    assert result.returncode == 0, result.stderr
    text = result.stdout.decode()
    rows = list(csv.DictReader(io.StringIO(text, newline="")))
    tags = [r["tag"] for r in rows]
    assert tags == ["'=HYPERLINK(\"http://x\")", "'+1+2", "'-cmd", "'@SUM(A1)", "'\tTAB", "'\\rCR", "-0.25",
                    "\\x1b[2J\\x1b[Hcleared", "[bold]markup[/bold]"]
    assert [r["note"] for r in rows] == tags  # metric values the same way
    assert {r["loss"] for r in rows} == {"-0.5"}  # a negative number stays a number
    assert {r["bell"] for r in rows} == {"ding\\x07"}
    assert "\\x1b[2Jkey" in rows[0]  # a metric's key is a header: escaped too
    assert not any(c in text for c in ESCAPES)
    for row in rows:  # no cell begins like a formula any more
        for value in row.values():
            assert not value.startswith(("=", "+", "@", "\t", "\r")) and (not value.startswith("-") or value == "-0.25" or value == "-0.5")


def test_show_escapes_control_characters_in_a_pipe(hostile):
    result = marinbuild_in_process("show", "sweep/*", "--metrics", "metrics.json", cwd=hostile)
    assert result.returncode == 0, result.stderr
    assert not any(c in result.stdout for c in ESCAPES), result.stdout
    assert "\\x1b[2J\\x1b[Hcleared" in result.stdout and "ding\\x07" in result.stdout


def test_show_escapes_control_characters_on_a_terminal(hostile):
    # A real pseudo-terminal: show draws its rich table there.
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 500, 0, 0))  # wide enough for whole cells
    env = cli_env({"COLUMNS": "400"})
    process = subprocess.Popen([sys.executable, "-m", "marinbuild", "show", "sweep/*", "--metrics", "metrics.json"],
                               cwd=hostile, env=env, stdin=subprocess.DEVNULL, stdout=follower, stderr=subprocess.PIPE)
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the terminal closed with the process
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    assert process.wait(timeout=60) == 0, process.stderr.read() if process.stderr else ""
    shown = b"".join(chunks).decode("utf-8", "replace")
    assert "\x1b[2J" not in shown and "\x07" not in shown and "\x1b[H" not in shown, shown
    assert "\\x1b[2J\\x1b[Hcleared" in shown and "[bold]markup[/bold]" in shown


def test_a_metrics_name_that_is_a_folder_or_not_utf8_in_some_output_is_skipped_there(project):
    write_marinfile(project, '''
import json, os
from marinbuild import step, versioned, this_output_path

def train(cfg):
    out = cfg["output"]
    if cfg["kind"] == "folder":
        os.makedirs(os.path.join(out, "metrics.json"))
    elif cfg["kind"] == "binary":
        with open(os.path.join(out, "metrics.json"), "wb") as f:
            f.write(bytes([0xff, 0xfe, 0xe4, 0x00]))
    else:
        with open(os.path.join(out, "metrics.json"), "w") as f:
            json.dump({"loss": 0.125}, f)

for kind in ("folder", "binary", "good"):
    step(f"sweep/{kind}", train, {"kind": versioned(kind), "output": this_output_path()})
''')
    ran = marinbuild("run", "-q", cwd=project)
    assert ran.returncode == 0, ran.stderr
    shown = marinbuild_in_process("show", "--json", "--metrics", "metrics.json", cwd=project)
    assert shown.returncode == 0, shown.stderr
    rows = {r["step"]: r for r in __import__("json").loads(shown.stdout)}
    assert rows["sweep/good"]["metrics"] == {"loss": 0.125}
    assert rows["sweep/folder"]["metrics"] == rows["sweep/binary"]["metrics"] == {"loss": None}  # no value there
    page = project / "r.html"
    report = marinbuild_in_process("report", "--metrics", "metrics.json", "-o", str(page), cwd=project)
    assert report.returncode == 0, report.stderr
    assert "0.125" in page.read_text()
    for folder in ("/etc", "."):  # a name that is a folder in every output
        for command in (["show", "--metrics", folder], ["report", "--metrics", folder, "-o", str(page)]):
            result = marinbuild_in_process(*command, cwd=project)
            assert result.returncode == 0 and "internal error" not in result.stderr, result.stderr


def test_an_empty_metrics_file_has_no_metric_and_makes_no_column(project):
    write_marinfile(project, """
import os
from marinbuild import step, versioned, this_output_path

def write(cfg):
    open(os.path.join(cfg["out"], "metrics.json"), "w").write(cfg["text"])

step("t/empty", write, {"lr": versioned(0.1), "text": "{}", "out": this_output_path()})
step("t/empty_list", write, {"lr": versioned(0.2), "text": "[]", "out": this_output_path()})
step("t/full", write, {"lr": versioned(0.3), "text": '{"loss": 0.5}', "out": this_output_path()})
""")
    assert marinbuild("run", "-q", cwd=project).returncode == 0
    table = marinbuild_in_process("show", "--metrics", "metrics.json", "--csv", cwd=project)
    assert table.returncode == 0, table.stderr
    rows = list(csv.DictReader(io.StringIO(table.stdout)))
    assert [c for c in rows[0] if c not in ("step", "lr", "status", "duration_s", "attempts", "accelerator_hours",
                                            "core_hours")] == ["loss"], rows[0]
    assert [r["loss"] for r in rows] == ["", "", "0.5"]
    report = marinbuild_in_process("report", "--metrics", "metrics.json", "-o", "r.html", cwd=project)
    assert report.returncode == 0, report.stderr
    sweep = (project / "r.html").read_text().split('id="sweep"')[1].split("</table>")[0]
    assert 'data-step="t/full"' in sweep and 'data-step="t/empty"' not in sweep  # no metric: the other table


def test_a_field_or_metric_of_zero_is_shown_on_a_terminal_where_zero_hours_go(project):
    """One training, seed 0 and no errors: its ``seed`` and ``errors`` say something, an
    ``accelerator_hours`` of 0 on a CPU step says nothing."""
    from .helpers import on_terminal

    write_marinfile(project, """
import json, os
from marinbuild import step, versioned, this_output_path

def train(cfg):
    json.dump({"loss": 0.5, "errors": 0}, open(os.path.join(cfg["out"], "metrics.json"), "w"))

step("train/only", train, {"lr": versioned(0.1), "seed": versioned(0), "out": this_output_path()})
""")
    assert marinbuild("run", "-q", cwd=project).returncode == 0
    shown = on_terminal(project, "show", "--metrics", "metrics.json", columns=100)
    head = shown.splitlines()[0].split()
    assert {"lr", "seed", "loss", "errors"} <= set(head) and "accelerator_hours" not in head, shown
    assert "not shown for room" not in shown, shown


def test_a_metric_whose_name_holds_a_control_character_keeps_its_values(project):
    """The header is escaped for the terminal (``\\x1b[2J``); the values under it are still the metric's."""
    from .helpers import on_terminal

    write_marinfile(project, """
import json, os
from marinbuild import step, versioned, this_output_path

def write(cfg):
    json.dump({"\\x1b[2Jclear": cfg["v"]}, open(os.path.join(cfg["out"], "metrics.json"), "w"))

for v in (7, 8):
    step(f"t/{v}", write, {"v": versioned(v), "out": this_output_path()})
""")
    assert marinbuild("run", "-q", cwd=project).returncode == 0
    piped = marinbuild_in_process("show", "--metrics", "metrics.json", cwd=project).stdout.splitlines()
    assert piped[0].split()[-1] == "\\x1b[2Jclear", piped  # the last column, escaped
    assert [line.split()[-1] for line in piped[1:]] == ["7", "8"], piped
    shown = on_terminal(project, "show", "--metrics", "metrics.json", columns=100)
    assert "\\x1b[2Jclear" in shown, shown
    assert [line.split("│")[-1].strip() for line in shown.splitlines()[2:4]] == ["7", "8"], shown
