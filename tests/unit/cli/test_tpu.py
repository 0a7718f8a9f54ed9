"""``marinbuild tpu list`` and ``tpu down`` against the emulator (hosts without sshd)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from marinbuild.cli.app import command_line
from tests.tpu_api_emulator import TpuApiEmulator
from tests.unit.backends.tpu.emulated import StandIn, cluster_for
from tests.unit.backends.tpu.test_leftovers import leave_behind


@pytest.fixture
def emulator() -> object:
    with TpuApiEmulator([StandIn(f"10.1.0.{i}").host() for i in range(2, 6)], waiting_s=0.01, provisioning_s=0.01) as emu:
        yield emu


def cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as e:
        command_line(args)
    got = capsys.readouterr()
    return int(e.value.code or 0), got.out, got.err


def write_cluster(emulator: TpuApiEmulator, tmp_path: Path) -> Path:
    cluster_for(emulator, tmp_path)  # writes the key files
    path = tmp_path / "cluster.toml"
    path.write_text(f'[ssh]\nuser = "ops"\nidentity_file = "{tmp_path / "id"}"\n\n[gcp]\nproject = "my-project"\n'
                    f'zone = "us-central2-b"\napi_endpoint = "{emulator.endpoint}"\n')
    return path


def test_list_and_down(emulator: TpuApiEmulator, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    prefix = str(tmp_path / "out")
    name, out = leave_behind(emulator, tmp_path, prefix, "train")
    cluster = write_cluster(emulator, tmp_path)
    common = ["--cluster", str(cluster), "--prefix", prefix]
    code, text, _ = cli(["tpu", "list", *common, "--json"], capsys)
    rows = json.loads(text)
    assert code == 0 and [(r["name"], r["step"], r["state"], r["tpu_type"], r["slices"], r["output_path"]) for r in rows] == [
        (name, "train", "ACTIVE", "v4-8", 1, out)]
    assert rows[0]["hours_held"] >= 0 and rows[0]["held_by"] is None and rows[0]["type"] == "1 x v4-8"
    code, text, _ = cli(["tpu", "list", *common], capsys)
    header = text.splitlines()[0]
    assert code == 0 and header.split()[:5] == ["NAME", "TYPE", "STATE", "STEP", "AGE"] and "HOURS HELD" in header
    assert name in text and "1 x v4-8" in text
    code, text, _ = cli(["tpu", "down", *common], capsys)
    assert code == 0 and f"deleted queued resource {name}" in text
    assert emulator.queued_resource_names() == []
    code, _, errors = cli(["tpu", "down", *common], capsys)
    assert code == 0 and "nothing to delete" in errors


def test_down_by_name_and_bad_input(emulator: TpuApiEmulator, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    prefix = str(tmp_path / "out")
    a, _ = leave_behind(emulator, tmp_path, prefix, "a")
    b, _ = leave_behind(emulator, tmp_path, prefix, "b")
    cluster = write_cluster(emulator, tmp_path)
    common = ["--cluster", str(cluster), "--prefix", prefix]
    code, _, _ = cli(["tpu", "down", *common, b], capsys)
    assert code == 0 and emulator.queued_resource_names() == [a]
    code, _, errors = cli(["tpu", "down", *common, "nope"], capsys)
    assert code == 2 and errors.strip().endswith("is called nope") and len(errors.strip().splitlines()) == 1
    code, _, errors = cli(["tpu", "list", "--prefix", prefix], capsys)
    assert code == 2 and "--cluster" in errors
    static = tmp_path / "static.toml"
    static.write_text('[[slices]]\nname = "s"\ntpu_type = "v4-8"\nhosts = ["h"]\n')
    code, _, errors = cli(["tpu", "list", "--cluster", str(static), "--prefix", prefix], capsys)
    assert code == 2 and "has no [gcp] table" in errors
    code, _, _ = cli(["tpu", "down", *common, "--all"], capsys)
    assert code == 0 and emulator.queued_resource_names() == []


def test_list_names_a_step_as_declared_not_as_its_label(
        emulator: TpuApiEmulator, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    prefix = str(tmp_path / "out")
    name, _ = leave_behind(emulator, tmp_path, prefix, "sweep/Lr_3")  # its label: sweep-lr_3
    cluster = write_cluster(emulator, tmp_path)
    code, text, _ = cli(["tpu", "list", "--cluster", str(cluster), "--prefix", prefix, "--json"], capsys)
    assert code == 0 and [(r["name"], r["step"]) for r in json.loads(text)] == [(name, "sweep/Lr_3")]
    code, text, _ = cli(["tpu", "list", "--cluster", str(cluster), "--prefix", prefix], capsys)
    assert code == 0 and "sweep/Lr_3" in text
    cli(["tpu", "down", "--cluster", str(cluster), "--prefix", prefix], capsys)
