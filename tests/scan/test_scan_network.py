"""Optional: scan a released SGLang wheel (needs network; set FP8MLA_NETWORK_TESTS=1)."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from fp8mla.scan import scan_paths

SGLANG_VERSION = "0.5.2"  # ships the whole-pool casts docs/scan.md describes

pytestmark = pytest.mark.skipif(
    os.environ.get("FP8MLA_NETWORK_TESTS") != "1",
    reason="downloads sglang from PyPI; set FP8MLA_NETWORK_TESTS=1 to run",
)


@pytest.fixture(scope="module")
def sglang_source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("sglang")
    try:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", f"sglang=={SGLANG_VERSION}", "--no-deps",
             "--only-binary=:all:", "--quiet", "--dest", str(root)],
            check=True, capture_output=True, timeout=300,
        )  # fmt: skip
    except (subprocess.SubprocessError, OSError) as exc:
        pytest.skip(f"cannot download sglang=={SGLANG_VERSION}: {exc}")
    (wheel,) = root.glob("sglang-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(root / "src")
    return root / "src" / "sglang"


def test_finds_the_flashinfer_mla_backend_casts(sglang_source: Path) -> None:
    result = scan_paths([sglang_source / "srt"])
    whole = {
        (Path(f.path).name, f.function) for f in result.findings if f.kind == "whole_pool_cast"
    }
    assert ("flashinfer_mla_backend.py", "FlashInferMLAAttnBackend.forward_decode") in whole
    assert ("flashinfer_mla_backend.py", "FlashInferMLAAttnBackend.forward_extend") in whole
    hints = [f for f in result.findings if f.kind == "plan_kv_dtype_hint"]
    assert any(f.function.endswith("call_begin_forward") for f in hints)
