"""Synthetic traces covering what real traces differ in (see fp8mla.doctor.synth)."""

from __future__ import annotations

import pytest

from fp8mla.doctor import diagnose
from fp8mla.doctor.synth import SynthSpec, write_trace

POOL = 400_000 * 576


def _trace(tmp_path, name: str = "t.json.gz", **spec) -> str:
    return write_trace(str(tmp_path / name), SynthSpec(**spec))


def _pool(report: dict) -> dict | None:
    found = [f for f in report["findings"] if f["kind"] == "pool_proportional_cast"]
    assert len(found) <= 1
    return found[0] if found else None


@pytest.mark.parametrize(
    ("variant", "spec", "method", "source"),
    [
        ("baseline", {}, "markers", "shapes"),
        ("no markers", {"markers": False}, "repeating-structure", "shapes"),
        ("no shapes", {"shapes": False}, "markers", "grid"),
        ("no stacks", {"stacks": False}, "markers", "shapes"),
        ("ns timestamps", {"nanoseconds": True}, "markers", "shapes"),
        ("torch 1.x", {"legacy": True}, "markers", "shapes"),
        ("cuda graph", {"cuda_graph": True, "shapes": False}, "markers", "grid"),
        (
            "no markers, no shapes",
            {"markers": False, "shapes": False},
            "repeating-structure",
            "grid",
        ),
    ],
)
def test_pool_cast_found_in_every_variant(tmp_path, variant, spec, method, source):
    report = diagnose(_trace(tmp_path, layers=6, steps=4, **spec))
    assert report["steps"]["method"] == method, variant
    assert report["steps"]["count"] == 4
    assert report["layers"] == 6
    finding = _pool(report)
    assert finding is not None, variant
    assert finding["calls_per_step"] == 6
    assert finding["elements_per_call"] == POOL
    assert finding["elements_source"] == source
    assert finding["dst_dtype"] == "bfloat16"
    assert report["findings"][0] is finding


def test_stacks_name_the_backend_function(tmp_path):
    finding = _pool(diagnose(_trace(tmp_path)))
    assert finding["source"] == (
        "sglang/srt/layers/attention/flashinfer_mla_backend.py(412): forward_decode"
    )
    assert finding["src_dtype"] == "float8_e4m3fn"


def test_torch1_call_stack_names_the_backend_function(tmp_path):
    report = diagnose(_trace(tmp_path, legacy=True))
    assert report["trace"]["format"] == "torch 1.x"
    assert _pool(report)["source"].endswith("forward_decode")


def test_no_stacks_leaves_the_source_unknown(tmp_path):
    report = diagnose(_trace(tmp_path, stacks=False))
    assert _pool(report)["source"] is None
    assert any("with_stack" in w for w in report["warnings"])


def test_ns_timestamps_are_converted(tmp_path):
    us = diagnose(_trace(tmp_path, "us.json.gz"))
    ns = diagnose(_trace(tmp_path, "ns.json.gz", nanoseconds=True))
    assert ns["trace"]["time_unit"] == "ns"
    assert us["trace"]["time_unit"] == "us"
    assert ns["steps"]["mean_ms"] == pytest.approx(us["steps"]["mean_ms"], rel=1e-3)
    assert _pool(ns)["time_per_step_ms"] == pytest.approx(_pool(us)["time_per_step_ms"], rel=1e-3)


def test_cuda_graph_replays(tmp_path):
    """Kernels share their cudaGraphLaunch's correlation and carry no op or shapes."""
    report = diagnose(_trace(tmp_path, cuda_graph=True, markers=False, shapes=False, layers=8))
    assert report["trace"]["cuda_graph_kernels"] > 0
    assert report["steps"]["count"] == 3
    assert report["layers"] == 8
    finding = _pool(report)
    assert finding["cuda_graph"] is True
    assert finding["elements_source"] == "grid"
    assert finding["elements_per_call"] == POOL
    assert finding["calls_per_step"] == 8
    assert finding["source"].endswith("replay")
    assert any("attention kernels" in r for r in finding["evidence"])


def test_gathered_cast_is_not_pool_proportional(tmp_path):
    report = diagnose(_trace(tmp_path, cast="gathered"))
    assert _pool(report) is None
    reasons = [r for f in report["findings"] for r in f["evidence"]]
    assert not any("KV slots per call" in r for r in reasons)


def test_gathered_cast_without_shapes_is_not_pool_proportional(tmp_path):
    assert _pool(diagnose(_trace(tmp_path, cast="gathered", shapes=False))) is None


def test_no_cast_no_finding(tmp_path):
    report = diagnose(_trace(tmp_path, cast="none"))
    assert _pool(report) is None
    assert not [f for f in report["findings"] if f["kind"] in ("dtype_cast", "copy")]


def test_active_tokens_from_shapes(tmp_path):
    finding = _pool(diagnose(_trace(tmp_path)))
    assert finding["active_tokens_source"] == "recorded shapes"
    assert finding["pool_slots"] == 400_000
    assert 3000 <= finding["active_tokens"] <= 3002


def test_active_tokens_option_can_clear_a_cast(tmp_path):
    """A cast about the size of the active tokens is a gathered cast, not a pool cast."""
    path = _trace(tmp_path, pool_slots=3000 * 2)
    assert _pool(diagnose(path, active_tokens=3000)) is None


def test_layers_option_overrides(tmp_path):
    path = _trace(tmp_path, layers=6)
    report = diagnose(path, layers=6)
    assert report["layers"] == 6 and report["layers_method"] == "option"
    assert _pool(report)["evidence"][0].startswith("runs 6 times per step: once per layer")
    assert _pool(diagnose(path, layers=3))["evidence"][0].startswith(
        "runs 6 times per step: twice per layer"
    )
    assert _pool(diagnose(path, layers=12)) is None  # once every other layer: not this pattern


def test_cpu_only_synthetic(tmp_path):
    report = diagnose(_trace(tmp_path, cpu_only=True, layers=4))
    assert report["trace"]["mode"] == "cpu"
    finding = _pool(report)
    assert finding["kernel"] == "aten::to"
    assert finding["calls_per_step"] == 4
    assert finding["elements_per_call"] == POOL
    assert finding["src_dtype"] == "float8_e4m3fn" and finding["dst_dtype"] == "bfloat16"
    assert finding["source"] == "backend.py(7): forward_decode"


def test_launch_bound_steps_suggest_cuda_graphs(tmp_path):
    report = diagnose(_trace(tmp_path, cast="none", layers=2))
    (finding,) = [f for f in report["findings"] if f["kind"] == "launch_bound"]
    assert "CUDA graph" in finding["suggestion"]
    assert finding["share_of_step"] == pytest.approx(report["steps"]["idle_share"], abs=1e-3)


def test_plain_json_and_bare_array(tmp_path):
    import json

    path = _trace(tmp_path, "plain.json")
    with open(path) as f:
        events = json.load(f)["traceEvents"]
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps(events))
    report = diagnose(bare)
    assert _pool(report)["calls_per_step"] == 4


def test_cpu_copy_inside_another_op_is_not_a_cast(tmp_path):
    """A dtype promotion inside aten::mul (a nested copy_) is the mul's work, not a cast."""
    import json

    def op(name, ts, dur, dims, types):
        args = {"Input Dims": dims, "Input type": types}
        return {
            "ph": "X",
            "cat": "cpu_op",
            "name": name,
            "pid": 1,
            "tid": 1,
            "ts": ts,
            "dur": dur,
            "args": args,
        }

    events = []
    for step in range(3):
        t0 = step * 1000.0
        events.append(
            {
                "ph": "X",
                "cat": "user_annotation",
                "name": f"ProfilerStep#{step}",
                "pid": 1,
                "tid": 1,
                "ts": t0,
                "dur": 900.0,
                "args": {},
            }
        )
        for layer in range(4):
            t = t0 + 10 + layer * 200
            events.append(
                op("aten::mul", t, 150, [[4096, 4096], [4096, 4096]], ["double", "float"])
            )
            events.append(
                op(
                    "aten::copy_",
                    t + 5,
                    100,
                    [[4096, 4096], [4096, 4096], []],
                    ["double", "float", "Scalar"],
                )
            )
            events.append(op("aten::matmul", t + 160, 30, [[1, 64], [64, 64]], ["float"] * 2))
            events.append(op("aten::layer_norm", t + 192, 5, [[1, 64], [64]], ["float"] * 2))
    path = tmp_path / "cpu.json"
    path.write_text(json.dumps({"traceEvents": events}))
    report = diagnose(path)
    assert report["steps"]["count"] == 3 and report["layers"] == 4
    assert not [f for f in report["findings"] if f["kind"] != "launch_bound"]
    assert {r["family"] for r in report["families"]} == {"elementwise", "gemm", "norm"}
