"""A local step that writes outside its output folder, into a dependency's output or beside the
outputs, is said in one warning line and noted for ``status`` and the report; ``--strict-outputs``
and ``strict_outputs=True`` fail it instead."""

from __future__ import annotations

import json

from .helpers import marinbuild, marinbuild_in_process, write_marinfile

MARINFILE = """
from marinbuild import step, versioned
data = step("data", cmd="echo x > {output}/data.txt", config={"n": versioned(1)})
step("tok", cmd="echo cache > {data}/cache.bin; echo ok > {output}/tok", config={"data": data}, strict_outputs=STRICT)
step("stray", cmd="echo hi > {output}/../stray.txt", config={"k": versioned(1)})
step("edits", cmd="echo more >> {data}/data.txt; echo ok > {output}/x", config={"data": data, "v": versioned(2)})
step("fine", cmd="cat {data}/data.txt > {output}/x", config={"data": data})
"""


def _marinfile(project, strict: bool = False) -> None:
    write_marinfile(project, MARINFILE.replace("STRICT", str(strict)))


def test_writes_outside_the_output_are_warned_and_noted(project):
    _marinfile(project)
    ran = marinbuild("run", "-j", "1", "-q", cwd=project)  # one at a time: each write is its step's
    assert ran.returncode == 0 and ran.stdout.startswith("5 done"), ran.stdout + ran.stderr
    warnings = [line for line in ran.stderr.splitlines() if "warning:" in line]
    assert sorted(warnings) == sorted([
        "marinbuild: warning: tok wrote outside its output: into the output of its dependency data: cache.bin",
        "marinbuild: warning: stray wrote outside its output: beside the outputs in the prefix: stray.txt",
        "marinbuild: warning: edits wrote outside its output: into the output of its dependency data: data.txt",
    ]), ran.stderr
    rows = {r["name"]: r for r in json.loads(marinbuild_in_process("status", "--json", cwd=project).stdout)}
    assert rows["tok"]["outside_writes"] == ["the output of its dependency data: cache.bin"]
    assert rows["fine"]["outside_writes"] is None and rows["data"]["outside_writes"] is None
    shown = marinbuild_in_process("status", cwd=project).stdout
    assert "wrote outside its output: beside the outputs in the prefix: stray.txt" in shown
    made = marinbuild_in_process("report", "-o", "r.html", cwd=project)
    assert made.returncode == 0, made.stderr
    page = (project / "r.html").read_text()
    assert page.count('class="outside-writes"') == 3 and "cache.bin" in page
    again = marinbuild("run", "-q", cwd=project)  # nothing ran: nothing said
    assert "warning" not in again.stderr


def test_strict_outputs_fail_the_step(project):
    _marinfile(project, strict=True)
    ran = marinbuild("run", "-j", "1", "-q", "tok", cwd=project)
    assert ran.returncode == 1
    assert "FAILED tok: tok wrote outside its output: into the output of its dependency data: cache.bin (strict outputs)" in ran.stdout
    _marinfile(project)
    (project / "marinbuild-out").joinpath("stray.txt").unlink(missing_ok=True)
    flag = marinbuild("run", "-j", "1", "-q", "--strict-outputs", "stray", cwd=project)
    assert flag.returncode == 1 and "FAILED stray: stray wrote outside its output" in flag.stdout, flag.stdout
    status = {r["name"]: r["status"] for r in json.loads(marinbuild_in_process("status", "--json", cwd=project).stdout)}
    assert status["stray"] == "FAILED" and status["data"] == "SUCCESS"
    ok = marinbuild("run", "-j", "1", "-q", "--strict-outputs", "fine", cwd=project)
    assert ok.returncode == 0, ok.stdout + ok.stderr


def test_in_parallel_a_write_is_said_with_the_steps_that_ran_beside(project):
    _marinfile(project)
    ran = marinbuild("run", "-j", "4", "-q", cwd=project)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    warnings = [line for line in ran.stderr.splitlines() if "warning:" in line]
    assert any(line.startswith("marinbuild: warning: tok wrote outside its output: into the output of its "
                               "dependency data: cache.bin") for line in warnings), ran.stderr
    for line in warnings:  # a step that wrote nothing is only ever named beside one that may have
        if line.startswith(("marinbuild: warning: fine ", "marinbuild: warning: data ")):
            assert "running at the same time)" in line, line


def test_a_running_step_s_info_holds_only_what_info_json_documents(project):
    """The look before a step runs is handed to its commit, not written: a running step reads its
    own info.json and finds its config, no listing of what lay outside its output."""
    write_marinfile(project, """
from marinbuild import step, versioned
data = step("data", cmd="echo x > {output}/data.txt", config={"n": versioned(1)})
step("reader", cmd="cp {output}/.marinbuild/info.json {output}/seen.json", config={"data": data})
""")
    ran = marinbuild_in_process("run", "-q", cwd=project)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    (seen,) = (project / "marinbuild-out").glob("reader-*/seen.json")
    info = json.loads(seen.read_text())
    assert info["name"] == "reader" and "end_time" not in info  # as it stood while the step ran
    assert "outside_before" not in info and "earlier_output" not in info and "_fence" not in info
    assert not any("Snapshot(" in json.dumps(v) for v in info.values())
