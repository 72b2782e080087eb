"""The lightning indexer (``fp8mla.dsa``: ``paged_mqa_logits``, ``mqa_logits``, ``topk``,
``paged_topk``, ``to_slots``) against the float64 statement on the same bytes, with its
conventions: -inf past each row's length, speculative rows' causal lengths, DeepGEMM's 1-D
lengths, empty contexts, lengths off the page size, ``k`` beyond the context (-1 padding), ties
to the lower position, NaN bytes in slots no row reaches, the fused path equal to the two-pass
one, and bad arguments.

The kernels run compiled on a CUDA GPU and under TRITON_INTERPRET=1 on a CPU (small shapes
there); the ``gpu`` tests add the engines' sizes.
"""

from __future__ import annotations

import pytest
import torch
from indexer_cases import check_topk, gen, paged_index, queries

from fp8mla import dsa
from fp8mla.dsa import indexer_reference as R
from fp8mla.dsa.indexer_plan import topk_plan

from conftest import HAS_CUDA, INTERPRETED

DEVICE = "cuda" if HAS_CUDA else "cpu"
BACKENDS = ["triton", "torch"] if HAS_CUDA or INTERPRETED else ["torch"]
# The logits' error bar relative to each row's largest magnitude: 2e-6 where the FP8 products
# are added in fp32 (the interpreter, the PyTorch path); a GPU's tensor cores add them at their
# FP8 accumulation precision (Hopper's wgmma: up to 1.8e-4 on these tests on an H200, r37a).
GPU_LOGITS_TOL = 5e-4


def logits_tol(backend: str) -> float:
    return GPU_LOGITS_TOL if backend == "triton" and HAS_CUDA and not INTERPRETED else 2e-6


def logits_err(got: torch.Tensor, ref: torch.Tensor) -> float:
    """Largest error of the finite logits relative to their row's largest magnitude, after
    checking the -inf pattern is exactly the reference's."""
    fin = torch.isfinite(ref)
    assert torch.equal(torch.isfinite(got.cpu()), fin.cpu()), "the -inf positions differ"
    assert not torch.isnan(got).any()
    if not fin.any():
        return 0.0
    diff = torch.where(fin, (got.double() - ref).abs(), 0.0)
    scale = torch.where(fin, ref.abs(), 0.0).amax(1, keepdim=True).clamp_min(1e-30)
    return float((diff / scale).max())


# -- logits -------------------------------------------------------------------------------
PAGED_CASES = [  # lens [B][next_n], heads, page size
    ([[150], [64], [1]], 32, 64),
    ([[99, 100], [0, 1], [63, 64]], 8, 64),  # MTP: each token one more
    ([[0], [0]], 16, 64),  # empty contexts
    ([[200, 201]], 64, 16),
    ([[37], [130]], 4, 1),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("lens,heads,page_size", PAGED_CASES)
def test_paged_logits_match_float64(backend, lens, heads, page_size):
    c = paged_index(lens, heads, page_size=page_size, seed=len(lens) + heads, device=DEVICE)
    width = max(max(r) for r in lens) + 70
    got = dsa.paged_mqa_logits(c.q, c.weights, c.cache, c.block_table, c.lens,
                               max_context_len=width, backend=backend)  # fmt: skip
    ref = R.paged_mqa_logits_reference(c.q, c.weights, c.cache, c.block_table, c.lens, width)
    assert got.shape == (c.rows, width) and got.dtype == torch.float32
    assert logits_err(got, ref) <= logits_tol(backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_paged_logits_deepgemm_lengths_and_clamps(backend):
    """1-D lengths mean the last token's (DeepGEMM): earlier speculative tokens see one fewer
    each; lengths past max_context_len are clamped; page ids past the cache are read clamped
    into it (never outside)."""
    c = paged_index([[90, 91], [40, 41]], 16, seed=3, device=DEVICE)
    two_d = dsa.paged_mqa_logits(c.q, c.weights, c.cache, c.block_table, c.lens,
                                 max_context_len=128, backend=backend)  # fmt: skip
    one_d = dsa.paged_mqa_logits(c.q, c.weights, c.cache, c.block_table, c.lens[:, 1].contiguous(),
                                 max_context_len=128, backend=backend)  # fmt: skip
    assert torch.equal(one_d, two_d)
    short = dsa.paged_mqa_logits(c.q, c.weights, c.cache, c.block_table, c.lens,
                                 max_context_len=64, backend=backend)  # fmt: skip
    assert torch.equal(short, two_d[:, :64])


RAGGED_CASES = [  # rows, heads, keys, ranges
    (5, 32, 150, [(0, 150), (10, 11), (40, 40), (149, 150), (0, 64)]),
    (9, 8, 70, [(0, 70)] * 4 + [(3, 65), (64, 70), (0, 0), (70, 70), (5, 6)]),
    (3, 64, 300, [(200, 300), (0, 100), (130, 131)]),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("rows,heads,nk,ranges", RAGGED_CASES)
def test_mqa_logits_match_float64(backend, rows, heads, nk, ranges):
    g = gen(rows * nk)
    q = queries((rows, heads, 128), rows).to(DEVICE)
    w = torch.randn(rows, heads, generator=g).to(DEVICE)
    keys = queries((nk, 128), nk).to(DEVICE)
    scales = torch.rand(nk, generator=g).to(DEVICE) + 0.01
    ks = torch.tensor([a for a, _ in ranges], dtype=torch.int32, device=DEVICE)
    ke = torch.tensor([b for _, b in ranges], dtype=torch.int32, device=DEVICE)
    got = dsa.mqa_logits(q, w, keys, scales, ks, ke, backend=backend)
    ref = R.mqa_logits_reference(q, w, keys, scales, ks, ke)
    assert logits_err(got, ref) <= logits_tol(backend)


# -- top-k --------------------------------------------------------------------------------
def random_logits(rows: int, cols: int, seed: int, ties: bool = False) -> torch.Tensor:
    g = gen(seed)
    if ties:  # few distinct values: long runs of equal ones
        return (torch.randint(-3, 4, (rows, cols), generator=g) * 0.5).float()
    return torch.randn(rows, cols, generator=g) * torch.exp(torch.randn(rows, 1, generator=g))


TOPK_CASES = [  # rows, cols, k, ties
    (3, 300, 16, False),
    (4, 100, 64, True),
    (2, 9000, 16, False),  # chunks and a merge
    (1, 16500, 4096, True),  # two merge levels
    (5, 40, 100, False),  # k beyond every row: -1 padding
    (2, 2048, 1, False),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("rows,cols,k,ties", TOPK_CASES)
def test_topk_matches_reference(backend, rows, cols, k, ties):
    logits = random_logits(rows, cols, rows * cols + k, ties)
    g = gen(cols)
    lengths = torch.randint(0, cols + 20, (rows,), generator=g, dtype=torch.int32)
    lengths[0] = cols
    got = dsa.topk(logits.to(DEVICE), lengths.to(DEVICE), k, backend=backend)
    assert torch.equal(got.cpu(), R.topk_reference(logits, lengths, k))
    check_topk(got, logits, lengths, k)


def test_topk_plans_reach_the_merge_levels():
    assert topk_plan(2, 9000, 16, 8).levels == (1,)
    assert topk_plan(1, 16500, 4096, 8).levels == (2, 1)
    assert topk_plan(64, 32768, 2048, 132).levels == (1,)
    assert topk_plan(1, 131072, 2048, 132).levels == (4, 1)
    assert topk_plan(1, 131072, 2048, 132, select_entries=16384).levels == (1,)
    assert topk_plan(1, 16384, 2048, 132, select_entries=16384).single


@pytest.mark.skipif(not (HAS_CUDA or INTERPRETED), reason="runs the Triton kernels")
@pytest.mark.parametrize("select_entries,warps", [(8192, 4), (16384, 16)])
@pytest.mark.parametrize("rows,cols,k,ties", [(1, 40000, 2048, True), (3, 20000, 100, False)])
def test_topk_select_entries(select_entries, warps, rows, cols, k, ties):
    """The table's knobs (what ``benchmarks/tune_topk.py`` times): candidates a program
    selects from, and so the levels, and warps a program; the same positions for each."""
    from dataclasses import replace

    from fp8mla.dsa import indexer_launch as L

    logits = random_logits(rows, cols, cols + k, ties)
    lengths = torch.full((rows,), cols, dtype=torch.int32)
    lengths[-1] = cols - 9000
    base = L.launch_for(torch.device(DEVICE))
    table = replace(base.table, select_entries=select_entries,
                    entries_per_warp=select_entries // warps, max_warps=32)  # fmt: skip
    out = torch.empty(rows, k, dtype=torch.int32, device=DEVICE)
    L.topk(logits.to(DEVICE), None, lengths.to(DEVICE), k, out, replace(base, table=table))
    assert torch.equal(out.cpu(), R.topk_reference(logits, lengths, k))


@pytest.mark.skipif(not (HAS_CUDA or INTERPRETED), reason="runs the Triton kernels")
@pytest.mark.parametrize("seed", range(6))
def test_topk_digits_random_shapes(seed):
    """The digits path over many small chunks (64 columns, up to 64 a row) on random shapes:
    k from 1 to past some rows' ends, ties within and across chunks, NaN and infinities, empty and
    short rows, start columns; the positions the reference gives."""
    from dataclasses import replace

    from fp8mla.dsa import indexer_launch as L

    g = gen(1000 + seed)
    rows = int(torch.randint(1, 5, (), generator=g))
    cols = int(torch.randint(2100, 4000, (), generator=g))
    k = [1, 7, 100, 333, 700, 1000][seed]
    if seed % 2:
        logits = (torch.randint(-4, 5, (rows, cols), generator=g) * 0.25).float()
    else:
        logits = torch.randn(rows, cols, generator=g)
    logits[0, int(torch.randint(0, cols, (), generator=g))] = float("nan")
    logits[-1, :30] = float("inf")
    starts = torch.randint(0, 200, (rows,), dtype=torch.int32, generator=g)
    ends = torch.randint(0, cols + 1, (rows,), dtype=torch.int32, generator=g)
    ends[0] = cols
    if rows > 1:
        ends[1] = starts[1]  # an empty row
    base = L.launch_for(torch.device(DEVICE))
    table = replace(base.table, topk_path="digits", select_entries=512, digit_chunk=64)
    launch = replace(base, table=table)
    assert topk_plan(rows, cols, k, launch.sms, 512).path(table, rows, launch.sms) == "digits"
    out = torch.empty(rows, k, dtype=torch.int32, device=DEVICE)
    L.topk(logits.to(DEVICE), starts.to(DEVICE), ends.to(DEVICE), k, out, launch)
    assert torch.equal(out.cpu(), R.topk_reference(logits, ends, k, starts))


def test_topk_path_choice():
    """ "auto" takes the digits where the levels' first grid would not fill the GPU's SMs
    (one stream over a long context), the levels where it would; one-program rows and a
    histogram path without room fall back to the levels; bad knobs are refused."""
    from dataclasses import replace

    from fp8mla.dsa.indexer_plan import INDEXER_TABLES

    fp8 = INDEXER_TABLES["fp8"]
    assert fp8.topk_path == "auto"
    assert topk_plan(1, 131072, 2048, 132).path(fp8, 1, 132) == "digits"
    assert topk_plan(1, 1 << 20, 2048, 132).path(fp8, 1, 132) == "levels"  # 256 chunks
    assert topk_plan(64, 32768, 2048, 132).path(fp8, 64, 132) == "levels"
    assert topk_plan(8, 4000, 2048, 132).path(fp8, 8, 132) == "levels"  # one program a row
    hist = replace(fp8, topk_path="histogram", select_entries=4096)
    assert topk_plan(1, 131072, 4096, 132, 4096).path(hist, 1, 132) == "levels"
    for bad in ({"topk_path": "fast"}, {"radix_bits": 3}, {"digit_chunk": 3000},
                {"digit_warps": 6}):  # fmt: skip
        with pytest.raises(ValueError):
            replace(fp8, **bad)


@pytest.mark.skipif(not (HAS_CUDA or INTERPRETED), reason="runs the Triton kernels")
@pytest.mark.parametrize("radix_bits", [5, 8])
@pytest.mark.parametrize("path", ["levels", "histogram", "digits"])
def test_topk_radix_steps(path, radix_bits):
    """The k-th key found by histogram steps of ``radix_bits`` bits (``indexer_topk.
    radix_kth_key``; the first step takes what is left of 32 bits): the same positions as
    the reference through ties, NaN, infinities, -0, start columns and short rows."""
    from dataclasses import replace

    from fp8mla.dsa import indexer_launch as L

    rows, cols, k = 3, 20000, 1000
    logits = random_logits(rows, cols, radix_bits + 7, ties=False)
    logits[0, ::3] = 0.25  # ties at and around the k-th key
    logits[1, 5], logits[1, 7], logits[1, 100:300] = float("nan"), float("inf"), -0.0
    logits[2, :50] = float("-inf")
    starts = torch.tensor([0, 40, 7], dtype=torch.int32)
    lengths = torch.tensor([cols, cols - 500, 800], dtype=torch.int32)  # row 2: under k keys
    base = L.launch_for(torch.device(DEVICE))
    launch = replace(base, table=replace(base.table, topk_path=path, radix_bits=radix_bits))
    out = torch.empty(rows, k, dtype=torch.int32, device=DEVICE)
    L.topk(logits.to(DEVICE), starts.to(DEVICE), lengths.to(DEVICE), k, out, launch)
    assert torch.equal(out.cpu(), R.topk_reference(logits, lengths, k, starts))


@pytest.mark.parametrize("backend", BACKENDS)
def test_topk_starts_nan_signed_zero_and_empty_rows(backend):
    logits = random_logits(4, 200, 7)
    logits[0, 5] = float("nan")  # above +inf
    logits[0, 6] = float("inf")
    logits[1, :] = 0.0
    logits[1, 10:20] = -0.0  # equal to +0: lower positions win
    starts = torch.tensor([0, 5, 150, 30], dtype=torch.int32)
    ends = torch.tensor([200, 200, 100, 30], dtype=torch.int32)  # rows 2, 3 empty
    got = dsa.topk(logits.to(DEVICE), ends.to(DEVICE), 8, starts=starts.to(DEVICE),
                   backend=backend).cpu()  # fmt: skip
    assert got[0, :2].tolist() == [5, 6]
    assert got[1].tolist() == list(range(8))  # positions relative to start 5
    assert torch.all(got[2:] == -1)
    assert torch.equal(got, R.topk_reference(logits, ends, 8, starts))


# -- paged top-k, fused and not -----------------------------------------------------------
FUSED_CASES = [  # lens, heads, k, page size
    ([[300], [129], [0]], 16, 32, 64),
    ([[250, 251], [64, 65]], 8, 40, 64),
    ([[700]], 32, 64, 64),
    ([[90]], 4, 128, 16),  # k beyond the context
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("lens,heads,k,page_size", FUSED_CASES)
def test_paged_topk_fused_and_two_pass_agree(backend, lens, heads, k, page_size):
    c = paged_index(lens, heads, page_size=page_size, seed=k, device=DEVICE)
    width = max(max(r) for r in lens) + 1
    logits = dsa.paged_mqa_logits(c.q, c.weights, c.cache, c.block_table, c.lens,
                                  max_context_len=width, backend=backend)  # fmt: skip
    flat = c.lens.flatten()
    want = R.topk_reference(logits.cpu(), flat.cpu(), k)
    want_slots = R.to_slots_reference(want, c.block_table.cpu(), page_size)
    for fused in (False, True):
        pos, slots = dsa.paged_topk(c.q, c.weights, c.cache, c.block_table, c.lens, k=k,
                                    max_context_len=width, fused=fused, return_slots=True,
                                    backend=backend)  # fmt: skip
        assert torch.equal(pos.cpu(), want), f"fused={fused}"
        assert torch.equal(slots.cpu(), want_slots), f"fused={fused}"
        assert torch.equal(dsa.to_slots(pos, c.block_table, page_size, backend=backend).cpu(),
                           want_slots)  # fmt: skip


@pytest.mark.parametrize("backend", BACKENDS)
def test_paged_topk_against_float64_scores(backend):
    """The positions are a top-k of the float64 scores up to float32 rounding."""
    c = paged_index([[400], [230]], 32, seed=11, device=DEVICE)
    ref = R.paged_mqa_logits_reference(c.q, c.weights, c.cache, c.block_table, c.lens, 400)
    pos = dsa.paged_topk(c.q, c.weights, c.cache, c.block_table, c.lens, k=48,
                         max_context_len=400, backend=backend)  # fmt: skip
    check_topk(pos, ref, c.lens.flatten(), 48, tol=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
def test_to_slots_requests_and_bad_pages(backend):
    table = torch.tensor([[4, 1, -1], [0, 7, 9]], dtype=torch.int32)  # page 9: outside
    pos = torch.tensor([[0, 65, 130, -1, 200], [127, 128, 5, 64, 191]], dtype=torch.int32)
    want = torch.tensor([[256, 65, -1, -1, -1], [511, -1, 5, 448, -1]], dtype=torch.int32)
    # row 0: page 2 is -1, 200 lies past the table; row 1: 128 and 191 are on page 9, outside
    got = dsa.to_slots(pos.to(DEVICE), table.to(DEVICE), 64, num_pages=8, backend=backend)
    assert torch.equal(got.cpu(), want)
    req = torch.tensor([1, 0], dtype=torch.int32)
    got = dsa.to_slots(pos.flip(0).to(DEVICE), table.to(DEVICE), 64, req_ids=req.to(DEVICE),
                       num_pages=8, backend=backend)  # fmt: skip
    assert torch.equal(got.cpu(), want.flip(0))


def test_cpu_tensors_take_the_torch_path():
    c = paged_index([[100, 101]], 8, seed=2)
    a = dsa.paged_topk(c.q, c.weights, c.cache, c.block_table, c.lens, k=16, max_context_len=128)
    b = dsa.paged_topk(c.q, c.weights, c.cache, c.block_table, c.lens, k=16, max_context_len=128,
                       backend="torch")  # fmt: skip
    assert torch.equal(a, b)


def test_bad_arguments():
    c = paged_index([[100]], 8, seed=1)
    args = (c.q, c.weights, c.cache, c.block_table, c.lens)
    with pytest.raises(ValueError, match="max_context_len"):
        dsa.paged_mqa_logits(*args, max_context_len=-1)
    with pytest.raises(ValueError, match="k an int in \\[1, 8192\\]"):
        dsa.paged_topk(*args, max_context_len=100, k=0)
    with pytest.raises(ValueError, match="q of shape"):
        dsa.paged_mqa_logits(c.q[..., :64], *args[1:], max_context_len=100)
    with pytest.raises(ValueError, match="q of dtype"):
        dsa.paged_mqa_logits(c.q.float(), *args[1:], max_context_len=100)
    with pytest.raises(ValueError, match="weights of shape"):
        dsa.paged_mqa_logits(c.q, c.weights[:, :4], *args[2:], max_context_len=100)
    with pytest.raises(ValueError, match="context_lens of shape"):
        dsa.paged_mqa_logits(*args[:4], c.lens.view(1, 1, 1), max_context_len=100)
    with pytest.raises(ValueError, match="block_table of shape"):
        dsa.paged_mqa_logits(*args[:3], c.block_table.repeat(2, 1), c.lens, max_context_len=100)
    with pytest.raises(ValueError, match="next_n × H"):
        dsa.paged_mqa_logits(c.q[:, :, :1].expand(1, 3, 100, 128), c.weights, *args[2:],
                             max_context_len=100)  # fmt: skip
    with pytest.raises(ValueError, match="fused"):
        dsa.paged_topk(*args, max_context_len=100, fused="yes")
    logits = torch.zeros(2, 10)
    with pytest.raises(ValueError, match="lengths of shape"):
        dsa.topk(logits, torch.zeros(3, dtype=torch.int32), 4)
    with pytest.raises(ValueError, match="logits of dtype"):
        dsa.topk(logits.double(), torch.zeros(2, dtype=torch.int32), 4)
    with pytest.raises(ValueError, match="multiple of 2"):
        dsa.to_slots(torch.zeros(3, 4, dtype=torch.int32), torch.zeros(2, 3, dtype=torch.int32), 64)
    with pytest.raises(ValueError, match="ks of shape"):
        dsa.mqa_logits(c.q[0], c.weights, c.q[0, 0], torch.ones(8), torch.zeros(2, dtype=torch.int32),
                       torch.zeros(1, dtype=torch.int32))  # fmt: skip


# -- GPU sizes ----------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("batch,next_n,heads,context", [(64, 1, 64, 32768), (1, 1, 32, 131072),
                                                        (8, 2, 64, 20000)])  # fmt: skip
def test_gpu_engine_sizes(batch, next_n, heads, context):
    lens = [[context - next_n + 1 + i for i in range(next_n)] for _ in range(batch)]
    for b in range(1, batch, 3):
        lens[b] = [max(0, x - 977 * b) for x in lens[b]]
    c = paged_index(lens, heads, seed=batch, device="cuda")
    logits = dsa.paged_mqa_logits(c.q, c.weights, c.cache, c.block_table, c.lens,
                                  max_context_len=context)  # fmt: skip
    ref = R.paged_mqa_logits_reference(c.q, c.weights, c.cache, c.block_table, c.lens, context)
    assert logits_err(logits, ref) <= GPU_LOGITS_TOL
    flat = c.lens.flatten()
    two_pass = dsa.topk(logits, flat, 2048)
    assert torch.equal(two_pass.cpu(), R.topk_reference(logits.cpu(), flat.cpu(), 2048))
    for fused in (False, True):
        pos = dsa.paged_topk(c.q, c.weights, c.cache, c.block_table, c.lens, k=2048,
                             max_context_len=context, fused=fused)  # fmt: skip
        check_topk(pos, ref, flat, 2048, tol=2 * GPU_LOGITS_TOL)  # two values, each off


HIST_CASES = [  # rows, cols, k, kind
    (2, 20000, 2048, "random"),
    (1, 40000, 2048, "ties"),  # few distinct values: the threshold's bin holds most keys
    (2, 17000, 100, "equal"),  # every key in one bin: the last program selects more than once
    (3, 9000, 16, "specials"),  # NaN, +-inf, -0
]


@pytest.mark.skipif(not (HAS_CUDA or INTERPRETED), reason="runs the Triton kernels")
@pytest.mark.parametrize("path", ["histogram", "digits"])
@pytest.mark.parametrize("rows,cols,k,kind", HIST_CASES)
def test_topk_histogram_path(path, rows, cols, k, kind):
    """The table's histogram path (a threshold from the row's histogram of key bits, each
    chunk's keys above it, one gathering program a row) and digits path (the k-th key's four
    digits in a grid each over the chunks, then each chunk writes its share): the positions
    and slots the levels give, whatever the threshold's bin holds (ties to the k-th key
    across chunks), with start columns and short rows."""
    from dataclasses import replace

    from fp8mla.dsa import indexer_launch as L

    g = gen(rows * cols + k)
    if kind == "ties":
        logits = (torch.randint(-3, 4, (rows, cols), generator=g) * 0.5).float()
    elif kind == "equal":
        logits = torch.zeros(rows, cols)
    else:
        logits = torch.randn(rows, cols, generator=g)
    if kind == "specials":
        logits[0, 5], logits[0, 7], logits[1, :50] = float("nan"), float("inf"), float("-inf")
        logits[2, 100:200] = -0.0
    lengths = torch.full((rows,), cols, dtype=torch.int32)
    lengths[-1] = cols - 3000 if rows > 1 else cols
    starts = torch.randint(0, 100, (rows,), dtype=torch.int32, generator=g)
    page, pages = 64, -(-cols // 64)
    table = torch.randperm(rows * pages, generator=g).to(torch.int32).view(rows, pages)
    base = L.launch_for(torch.device(DEVICE))
    launch = replace(base, table=replace(base.table, topk_path=path))
    plan = topk_plan(rows, cols, k, launch.sms)
    assert (
        plan.histogram_serves(launch.table.select_entries)
        if path == "histogram"
        else (not plan.single)
    )
    out = torch.empty(rows, k, dtype=torch.int32, device=DEVICE)
    slots = torch.empty_like(out)
    s = L.Slots(slots, table.to(DEVICE), 1, page, rows * pages)
    L.topk(logits.to(DEVICE), starts.to(DEVICE), lengths.to(DEVICE), k, out, launch, s)
    want = R.topk_reference(logits, lengths, k, starts)
    assert torch.equal(out.cpu(), want)
    assert torch.equal(slots.cpu(), R.to_slots_reference(want, table, page, None, rows * pages))
