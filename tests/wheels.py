"""A wheel of a tiny package, written by hand: no build backend and no index are needed."""

from __future__ import annotations

import base64
import hashlib
import zipfile
from pathlib import Path


def make_wheel(folder: Path, name: str = "tinypkg", version: str = "1.0", code: str = "VALUE = 42\n") -> Path:
    """Write ``name-version-py3-none-any.whl`` holding the module ``name`` with ``code``; its path."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}-{version}-py3-none-any.whl"
    dist = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": code,
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: marinbuild-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for member, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{member},sha256={digest},{len(text.encode())}")
    record.append(f"{dist}/RECORD,,")
    files[f"{dist}/RECORD"] = "\n".join(record) + "\n"
    with zipfile.ZipFile(path, "w") as z:
        for member, text in files.items():
            z.writestr(member, text)
    return path


def direct_reference(wheel: Path, name: str = "tinypkg") -> str:
    """``name @ file:///…``: the PEP 508 direct reference to ``wheel``."""
    return f"{name} @ {wheel.resolve().as_uri()}"
