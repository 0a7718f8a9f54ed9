"""Loading a Marinfile: errors are one line naming the Marinfile's own line."""

from __future__ import annotations

from pathlib import Path

import pytest

from marinbuild.errors import MarinbuildError
from marinbuild.marinfile import load_marinfile


def test_an_error_raised_in_generated_code_names_the_marinfiles_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A dataclass's generated __init__ runs as "<string>", which would resolve under the
    # current folder and pass for the user's code.
    monkeypatch.chdir(tmp_path)
    marinfile = tmp_path / "Marinfile.py"
    marinfile.write_text(
        "from marinbuild import ResourceConfig, step\n"
        "\n"
        "train = step('train', cmd='true', resources=ResourceConfig.with_tpu('v4-7', slice_count=2))\n"
    )
    with pytest.raises(MarinbuildError) as e:
        load_marinfile(str(marinfile))
    assert str(e.value).startswith(f"{marinfile}:3: ") and "<string>" not in str(e.value)
    assert "v4-7" in str(e.value) and "\n" not in str(e.value)


def test_a_missing_marinfile_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(MarinbuildError, match="no Marinfile at"):
        load_marinfile(str(tmp_path / "Marinfile.py"))
