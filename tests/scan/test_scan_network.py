"""Optional: scan released SGLang wheels (needs network; set FP8MLA_NETWORK_TESTS=1).

The true sites below were read by hand in each release: every ``whole_pool_cast`` must be one
of them (precision), and every one of them must be found (recall).
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from fp8mla.scan import scan_paths

pytestmark = pytest.mark.skipif(
    os.environ.get("FP8MLA_NETWORK_TESTS") != "1",
    reason="downloads sglang from PyPI; set FP8MLA_NETWORK_TESTS=1 to run",
)

# (file under sglang/, function) of every whole-pool or whole-buffer cast in 0.5.23.
TRUE_SITES_0_5_23 = {
    ("srt/layers/attention/flashinfer_mla_backend.py", "FlashInferMLAAttnBackend.forward_decode"),
    ("srt/layers/attention/flashinfer_mla_backend.py", "FlashInferMLAAttnBackend.forward_extend"),
    ("srt/layers/attention/flashattention_backend.py", "FlashAttentionBackend.forward_decode"),
    ("srt/layers/attention/flashattention_backend.py", "FlashAttentionBackend.forward_extend"),
    (
        "srt/hardware_backend/musa/attention/flashattention_backend.py",
        "MusaFlashAttentionBackend.forward_decode",
    ),
    (
        "srt/hardware_backend/musa/attention/flashattention_backend.py",
        "MusaFlashAttentionBackend.forward_extend",
    ),
    ("srt/layers/attention/xpu_backend.py", "XPUAttentionBackend.forward_decode"),
    ("srt/layers/attention/xpu_backend.py", "XPUAttentionBackend.forward_extend"),
    ("srt/layers/attention/qsa/mqa.py", "tilelang_qsa_mqa_decode"),
    ("srt/layers/attention/qsa/qsa_indexer.py", "QSAIndexer._fused_compress_store"),
    ("test/kernels/dsa_k_cache_reference.py", "_quantize_k_cache_ref"),
}
# Casts that look like one but are not: Triton kernels' integer offsets, an all-gathered prefix,
# a video model's cached window joined to the new chunk.
LOOKALIKES_0_5_23 = {
    ("srt/disaggregation/common/staging_buffer.py", "_fused_gather_to_staging_kernel"),
    ("srt/disaggregation/common/staging_buffer.py", "_fused_scatter_from_staging_kernel"),
    ("srt/layers/dcp/comm.py", "all_gather_kv_cache_for_mha_extend"),
    (
        "multimodal_gen/runtime/models/dits/sana_wm_components.py",
        "BidirectionalGDNUCPESinglePathLiteLA._main_branch_softmax_cached",
    ),
}


def _download(version: str, root: Path) -> Path:
    try:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", f"sglang=={version}", "--no-deps",
             "--only-binary=:all:", "--quiet", "--dest", str(root)],
            check=True, capture_output=True, timeout=300,
        )  # fmt: skip
    except (subprocess.SubprocessError, OSError) as exc:
        pytest.skip(f"cannot download sglang=={version}: {exc}")
    (wheel,) = root.glob("sglang-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(root / "src")
    return root / "src" / "sglang"


@pytest.fixture(scope="module")
def sglang_0_5_2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _download("0.5.2", tmp_path_factory.mktemp("sglang052"))


@pytest.fixture(scope="module")
def sglang_0_5_23(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _download("0.5.23", tmp_path_factory.mktemp("sglang0523"))


def test_finds_the_flashinfer_mla_backend_casts(sglang_0_5_2: Path) -> None:
    result = scan_paths([sglang_0_5_2 / "srt"])
    whole = {
        (Path(f.path).name, f.function) for f in result.findings if f.kind == "whole_pool_cast"
    }
    assert ("flashinfer_mla_backend.py", "FlashInferMLAAttnBackend.forward_decode") in whole
    assert ("flashinfer_mla_backend.py", "FlashInferMLAAttnBackend.forward_extend") in whole
    hints = [f for f in result.findings if f.kind == "plan_kv_dtype_hint"]
    assert any(f.function.endswith("call_begin_forward") for f in hints)


def test_high_findings_of_0_5_23_are_real_and_complete(sglang_0_5_23: Path) -> None:
    result = scan_paths([sglang_0_5_23])
    high = [
        (Path(f.path).relative_to(sglang_0_5_23).as_posix(), f.function)
        for f in result.findings
        if f.severity == "high"
    ]
    true = [site for site in high if site in TRUE_SITES_0_5_23]
    assert len(true) / len(high) >= 0.9, sorted(set(high) - TRUE_SITES_0_5_23)
    assert TRUE_SITES_0_5_23 <= set(high)  # every true site still found
    assert not LOOKALIKES_0_5_23 & set(high)
