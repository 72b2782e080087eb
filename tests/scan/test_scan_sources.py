"""Focused sources: negatives, unparsable input, syntax of every supported Python version."""

from __future__ import annotations

import textwrap

import pytest

from fp8mla.scan import UnparsableSource, scan_file, scan_paths, scan_source


def kinds(source: str) -> list[tuple[int, str]]:
    return [(f.line, f.kind) for f in scan_source(textwrap.dedent(source))]


@pytest.mark.parametrize(
    "source",
    [
        "# k_buffer.to(q.dtype) copies the pool\n",
        "msg = 'kv_cache.float() is slow'\n",
        'def f():\n    """Never call pool.get_key_buffer(0).to(q.dtype)."""\n',
        "out = hidden_states.to(torch.bfloat16)\n",
        "o = attn_output.float()\n",
        "q = q.to(q_dtype)\n",
        "x = kv_cache.view(torch.uint8)\n",
        "y = kv_cache.to('cuda')\n",
        "y = kv_cache.to(device=dev, non_blocking=True)\n",
        "n = kv_cache.float\n",
        "t = kv_cache.type()\n",
        "z = float(kv_cache_size)\n",
        "a = torch.as_tensor(kv_cache)\n",
        "b = torch.as_tensor(kv_cache, dtype=None)\n",
        "w = self.req_to_token_pool.req_to_token.to(torch.int32)\n",
        "s = forward_batch.seq_lens.to(torch.int32)\n",
        "wrapper.plan(a, b, q_dtype, kv_dtype)\n",
        "runner.plan(steps, 3)\n",
    ],
)
def test_look_alikes_are_not_reported(source: str) -> None:
    assert kinds(source) == []


@pytest.mark.parametrize(
    ("source", "kind"),
    [
        ("k = kv_cache.to(q.dtype)", "whole_pool_cast"),
        ("k = kv_cache.to(dtype=torch.bfloat16)", "whole_pool_cast"),
        ("k = kv_cache.to(q.device, q.dtype)", "whole_pool_cast"),
        ("k = kv_cache.to(q.device, dtype=q.dtype)", "whole_pool_cast"),
        ("k = kv_cache.float()", "whole_pool_cast"),
        ("k = kv_cache.half()", "whole_pool_cast"),
        ("k = kv_cache.bfloat16()", "whole_pool_cast"),
        ("k = kv_cache.double()", "whole_pool_cast"),
        ("k = kv_cache.type(torch.float16)", "whole_pool_cast"),
        ("k = torch.as_tensor(kv_cache, dtype=q.dtype)", "whole_pool_cast"),
        ("k = torch.asarray(kv_cache, torch.float16)", "whole_pool_cast"),
        ("k = pool.get_key_buffer(i).to(q.dtype)", "whole_pool_cast"),
        ("k = pool.get_value_buffer(i).to(q.dtype)", "whole_pool_cast"),
        ("k = self.token_to_kv_pool.k_buffer[layer_id].float()", "whole_pool_cast"),
        ("k = kv_cache.transpose(0, 1).reshape(-1, 576).half()", "whole_pool_cast"),
        ("k = kv_cache[loc].to(q.dtype)", "gathered_cast"),
        ("k = kv_cache[loc][:, :512].to(q.dtype)", "gathered_cast"),
        ("k = kv_cache.index_select(0, loc).float()", "gathered_cast"),
        ("k = kv_cache.gather(0, idx).float()", "gathered_cast"),
        ("k = kv_cache.view(-1, 576)[kv_indices].float()", "gathered_cast"),
    ],
)
def test_each_cast_form(source: str, kind: str) -> None:
    assert kinds(source + "\n") == [(1, kind)]


def test_aliases_are_scoped_to_their_function() -> None:
    source = """\
        def fetch(pool):
            k = pool.get_key_buffer(0)
            return k

        def elsewhere(k, q):
            return k.to(q.dtype)

        def reassigned(pool, q):
            k = pool.get_key_buffer(0)
            k = q * 2
            return k.to(q.dtype)
    """
    assert kinds(source) == []


def test_reported_line_is_the_cast_in_a_multiline_statement() -> None:
    source = """\
        out = run(
            q,
            forward_batch.token_to_kv_pool.get_key_buffer(
                layer.layer_id
            ).to(q.dtype),
        )
    """
    (finding,) = scan_source(textwrap.dedent(source))
    assert finding.line == 5 and finding.code == ").to(q.dtype),"


def test_syntax_of_python_3_8_and_later_parses() -> None:
    source = """\
        def f(a, /, b, *, c=1):
            if (n := len(a)) > 1:
                print(f"{n=}")
            match b:
                case {"k": kv_cache}:
                    return kv_cache.float()
            return [x async for x in c] if False else None

        async def g(pool):
            async with pool as p:
                return (await p.get_kv_buffer(0))
    """
    assert kinds(source) == [(6, "whole_pool_cast")]


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b"def broken(:\n    pass\n", "syntax error, line 1"),
        (b"print 'python 2'\n", "syntax error"),
        (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", "binary"),
        (b"# -*- coding: utf-8 -*-\nx = '\xff\xfe'\n", "cannot decode"),
        (b"# -*- coding: no-such-codec -*-\nx = 1\n", "cannot decode"),
    ],
)
def test_unparsable_sources(data: bytes, why: str, tmp_path) -> None:
    with pytest.raises(UnparsableSource, match=why):
        scan_source(data)
    path = tmp_path / "bad.py"
    path.write_bytes(data)
    assert scan_file(path) == []


def test_declared_encodings_and_bom_are_honoured() -> None:
    latin = "# -*- coding: latin-1 -*-\n# café\nk = kv_cache.float()\n".encode("latin-1")
    assert [f.line for f in scan_source(latin)] == [3]
    bom = "\ufeffk = kv_cache.float()\n".encode()
    (finding,) = scan_source(bom)
    assert finding.code == "k = kv_cache.float()"


def test_scan_file_raises_for_a_missing_file(tmp_path) -> None:
    with pytest.raises(FileNotFoundError):
        scan_file(tmp_path / "missing.py")


def test_comprehension_counters_index_one_layer() -> None:
    source = """\
        whole = [kv_caches[i].float() for i in range(n)]
        rows = [kv_caches[j].float() for j in token_ids]
    """
    assert kinds(source) == [(1, "whole_pool_cast"), (2, "gathered_cast")]


def test_slice_note_only_for_slices() -> None:
    sliced, indexed = scan_source("a = kv_cache[:, :512].half()\nb = kv_caches[0].half()\n")
    assert "basic slice" in sliced.reason
    assert "basic slice" not in indexed.reason


def test_sources_too_deep_to_walk_are_skipped(tmp_path) -> None:

    path = tmp_path / "generated.py"
    path.write_text("x = kv_cache.float()\ny = " + " + ".join(["a"] * 5000) + "\n")
    result = scan_paths([path])
    assert result.findings == [] and len(result.skipped) == 1
