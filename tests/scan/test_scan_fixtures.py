"""The scanner against fixture backends whose expected findings are marked in the source."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fp8mla.scan import (
    GATHERED_CAST,
    PLAN_KV_DTYPE_HINT,
    WHOLE_POOL_CAST,
    ScanFinding,
    scan_file,
)

FIXTURES = Path(__file__).parent / "fixtures"
_EXPECT = re.compile(r"# expect: ([a-z_]+(?:, [a-z_]+)*)$")


def expected(path: Path) -> list[tuple[int, str]]:
    """``(line, kind)`` for every ``# expect: KIND[, KIND]`` marker in ``path``."""
    out = []
    for lineno, line in enumerate(path.read_text().splitlines(), start=1):
        match = _EXPECT.search(line)
        if match:
            out.extend((lineno, kind) for kind in match.group(1).split(", "))
    return sorted(out)


@pytest.mark.parametrize(
    "name", ["seed_mla_backend.py", "engine_patterns.py", "engine_lookalikes.py"]
)
def test_reports_exactly_the_marked_lines(name: str) -> None:
    path = FIXTURES / name
    findings = scan_file(path)
    assert sorted((f.line, f.kind) for f in findings) == expected(path)


def by_line(findings: list[ScanFinding]) -> dict[int, ScanFinding]:
    return {f.line: f for f in findings}


def test_seed_backend_decode_and_prefill_paths() -> None:
    path = FIXTURES / "seed_mla_backend.py"
    findings = scan_file(path)
    whole = [f for f in findings if f.kind == WHOLE_POOL_CAST]
    assert {f.function for f in whole} == {
        "FlashInferMLAAttnBackend.forward_decode",
        "FlashInferMLAAttnBackend.forward_extend",
    }
    decode = [f for f in whole if f.function.endswith(".forward_decode")]
    assert len(decode) == 2
    assert decode[0].code.startswith("k_buffer[:, :, :512].to(q.dtype),")
    assert decode[1].code.startswith("k_buffer[:, :, 512:].to(q.dtype),")
    for f in decode:
        assert f.severity == "high"
        assert f.path == str(path)
        assert "get_key_buffer(layer.layer_id)" in f.reason  # where the alias came from
        assert "basic slice" in f.reason
        assert "fp8mla.BatchMLAPagedAttentionWrapper" in f.suggestion
        assert "kv_data_type" in f.suggestion
    (hint,) = [f for f in findings if f.kind == PLAN_KV_DTYPE_HINT]
    assert hint.function == "FlashInferMLAIndicesUpdaterDecode.call_begin_forward"
    assert hint.code.startswith("wrapper.plan(")
    assert "self.data_type" in hint.reason
    assert hint.severity == "medium"


def test_functions_name_methods_nested_functions_class_bodies_and_module() -> None:
    findings = by_line(scan_file(FIXTURES / "engine_patterns.py"))
    functions = {f.function for f in findings.values()}
    assert {
        "<module>",
        "MLAKVPool",
        "MLAKVPool.as_model_dtype",
        "AttentionImpl.stream.upcast",
        "plan_both",
    } <= functions
    # The doctor matches a profiler frame's function name against the last dotted part.
    assert any(f.function.split(".")[-1] == "upcast" for f in findings.values())


def test_gathered_casts_are_low_severity_and_say_how_rows_were_gathered() -> None:
    findings = scan_file(FIXTURES / "engine_patterns.py")
    gathered = [f for f in findings if f.kind == GATHERED_CAST]
    assert gathered and all(f.severity == "low" for f in gathered)
    reasons = " ".join(f.reason for f in gathered)
    for how in ("[indices]", ".index_select(...)", "torch.take(...)", "torch.gather(...)"):
        assert how in reasons
    assert all("gather-then-cast" in f.suggestion for f in gathered)


def test_findings_are_frozen_and_serialize_to_the_json_schema() -> None:
    finding = scan_file(FIXTURES / "seed_mla_backend.py")[0]
    with pytest.raises(AttributeError):
        finding.line = 1  # type: ignore[misc]
    data = finding.to_dict()
    assert set(data) >= {"path", "line", "function", "code", "kind", "severity", "suggestion"}
    assert isinstance(data["line"], int) and data["kind"] == WHOLE_POOL_CAST
