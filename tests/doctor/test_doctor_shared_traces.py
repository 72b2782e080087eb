"""The shared real traces (H200, GLM-5 shaped decode loop) and the external variety traces."""

from __future__ import annotations

from pathlib import Path

import pytest

from fp8mla.doctor import diagnose, format_text

TRACES = Path(__file__).resolve().parents[1] / "data" / "traces"
FULL_CAST = TRACES / "glm5_tp2_full_cast.json.gz"
FP8_DIRECT = TRACES / "glm5_tp2_fp8_direct.json.gz"
EXTERNAL = sorted((TRACES / "external").glob("*.json.gz"))


@pytest.fixture(scope="module")
def full_cast() -> dict:
    return diagnose(FULL_CAST)


@pytest.fixture(scope="module")
def fp8_direct() -> dict:
    return diagnose(FP8_DIRECT)


def _pool(report: dict) -> list[dict]:
    return [f for f in report["findings"] if f["kind"] == "pool_proportional_cast"]


def test_full_cast_finding_matches_the_hand_reading(full_cast):
    (finding,) = _pool(full_cast)
    assert finding["calls_per_step"] == 78
    assert finding["elements_per_call"] == 285_437_952  # 495,552 × 576
    assert finding["elements_source"] == "shapes"
    assert finding["shape"] == [495552, 1, 576]
    assert finding["src_dtype"] == "float8_e4m3fn"
    assert finding["dst_dtype"] == "bfloat16"
    assert 0.6 <= finding["share_of_step"] <= 0.75
    assert finding["severity"] == "high"
    assert finding["source"].endswith("forward_decode")
    assert finding["bytes_per_step"] == 78 * 285_437_952 * 3
    assert 60 <= finding["time_per_step_ms"] <= 70  # ~850 µs × 78
    assert 800 <= finding["bandwidth_gbps"] <= 1200
    assert "BatchMLAPagedAttentionWrapper" in finding["suggestion"]
    assert "kv_data_type=torch.float8_e4m3fn" in finding["suggestion"]


def test_full_cast_is_the_most_costly_finding(full_cast):
    assert full_cast["findings"][0]["kind"] == "pool_proportional_cast"
    shares = [f["share_of_step"] for f in full_cast["findings"]]
    assert shares == sorted(shares, reverse=True)


def test_full_cast_steps_and_layers(full_cast):
    steps = full_cast["steps"]
    assert steps["count"] == 3
    assert steps["method"] == "markers"
    assert 90 <= steps["mean_ms"] <= 110
    assert full_cast["layers"] == 78
    assert full_cast["layers_method"] == "launches-per-step"
    assert full_cast["trace"]["device"] == "NVIDIA H200"
    per_step = steps["per_step"]
    assert all(s["families"]["cast_copy"]["launches"] == 78 for s in per_step)
    families = {row["family"]: row for row in full_cast["families"]}
    assert families["cast_copy"]["launches_per_step"] == 78
    assert families["gemm"]["share_of_step"] > 0.1


def test_full_cast_without_markers_finds_the_same_steps(full_cast, tmp_path):
    """Stripping the ProfilerStep markers: the repeating structure gives the same answer."""
    import gzip
    import json

    with gzip.open(FULL_CAST, "rt") as f:
        trace = json.load(f)
    trace["traceEvents"] = [
        e for e in trace["traceEvents"] if not str(e.get("name", "")).startswith("ProfilerStep#")
    ]
    path = tmp_path / "no_markers.json"
    path.write_text(json.dumps(trace))
    report = diagnose(path)
    assert report["steps"]["method"] == "repeating-structure"
    assert report["steps"]["count"] == 3
    assert report["layers"] == 78
    (finding,) = _pool(report)
    assert finding["calls_per_step"] == 78
    assert 0.6 <= finding["share_of_step"] <= 0.75


def test_fp8_direct_has_no_cast(fp8_direct):
    assert not _pool(fp8_direct)
    assert not [f for f in fp8_direct["findings"] if f["kind"] in ("dtype_cast", "copy")]
    assert fp8_direct["steps"]["count"] == 3
    assert fp8_direct["layers"] == 78


def test_active_tokens_option_strengthens_the_evidence():
    report = diagnose(FULL_CAST, active_tokens=3000)
    (finding,) = _pool(report)
    assert finding["active_tokens"] == 3000
    assert finding["active_tokens_source"] == "--active-tokens"
    assert any("165×" in reason for reason in finding["evidence"])


def test_text_report_leads_with_the_cast(full_cast):
    text = format_text(full_cast)
    first = text.index("1. [HIGH]")
    assert "Whole-pool float8_e4m3fn→bfloat16 cast" in text[first : first + 120]
    assert "forward_decode" in text
    assert "285,437,952" in text


@pytest.mark.parametrize("path", EXTERNAL, ids=lambda p: p.name.split("__")[0])
def test_external_traces_do_not_crash(path):
    report = diagnose(path)
    steps = report["steps"]
    assert steps["count"] >= 1
    assert steps["mean_ms"] > 0
    for step in steps["per_step"]:
        assert step["launches"] > 0
        assert 0.0 <= step["idle_share"] <= 1.0
    assert not _pool(report)
    format_text(report)


def test_external_torch1_trace_has_its_six_marked_steps():
    report = diagnose(TRACES / "external" / "trace_diff__test__test.json.gz")
    assert report["steps"]["method"] == "markers"
    assert report["steps"]["count"] == 6
    assert report["trace"]["format"] == "torch 1.x"


def test_external_amd_trace_reads_hip_kernels():
    report = diagnose(TRACES / "external" / "amd_trace__mi250_minitoy_train_ROCm6_2_kineto.json.gz")
    assert report["trace"]["mode"] == "gpu"
    assert report["trace"]["kernels"] > 0


def test_directory_gives_one_report_per_rank_and_a_summary(tmp_path):
    import shutil

    shutil.copy(FULL_CAST, tmp_path / "rank0.json.gz")
    shutil.copy(FP8_DIRECT, tmp_path / "rank1.json.gz")
    (tmp_path / "rank2.json").write_text("not json")
    (tmp_path / "notes.txt").write_text("ignored")
    report = diagnose(tmp_path)
    assert [Path(r["path"]).name for r in report["ranks"]] == [
        "rank0.json.gz",
        "rank1.json.gz",
        "rank2.json",
    ]
    assert "error" in report["ranks"][2]
    summary = report["summary"]
    assert summary["ranks"] == 3 and summary["analysed"] == 2
    assert summary["failed"][0]["path"].endswith("rank2.json")
    kinds = {k["kind"]: k for k in summary["findings"]}
    assert kinds["pool_proportional_cast"]["ranks"] == 1
    assert "Summary: 2 of 3 traces analysed" in format_text(report)
