"""How fast one program per SM can gather 576-byte FP8 rows through a page table into
shared memory, the way the FP8 × FP8 kernel's copier does (``cp.async`` of 16 bytes a thread
into the swizzled tile wgmma reads), with nothing consuming them: the copier's own rate, by
warps issuing the copies and tiles in flight.

    python benchmarks/probe_gather.py --json OUT/gather.json [--stages 2 3 4 5] [--warps 4 8]
        [--tiles 64] [--programs N] [--ahead 0 1]

Each variant reads the same random slots of a pool of 495,552 rows (tiles of 64 tokens, the
whole pool's index range); a tile is checked byte for byte against ``pool[slots]`` after the
run (the last tile of every program, copied back through a global buffer). The rate is the
bytes gathered over the CUDA-graph time of one launch; the copy rate of the same GPU is the
floor's denominator. The FP8 × FP8 kernel's steady state moves ~2.7 TB/s
(docs/design/sm90-fp8qk.md); a variant past ~3.4 TB/s would make ≤ 30 µs at
32 × 32 × 4,096 reachable.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier

from fp8mla.bench.measure import copy_bandwidth_tbps, time_graph

ROW = 576  # bytes per token: 512 latent + 64 RoPE
TILE = 64  # tokens per tile
SLOTS = 495_552
K_SH = gl.constexpr(gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=8, rank=2))
PE_SH = gl.constexpr(gl.NVMMASharedLayout(swizzle_byte_width=64, element_bitwidth=8, rank=2))


@gluon.jit
def _keep_last(k_stage, pe_stage, keep_ptr, pid, W: gl.constexpr):
    """The program's last tile ``[64, 512] + [64, 64]`` bytes into ``keep [programs, 64, 576]``
    (row-major, as in the pool), for the byte check."""
    ld: gl.constexpr = gl.BlockedLayout([1, 16], [4, 8], [W, 1], [1, 0])
    pe_ld: gl.constexpr = gl.BlockedLayout([1, 16], [8, 4], [W, 1], [1, 0])
    r = gl.arange(0, 64, layout=gl.SliceLayout(1, ld))
    c = gl.arange(0, 512, layout=gl.SliceLayout(0, ld))
    base = keep_ptr + pid.to(gl.int64) * (64 * 576)
    gl.store(base + r[:, None] * 576 + c[None, :], k_stage.load(ld))
    pr = gl.arange(0, 64, layout=gl.SliceLayout(1, pe_ld))
    pc = gl.arange(0, 64, layout=gl.SliceLayout(0, pe_ld))
    gl.store(base + pr[:, None] * 576 + 512 + pc[None, :], pe_stage.load(pe_ld))


@gluon.jit
def _gather_cpasync(pool_ptr, idx_ptr, keep_ptr, tiles, STAGES: gl.constexpr, AHEAD: gl.constexpr):
    """``tiles`` tiles per program by ``cp.async`` (16 bytes a thread, as the copier); with
    ``AHEAD`` a tile's slots are loaded one tile before its copies (as the kernel's copier
    does), else just before them."""
    pid = gl.program_id(0)
    W: gl.constexpr = gl.num_warps()
    ld: gl.constexpr = gl.BlockedLayout([1, 16], [4, 8], [W, 1], [1, 0])  # [64, 128] bytes
    pe_ld: gl.constexpr = gl.BlockedLayout([1, 16], [8, 4], [W, 1], [1, 0])  # [64, 64]
    k = gl.allocate_shared_memory(gl.uint8, [STAGES, 64, 512], K_SH)
    pe = gl.allocate_shared_memory(gl.uint8, [STAGES, 64, 64], PE_SH)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=W * 32)
    fence_async_shared()
    d = gl.arange(0, 128, layout=gl.SliceLayout(0, ld))
    e = gl.arange(0, 64, layout=gl.SliceLayout(0, pe_ld))
    t = gl.arange(0, 64, layout=gl.SliceLayout(1, ld))
    first = pid.to(gl.int64) * tiles * 64
    nxt = gl.load(idx_ptr + first + t)
    for j in range(tiles):
        s = j % STAGES
        if AHEAD:  # this tile's slots were loaded a tile ago; request the next tile's
            slot = nxt.to(gl.int64)
            nxt = gl.load(idx_ptr + first + (j + 1) * 64 + t, mask=j + 1 < tiles, other=0)
        if j >= STAGES:  # the stage's previous tile has landed: reuse it
            mbarrier.wait(ready.index(s), ((j // STAGES) - 1) & 1)
        if not AHEAD:
            slot = gl.load(idx_ptr + first + j * 64 + t).to(gl.int64)
        rows = slot * 576
        for c in gl.static_range(4):
            async_copy.async_copy_global_to_shared(
                k.index(s).slice(c * 128, 128, dim=1), pool_ptr + rows[:, None] + (c * 128 + d)[None, :]
            )  # fmt: skip
        pe_rows = gl.convert_layout(rows, gl.SliceLayout(1, pe_ld))
        async_copy.async_copy_global_to_shared(
            pe.index(s), pool_ptr + pe_rows[:, None] + 512 + e[None, :]
        )  # fmt: skip
        async_copy.mbarrier_arrive(ready.index(s), increment_count=False)
    last = (tiles - 1) % STAGES
    mbarrier.wait(ready.index(last), ((tiles - 1) // STAGES) & 1)
    _keep_last(k.index(last), pe.index(last), keep_ptr, pid, W)


def run(
    stages_list: list[int], warps_list: list[int], tiles: int, programs: int,
    ahead_list: list[int],
) -> list[dict]:  # fmt: skip
    dev = torch.device("cuda")
    sms = programs or torch.cuda.get_device_properties(dev).multi_processor_count
    g = torch.Generator(device=dev).manual_seed(0)
    pool = torch.randint(0, 256, (SLOTS, ROW), dtype=torch.uint8, device=dev, generator=g)
    idx = torch.randint(0, SLOTS, (sms * tiles * TILE,), dtype=torch.int32, device=dev, generator=g)
    keep = torch.zeros(sms, TILE, ROW, dtype=torch.uint8, device=dev)
    want = pool[idx.view(sms, tiles, TILE)[:, -1].long()]
    nbytes = idx.numel() * ROW
    out = []
    for stages, warps, ahead in itertools.product(stages_list, warps_list, ahead_list):
        fn = functools.partial(
            _gather_cpasync[(sms,)], pool, idx, keep, tiles, stages, ahead, num_warps=warps
        )
        keep.zero_()
        fn()
        torch.cuda.synchronize()
        same = bool(torch.equal(keep, want))
        t = time_graph(fn, reps=20)
        rec = dict(variant="cp.async" + (", slots ahead" if ahead else ""), stages=stages,
                   warps=warps, tiles=tiles, programs=sms,
                   same_bytes=same, us=round(t.us_median, 2),
                   tbps=round(nbytes / t.us_median / 1e6, 3))  # fmt: skip
        print(json.dumps(rec), flush=True)
        out.append(rec)
    t = time_graph(lambda: pool.index_select(0, idx.long()), reps=20)
    out.append(dict(variant="torch index_select (read + write)", us=round(t.us_median, 2),
                    tbps=round(2 * nbytes / t.us_median / 1e6, 3)))  # fmt: skip
    out.append(dict(variant="copy (read + write)", tbps=round(copy_bandwidth_tbps(dev), 3)))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", required=True)
    ap.add_argument("--stages", type=int, nargs="+", default=[2, 3, 4, 5])
    ap.add_argument("--warps", type=int, nargs="+", default=[4, 8])
    ap.add_argument("--tiles", type=int, default=64, help="tiles per program")
    ap.add_argument("--programs", type=int, default=0, help="default: one per SM")
    ap.add_argument("--ahead", type=int, nargs="+", default=[0, 1],
                    help="slots loaded just before the copies (0) or a tile ahead (1)")  # fmt: skip
    args = ap.parse_args()
    rows = run(args.stages, args.warps, args.tiles, args.programs, args.ahead)
    with open(args.json, "w") as f:
        json.dump(dict(rows=rows), f, indent=1)
    print(f"\n{'variant':<34} {'stages':>6} {'warps':>5} {'µs':>8} {'TB/s':>6}  same bytes")
    for r in rows:
        print(f"{r['variant']:<34} {r.get('stages', ''):>6} {r.get('warps', ''):>5} "
              f"{r.get('us', ''):>8} {r['tbps']:>6}  {r.get('same_bytes', '')}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
