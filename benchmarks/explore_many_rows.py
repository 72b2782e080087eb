"""Many-row tile variants side by side, outside the planner (round 6 of benchmarks/NOTES.md).

On a GPU: checks every variant against the float64 reference on small ragged batches (page
sizes 1/16/64, 1 and 3 splits), then times extend chunks, speculative decode and 128-head
decode with explicit tiles and split counts; writes ``$OUT/extend_variants.json`` and prints a
table. Under ``TRITON_INTERPRET=1`` on a CPU it runs the small correctness check only.

    PYTHONPATH=src python benchmarks/explore_many_rows.py
"""

import json
import os
import time

import torch
import triton

from fp8mla import reference
from fp8mla.bench.measure import time_cuda, time_graph
from fp8mla.kernels import mla_attention as K
from fp8mla.kernels.merge import _mla_merge_kernel
from fp8mla.ops.mla_attention import LN2_INV, fp8_conversion
from fp8mla.testing import make_batch, rel_err

dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
SMS = torch.cuda.get_device_properties(0).multi_processor_count if dev.type == "cuda" else 8
INTERP = dev.type != "cuda"


def launch(
    b, kern, bm, bn, w, s, q16, splits=None, extra=None, vs=False, causal=True, sm_scale=0.1
):
    qn, qp = b.q_nope, b.q_pe
    if q16:
        qn, qp = qn.to(torch.float16), qp.to(torch.float16)
    T, H, D = qn.shape
    B = b.batch
    max_qo = int((b.qo_indptr[1:] - b.qo_indptr[:-1]).max())
    m_tiles = -(-max_qo * H // bm)
    progs = m_tiles * B * (2 if vs else 1)
    if splits is None:
        splits = max(1, min(64, SMS // max(progs, 1), int(b.kv_len.max()) // 128))
    out = torch.empty(T, H, D, dtype=torch.bfloat16, device=dev)
    lse = torch.empty(T, H, dtype=torch.float32, device=dev)
    if splits > 1:
        mo = torch.empty(splits, T * H, D, dtype=torch.float32, device=dev)
        ml = torch.empty(splits, T * H, dtype=torch.float32, device=dev)
        dst, ldst, so, sl = mo, ml, (mo.stride(0), H * D, D), (ml.stride(0), H)
    else:
        dst, ldst, so, sl = out, lse, (0, out.stride(0), out.stride(1)), (0, lse.stride(0))
    cvt = fp8_conversion(b.ckv.dtype, dev, INTERP)
    ckv, kpe = (b.ckv.view(torch.uint8), b.kpe.view(torch.uint8)) if cvt else (b.ckv, b.kpe)
    grid = (m_tiles * (2 if vs else 1), B, splits)
    kw = dict(
        PAGE_SIZE=b.page_size,
        BLOCK_M=bm,
        BLOCK_N=bn,
        D_CKV=D,
        D_KPE=64,
        CAUSAL=causal,
        TOKEN_GROUP=False,
        CKV_SCALE_PTR=False,
        KPE_SCALE_PTR=False,
        DOT_DTYPE=triton.language.float32 if INTERP else triton.language.float16,
        WRITE_LSE=True,
        FP8_CVT=cvt,
        num_warps=w,
        num_stages=s,
        **(extra or {}),
    )
    args = (
        qn,
        qp,
        ckv,
        kpe,
        ckv,
        ckv,
        ckv,
        b.qo_indptr,
        b.kv_indptr,
        b.kv_indices,
        b.kv_len,
        dst,
        ldst,
        qn.stride(0),
        qn.stride(1),
        qp.stride(0),
        qp.stride(1),
        ckv.stride(0),
        ckv.stride(1),
        kpe.stride(0),
        kpe.stride(1),
        0,
        0,
        *so,
        *sl,
        H,
        sm_scale * LN2_INV,
        b.ckv_scale,
        b.kpe_scale,
    )

    def run():
        if q16:
            qn2, qp2 = b.q_nope.to(torch.float16), b.q_pe.to(torch.float16)
            a = (qn2, qp2) + args[2:]
        else:
            a = args
        kern[grid](*a, **kw)
        if splits > 1:
            _mla_merge_kernel[(T * H,)](
                mo,
                ml,
                out,
                lse,
                splits,
                H,
                mo.stride(0),
                ml.stride(0),
                out.stride(0),
                out.stride(1),
                lse.stride(0),
                D=D,
                WRITE_LSE=True,
                num_warps=4,
            )
        return out, lse

    return run, splits


ROWS = (K._mla_attn_rows_kernel, {}, False)
VS = (K._mla_attn_vsplit_kernel, {}, True)
VARIANTS = {
    "base rows 64x64 w8 s1": (*ROWS, 64, 64, 8, 1, False),
    "vsplit 128x64 w8 s2": (*VS, 128, 64, 8, 2, False),
    "vsplit q16 128x64 w8 s2": (*VS, 128, 64, 8, 2, True),
    "vsplit 128x64 w8 s1": (*VS, 128, 64, 8, 1, False),
    "vsplit 128x32 w8 s3": (*VS, 128, 32, 8, 3, False),
    "vsplit 64x32 w4 s3": (*VS, 64, 32, 4, 3, False),
    "vsplit 64x64 w4 s2": (*VS, 64, 64, 4, 2, False),
    "rows 32x64 w8 s1": (*ROWS, 32, 64, 8, 1, False),
    "rows 16x64 w8 s1": (*ROWS, 16, 64, 8, 1, False),
}
EXTEND_V = [
    "base rows 64x64 w8 s1",
    "vsplit 128x64 w8 s2",
    "vsplit q16 128x64 w8 s2",
    "vsplit 128x64 w8 s1",
    "vsplit 128x32 w8 s3",
    "vsplit 64x32 w4 s3",
]
SMALL_V = [
    ("base rows 64x64 w8 s1", (None, 32)),
    ("vsplit 64x32 w4 s3", (None, 16, 32)),
    ("vsplit 64x64 w4 s2", (None, 16)),
    ("vsplit 128x64 w8 s2", (None,)),
    ("rows 32x64 w8 s1", (None, 16)),
    ("rows 16x64 w8 s1", (None, 8, 16)),
]


def check_small():
    """Every variant against the float64 reference on small ragged batches."""
    res = {}
    g = torch.Generator().manual_seed(1)
    for ps in (1, 16, 64) if not INTERP else (16,):
        b = make_batch(
            [0, 1, 37, 300, 777] if not INTERP else [0, 1, 37, 70],
            16,
            qo_lens=[0, 1, 5, 37, 130] if not INTERP else [0, 1, 5, 9],
            page_size=ps,
            device=dev,
            generator=g,
        )
        ref_o, ref_l = reference.mla_reference(
            b.q_nope,
            b.q_pe,
            b.ckv,
            b.kpe,
            b.qo_indptr,
            b.kv_indptr,
            b.kv_indices,
            b.kv_len,
            causal=True,
            sm_scale=0.1,
            ckv_scale=b.ckv_scale,
            kpe_scale=b.kpe_scale,
        )
        for name, (kern, extra, vs, bm, bn, w, s, q16) in VARIANTS.items():
            if INTERP and bm > 64:
                continue
            for splits in (1, 3):
                run, _ = launch(b, kern, bm, bn, w, s, q16, splits=splits, extra=extra, vs=vs)
                o, lse = run()
                e = max(rel_err(o, ref_o), rel_err(lse, ref_l))
                res[name] = max(res.get(name, 0.0), e if e == e else 9e9)
    return res


def main():
    if INTERP:
        print(check_small())
        return
    out_dir = os.environ.get("OUT", "/tmp")
    rows = []
    small = check_small()
    print("small-batch max rel err vs float64:", json.dumps(small, indent=0), flush=True)
    cases = [
        ("E4096_P32768_H128", [32768 + 4096], 128, 4096),
        ("E4096_P32768_H32", [32768 + 4096], 32, 4096),
        ("S8x4_P8192_H16", [8192] * 8, 16, 4),
        ("D8_P8192_H16", [8192] * 8, 16, 1),
        ("D64_L4096_H128", [4096] * 64, 128, 1),
    ]
    for cname, kvl, H, qo in cases:
        g = torch.Generator().manual_seed(0)
        b = make_batch(
            kvl, H, qo_lens=qo, page_size=1, device=dev, generator=g, fill_unused_nan=True
        )
        pairs = sum(sum(k - qo + 1 + i for i in range(qo)) for k in kvl) * H
        fl = 2 * pairs * (576 + 512)
        base_o = None
        todo = (
            [(v, None) for v in EXTEND_V]
            if qo > 4
            else [(v, sp) for v, sps in SMALL_V for sp in sps]
        )
        if cname.startswith("D64"):
            todo = [
                ("base rows 64x64 w8 s1", None),
                ("vsplit 128x64 w8 s2", None),
                ("vsplit 64x32 w4 s3", None),
                ("vsplit 128x32 w8 s3", None),
            ]
        for name, sp in todo:
            kern, extra, vs, bm, bn, w, s, q16 = VARIANTS[name]
            try:
                run, splits = launch(
                    b, kern, bm, bn, w, s, q16, splits=sp, extra=extra, vs=vs, causal=qo > 1
                )
                o, lse = run()
                torch.cuda.synchronize()
                if base_o is None:
                    base_o = o.clone()
                err = rel_err(o, base_o)
                t = (
                    time_graph(run, reps=10)
                    if qo <= 4
                    else time_cuda(run, warmup_ms=50, rep_ms=400)
                )
                r = dict(
                    case=cname,
                    variant=name,
                    splits=splits,
                    us=round(t.us_median, 1),
                    tflops=round(fl / t.us_median / 1e6, 1),
                    err_vs_base=err,
                )
            except Exception as ex:  # report and go on
                r = dict(case=cname, variant=name, error=str(ex)[-300:])
            rows.append(r)
            print(json.dumps(r), flush=True)
    with open(os.path.join(out_dir, "extend_variants.json"), "w") as f:
        json.dump(
            dict(
                small=small,
                rows=rows,
                torch=torch.__version__,
                triton=triton.__version__,
                gpu=torch.cuda.get_device_name(0),
                date=time.strftime("%Y-%m-%d"),
            ),
            f,
            indent=1,
        )
    print(f"{'case':22} {'variant':34} {'splits':>6} {'us':>10} {'TFLOP/s':>8} {'err':>9}")
    for r in rows:
        if "error" in r:
            print(f"{r['case']:22} {r['variant']:34} ERROR {r['error'][-80:]}")
        else:
            print(
                f"{r['case']:22} {r['variant']:34} {r['splits']:6} {r['us']:10.1f} {r['tflops']:8.1f} {r['err_vs_base']:9.2e}"
            )


if __name__ == "__main__":
    main()
