"""On real traces of every kind, the report says what the trace is and never contradicts its
own numbers: no fractional call counts, no layers or decode steps invented for traces that are
not a decode loop, no "busy" device that the same report shows idle."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fp8mla.doctor import diagnose, format_text, render_html

TRACES = Path(__file__).resolve().parents[1] / "data" / "traces"
DECODE = sorted(TRACES.glob("*.json.gz"))  # GLM-5 shaped decode loops on an H200
EXTERNAL = sorted((TRACES / "external").glob("*.json.gz"))  # training, benchmarks, other devices
COUNT_UNITS = r"(?:per step|in the window|launch(?:es)?|transfers|calls|times|top-level ops?)"


@pytest.fixture(scope="module", params=DECODE + EXTERNAL, ids=lambda p: p.name.split("__")[0])
def report(request) -> dict:
    return diagnose(request.param)


def test_no_fractional_counts(report):
    text = format_text(report)
    assert not re.findall(rf"\d\.\d+ {COUNT_UNITS}\b", text)
    assert not re.findall(r" \d+\.\d+×  ", text)  # the top-kernels table's call column
    html = render_html(report)
    assert not re.findall(rf"\d\.\d+ {COUNT_UNITS}\b", html)


def test_layers_only_where_the_step_has_layers(report):
    if Path(report["path"]).parent == TRACES:
        assert report["layers"] == 78
    else:
        assert report["layers"] is None, report["layers_detail"]
        assert "no layer structure found" in " ".join(format_text(report).split())


def test_no_decode_step_is_claimed(report):
    text = format_text(report).lower()
    assert "decode step" not in text


def test_statements_match_the_numbers(report):
    text = format_text(report)
    flat = " ".join(text.split())
    idle = report["steps"]["idle_share"]
    for busy in re.findall(r"GPU is busy (\d+)% of the step", flat):
        assert int(busy) == round((1 - idle) * 100)
    for said in re.findall(r"GPU is idle (\d+)% of (?:each step|the step|the window)", flat):
        assert int(said) == round(idle * 100)
    if report["trace"]["mode"] == "gpu" and not report["findings"] and idle >= 0.3:
        assert "the GPU is busy" not in flat and "device is busy" not in flat
    count = report["steps"]["count"]
    if report["steps"]["method"] == "whole-trace":
        assert "one window of" in flat and "no repeating step found" in flat
    else:
        assert re.search(rf"\b{count} steps? of ", flat), flat[:300]
    markers = re.search(r"(\d+) ProfilerStep markers?(?:, (\d+) with work)?", flat)
    if report["steps"]["method"] == "markers" and markers:
        assert int(markers.group(2) or markers.group(1)) == count


def test_cpu_only_traces_say_why(report):
    if report["trace"]["mode"] != "cpu":
        return
    reason = next(w for w in report["warnings"] if "analysing CPU ops instead" in w)
    name = Path(report["path"]).name
    if name.startswith("mtia"):
        assert "another accelerator's" in reason and "mtia_ccp_events" in reason
    elif name.startswith("cupti"):
        assert "CUPTI profiler ranges" in reason
    else:
        assert reason.startswith("no GPU kernels")


def test_directory_summary_counts_ranks_not_findings(tmp_path):
    import shutil

    source = TRACES / "external" / "trace_diff__test__test.json.gz"
    for rank in range(2):
        shutil.copy(source, tmp_path / f"rank{rank}.json.gz")
    report = diagnose(tmp_path)
    memcpy = [f for f in report["ranks"][0]["findings"] if f["kind"] == "memcpy"]
    assert len(memcpy) == 2  # two transfer kinds in each rank
    (summary,) = [k for k in report["summary"]["findings"] if k["kind"] == "memcpy"]
    assert summary["ranks"] == 2


@pytest.mark.parametrize(
    ("name", "title", "fix"),
    [
        # an eager decode loop: ~60 µs of Python per launch, which a CUDA graph removes
        ("glm5_tp2_fp8_direct.json.gz", "Launch-bound steps", "capture the step in a CUDA graph"),
        # a training toy: 16 launches in 9 ms, the GPU waits ~570 µs per launch on other work
        (
            "external/amd_trace__mi250_minitoy_train_ROCm6_2_kineto.json.gz",
            "GPU idle 98% of each step, waiting on host work between kernels",
            "Profile the host side of the step",
        ),
    ],
)
def test_idle_time_is_told_apart_by_what_the_host_does(name, title, fix):
    (idle,) = [f for f in diagnose(TRACES / name)["findings"] if f["kind"] == "launch_bound"]
    assert idle["title"].startswith(title) and fix in idle["suggestion"]
