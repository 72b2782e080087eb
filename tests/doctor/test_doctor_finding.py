"""The typed finding: its JSON form is the documented schema, its kinds live in one place."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fp8mla.doctor import analyze
from fp8mla.doctor.finding import KINDS, LAUNCH_BOUND, Finding, severity

DOCS = Path(__file__).resolve().parents[2] / "docs" / "doctor.md"


def _documented_finding_keys() -> list[str]:
    text = DOCS.read_text(encoding="utf-8")
    block = text[text.index('"findings": [{') : text.index('"warnings": [str]')]
    return list(dict.fromkeys(re.findall(r'"(\w+)":', block)))[1:]  # drop "findings"


def test_to_dict_keys_are_the_documented_schema_in_order():
    keys = list(Finding(kind=LAUNCH_BOUND, title="t", share_of_step=0.5).to_dict())
    extras = ("source_file", "source_lines", "path", "line", "code")  # --source-root only
    documented = [k for k in _documented_finding_keys() if k not in extras]
    assert keys == documented


def test_documented_kinds_are_the_kinds():
    text = DOCS.read_text(encoding="utf-8")
    line = next(line for line in text.splitlines() if '"kind": "pool_proportional_cast"' in line)
    assert tuple(re.findall(r'"(\w+)"', line.split(":", 1)[1])) == KINDS


@pytest.mark.parametrize(("share", "expected"), [(0.2, "high"), (0.05, "medium"), (0.049, "low")])
def test_severity_follows_the_share(share, expected):
    assert severity(share) == expected
    assert Finding(kind=LAUNCH_BOUND, title="t", share_of_step=share).severity == expected


def test_share_is_rounded_and_lists_are_copied():
    evidence = ["a"]
    f = Finding(kind=LAUNCH_BOUND, title="t", share_of_step=0.123456, evidence=evidence)
    d = f.to_dict()
    assert d["share_of_step"] == 0.1235
    d["evidence"].append("b")
    assert f.evidence == ["a"]


def test_unknown_kind_is_refused():
    with pytest.raises(ValueError, match="expected a finding kind"):
        Finding(kind="pool_cast", title="t", share_of_step=0.1)


def test_the_report_lists_what_the_detectors_found(tmp_path):
    from fp8mla.doctor.collect import collect
    from fp8mla.doctor.synth import SynthSpec, write_trace

    data = collect(write_trace(str(tmp_path / "t.json"), SynthSpec(layers=4)))
    ctx = analyze._context(data, None, None, None)
    found = [f for detect in analyze.DETECTORS for f in detect(ctx)]
    assert found and all(isinstance(f, Finding) and f.kind in KINDS for f in found)
    report = analyze.analyze_trace(data)
    expected = sorted((f.to_dict() for f in found), key=lambda d: -d["share_of_step"])
    assert report["findings"] == expected
