"""The HTML report: self-contained, and rendered by a real headless browser when one exists."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from fp8mla.doctor import diagnose, render_html
from fp8mla.doctor.synth import SynthSpec, write_trace


@pytest.fixture(scope="module")
def page(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("html")
    report = diagnose(write_trace(str(root / "t.json.gz"), SynthSpec(layers=6, steps=5)))
    return render_html(report, floor_text="floor per output token   1.0 ms <b>")


def test_page_is_self_contained(page):
    assert page.startswith("<!DOCTYPE html>")
    assert "<script" not in page and "<link" not in page and "@import" not in page
    assert page.count("<rect") >= 5 * 3  # a stacked bar per step
    assert "ProfilerStep#2" in page
    assert "HIGH" in page and "Fix:" in page
    assert "&lt;b&gt;" in page  # everything from the trace or options is escaped


def test_directory_page(tmp_path):
    for rank in range(2):
        write_trace(str(tmp_path / f"r{rank}.json"), SynthSpec(steps=2))
    (tmp_path / "r9.json").write_text("{")
    html = render_html(diagnose(tmp_path))
    assert html.count("<svg") == 4 and "r9.json" in html  # per rank: timeline, step bars


@pytest.mark.skipif(
    not (shutil.which("chromium") or shutil.which("chromium-browser")),
    reason="no headless chromium installed",
)
def test_headless_browser_renders_it(page, tmp_path):
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    path = tmp_path / "report.html"
    path.write_text(page)
    shot = tmp_path / "shot.png"
    subprocess.run(
        [
            browser,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            f"--screenshot={shot}",
            "--window-size=1200,1400",
            path.as_uri(),
        ],
        capture_output=True,
        timeout=120,
        check=False,
    )
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(data) > 20_000  # a blank page compresses to a few kB
    dom = subprocess.run(
        [browser, "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom", path.as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "Whole-pool float8_e4m3fn→bfloat16 cast every layer" in dom.stdout


def test_page_shows_where_in_the_step_the_time_goes(page):
    start = page.index("<h2>Where in the step the time goes</h2>")
    svg = page[start : page.index("</svg>", start)]
    assert 'width="100%"' in svg and "viewBox=" in svg  # uses the page's width
    assert svg.count(">L") == 6  # a mark where each of the 6 layers starts
    assert "cast/copy" in svg and "attention" in svg  # lanes per kernel family
    assert "max-width:1100px" not in page


def test_each_finding_gives_the_step_time_after_the_fix(tmp_path):
    report = diagnose(write_trace(str(tmp_path / "t.json.gz"), SynthSpec(layers=6, steps=3)))
    page = render_html(report)
    (cast,) = [f for f in report["findings"] if f["kind"] == "pool_proportional_cast"]
    after = report["steps"]["mean_ms"] - cast["time_per_step_ms"]
    assert f"≈{after:.2f} ms instead of {report['steps']['mean_ms']:.2f} ms" in page


def test_unknown_source_dtype_is_explained(tmp_path):
    spec = SynthSpec(layers=6, cuda_graph=True, shapes=False, stacks=False, markers=False)
    page = render_html(diagnose(write_trace(str(tmp_path / "g.json.gz"), spec)))
    assert "? → bfloat16 (source dtype unknown: the trace has no shapes" in page
