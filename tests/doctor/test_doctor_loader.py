"""The streaming loader: bad input, damaged files, chunk boundaries, fuzzing."""

from __future__ import annotations

import gzip
import json
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fp8mla.doctor import DamagedTrace, TraceError, diagnose
from fp8mla.doctor import load as load_module
from fp8mla.doctor.load import TraceReader
from fp8mla.doctor.synth import SynthSpec, write_trace


def _events(path) -> list[dict]:
    return list(TraceReader(path))


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory) -> str:
    return write_trace(str(tmp_path_factory.mktemp("t") / "t.json"), SynthSpec(steps=2, layers=3))


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "empty file"),
        (b"   \n\t ", "empty file"),
        (b"garbage", "not a Chrome trace"),
        (b"\x00\x01\xfe\xff binary", "not a Chrome trace"),
        (b"42", "not a Chrome trace"),
        (b'{"a": 1, "b": [1, 2]}', "no 'traceEvents'"),
        (b'{"traceEvents": []}', "no events"),
        (b'{"traceEvents": [1, "x", null]}', "no events"),
        (b'[{"target": "sm90", "ok": true}, {"target": "sm80"}]', "none of its 2 .* trace event"),
        (b'{"traceEvents": [{"name": "k", "ts": 1, "dur": 2}]}', "not a Chrome trace"),
        (b'{"traceEvents": [{"ph": "X"', "damaged trace: .*no complete events"),
        (b'{"traceEvents": [{"ph": "X" "cat": 1}]}', "not valid JSON"),
        (b"\x1f\x8b\x08\x00garbage-after-gzip-magic", "gzip"),
        (b'{"traceEvents": [@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@]}', "not valid JSON"),
    ],
)
def test_bad_input_is_a_trace_error(tmp_path, content, message):
    path = tmp_path / "bad.json"
    path.write_bytes(content)
    with pytest.raises(TraceError, match=message) as info:
        diagnose(path)
    assert "\n" not in str(info.value)
    assert isinstance(info.value, ValueError)


def test_missing_and_directory(tmp_path):
    with pytest.raises(TraceError, match="no such file"):
        diagnose(tmp_path / "nope.json.gz")
    with pytest.raises(TraceError, match="no trace files"):
        diagnose(tmp_path)
    with pytest.raises(TraceError, match="is a directory"):
        TraceReader(tmp_path)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads unreadable files")
def test_unreadable(tmp_path):
    path = tmp_path / "locked.json"
    path.write_text('{"traceEvents": []}')
    path.chmod(0)
    with pytest.raises(TraceError, match="cannot read"):
        diagnose(path)


def test_bad_options_are_trace_errors(synthetic):
    with pytest.raises(TraceError, match="layers"):
        diagnose(synthetic, layers=0)
    with pytest.raises(TraceError, match="active_tokens"):
        diagnose(synthetic, active_tokens=-3)


def test_truncated_gzip_is_salvaged(tmp_path, synthetic):
    gz = gzip.compress(open(synthetic, "rb").read())
    path = tmp_path / "cut.json.gz"
    path.write_bytes(gz[: int(len(gz) * 0.7)])
    reader = TraceReader(path)
    events = list(reader)
    assert reader.truncated
    full = _events(synthetic)
    assert 0 < len(events) < len(full)
    assert events == full[: len(events)]
    with pytest.raises(
        DamagedTrace, match=f"the gzip stream ends early at byte {len(gz) * 7 // 10:,}"
    ):
        diagnose(path)
    report = diagnose(path, allow_partial=True)
    assert report["trace"]["truncated"]
    assert report["partial"] == {"damage": reader.damage, "events_read": len(events)}
    assert report["steps"]["partial"] and all(f["partial"] for f in report["findings"])


def test_truncated_plain_json_is_salvaged(tmp_path, synthetic):
    text = open(synthetic).read()
    path = tmp_path / "cut.json"
    path.write_text(text[: len(text) // 2])
    reader = TraceReader(path)
    events = list(reader)
    assert reader.truncated and events == _events(synthetic)[: len(events)]


def test_corrupt_gzip_middle_is_salvaged(tmp_path, synthetic):
    gz = bytearray(gzip.compress(open(synthetic, "rb").read(), compresslevel=1))
    middle = len(gz) // 2
    gz[middle : middle + 64] = os.urandom(64)
    path = tmp_path / "corrupt.json.gz"
    path.write_bytes(bytes(gz))
    try:
        reader = TraceReader(path)
        events = list(reader)
    except TraceError:
        return  # damage before the first complete event is an error too
    assert reader.truncated or len(events) == len(_events(synthetic))


def test_metadata_after_events_bom_and_concatenated_gzip(tmp_path):
    doc = (
        '\ufeff{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": 1, "dur": 2}],'
        ' "deviceProperties": [{"name": "NVIDIA H100 80GB HBM3"}], "x": {"nested": [1]}}'
    )
    raw = doc.encode()
    path = tmp_path / "two_members.json.gz"
    path.write_bytes(gzip.compress(raw[:40]) + gzip.compress(raw[40:]))
    reader = TraceReader(path)
    assert len(list(reader)) == 1
    assert reader.metadata["deviceProperties"][0]["name"] == "NVIDIA H100 80GB HBM3"
    assert not reader.truncated
    assert diagnose(path)["trace"]["device"] == "NVIDIA H100 80GB HBM3"


@pytest.mark.parametrize("chunk", [1, 2, 3, 7, 64, 4096])
def test_chunk_boundaries_do_not_matter(monkeypatch, synthetic, chunk):
    expected = json.load(open(synthetic))["traceEvents"]
    monkeypatch.setattr(load_module, "_READ_BYTES", chunk)
    assert _events(synthetic) == expected


def test_gzip_chunk_boundaries(monkeypatch, tmp_path, synthetic):
    path = tmp_path / "t.json.gz"
    path.write_bytes(gzip.compress(open(synthetic, "rb").read()))
    monkeypatch.setattr(load_module, "_READ_BYTES", 5)
    assert _events(path) == _events(synthetic)


def test_progress_callback_reaches_the_end(synthetic):
    seen = []
    list(TraceReader(synthetic, progress=lambda done, total: seen.append((done, total))))
    assert seen and seen[-1][0] == seen[-1][1] == os.path.getsize(synthetic)


# -- property-based fuzzing ---------------------------------------------------------------

_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**40), 2**40),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=12),
)
_json = st.recursive(
    _scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
_event = st.fixed_dictionaries(
    {
        "ph": st.sampled_from(["X", "M", "i", "s", "f", 1]),
        "cat": st.sampled_from(
            [
                "kernel",
                "cpu_op",
                "cuda_runtime",
                "python_function",
                "user_annotation",
                "gpu_memcpy",
                "Kernel",
                "Operator",
                None,
                3,
            ]
        ),
        "name": st.one_of(
            st.sampled_from(
                [
                    "ProfilerStep#1",
                    "aten::copy_",
                    "aten::to",
                    "cudaLaunchKernel",
                    "cudaGraphLaunch",
                    "k",
                ]
            ),
            _scalars,
        ),
        "ts": st.one_of(st.floats(0, 1e7), st.integers(0, 10**7), _scalars),
        "dur": st.one_of(st.floats(0, 1e4), _scalars),
        "pid": _scalars,
        "tid": _scalars,
    },
    optional={
        "args": st.one_of(
            _json,
            st.fixed_dictionaries(
                {},
                optional={
                    "correlation": _scalars,
                    "External id": _scalars,
                    "grid": _json,
                    "block": _json,
                    "Input Dims": _json,
                    "Input type": _json,
                    "Concrete Inputs": _json,
                    "Python id": _scalars,
                    "Python parent id": _scalars,
                },
            ),
        )
    },
)
_fuzz = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@_fuzz
@given(
    elements=st.lists(st.one_of(_event, _json), max_size=12),
    indent=st.sampled_from([None, 0, 2]),
    chunk=st.integers(1, 40),
    gz=st.booleans(),
)
def test_fuzz_loader_round_trip(tmp_path, monkeypatch, elements, indent, chunk, gz):
    doc = {"schemaVersion": 1, "traceEvents": elements, "tail": elements[:1]}
    raw = json.dumps(doc, indent=indent).encode()
    path = tmp_path / ("f.json.gz" if gz else "f.json")
    path.write_bytes(gzip.compress(raw) if gz else raw)
    monkeypatch.setattr(load_module, "_READ_BYTES", chunk)
    reader = TraceReader(path)
    assert list(reader) == [e for e in elements if isinstance(e, dict)]
    assert not reader.truncated
    try:
        report = diagnose(path)
    except TraceError:
        return
    assert report["schema_version"] == 1


@_fuzz
@given(elements=st.lists(_event, min_size=1, max_size=10), cut=st.floats(0, 1), gz=st.booleans())
def test_fuzz_truncation_yields_a_prefix(tmp_path, elements, cut, gz):
    raw = json.dumps({"traceEvents": elements}).encode()
    data = gzip.compress(raw) if gz else raw
    path = tmp_path / "cut.json"
    path.write_bytes(data[: int(len(data) * cut)])
    try:
        events = list(TraceReader(path))
    except TraceError:
        return
    assert events == elements[: len(events)]


@_fuzz
@given(data=st.binary(max_size=300))
def test_fuzz_arbitrary_bytes(tmp_path, data):
    path = tmp_path / "junk.json"
    path.write_bytes(data)
    try:
        diagnose(path)
    except TraceError:
        pass
