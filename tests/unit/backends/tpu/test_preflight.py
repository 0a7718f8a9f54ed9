"""The plan-time check of the TPU API: credentials, the API enabled, the zone's types and images."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from marinbuild.backends.tpu import preflight as pf
from marinbuild.errors import ClusterConfigError
from tests.tpu_api_emulator import TpuApiEmulator

from .emulated import cluster_for


@pytest.fixture(autouse=True)
def _fresh() -> None:
    pf._CHECKED.clear()  # each test its own emulator, so its own answers


def test_types_and_images_the_zone_offers_pass_and_are_asked_once(emulator: TpuApiEmulator, tmp_path: Path) -> None:
    gcp = cluster_for(emulator, tmp_path).gcp
    assert gcp is not None
    pf.preflight(gcp, {"v4-8", "v6e-8", "v5litepod-16"})
    pf.preflight(gcp, {"v4-16"})
    assert len(emulator.requests("GET", "/acceleratorTypes")) == 1
    assert len(emulator.requests("GET", "/runtimeVersions")) == 1


def test_a_type_or_image_the_zone_lacks_is_one_line(emulator: TpuApiEmulator, tmp_path: Path) -> None:
    gcp = cluster_for(emulator, tmp_path).gcp
    assert gcp is not None
    with pytest.raises(ClusterConfigError, match=r"zone us-central2-b offers no accelerator type 'v5p-4096' \(it offers v4-8"):
        pf.preflight(gcp, {"v5p-4096"})
    with pytest.raises(ClusterConfigError, match=r"no runtime version 'my-image' \(for v6e-8\); set \[gcp\] "
                       r"runtime_versions = \{ v6e = \"...\" \}"):
        pf.preflight(replace(gcp, runtime_versions=(("v6e", "my-image"),)), {"v6e-8"})


def test_a_disabled_api_names_the_command_that_enables_it(emulator: TpuApiEmulator, tmp_path: Path) -> None:
    gcp = cluster_for(emulator, tmp_path).gcp
    assert gcp is not None
    emulator.api_disabled = True
    with pytest.raises(ClusterConfigError) as e:
        pf.preflight(gcp, {"v4-8"})
    text = str(e.value)
    assert "Cloud TPU API has not been used in project my-project" in text and "\n" not in text
    assert text.endswith("enable it: gcloud services enable tpu.googleapis.com --project my-project")
    assert "https://" not in text


def test_missing_credentials_name_the_login_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Google's endpoint, as users have it, with no Application Default Credentials anywhere.
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path / "gcloud"))
    monkeypatch.setenv("GCE_METADATA_HOST", "127.0.0.1:9")  # no metadata server: not a GCE VM
    monkeypatch.setenv("GCE_METADATA_IP", "127.0.0.1:9")
    from marinbuild.backends.tpu.cluster import GcpSettings

    with pytest.raises(ClusterConfigError, match="gcloud auth application-default login") as e:
        pf.preflight(GcpSettings("my-project", "us-central2-b"), {"v4-8"})
    assert "\n" not in str(e.value) and "https://" not in str(e.value)
