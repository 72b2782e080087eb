"""One GPU call for the SM90 few-row decode kernel: correctness on fresh random batches against
the float64 reference, then CUDA-graph timings of its variants beside the baselines (fp8mla's
current path on the FP8 and a bf16 pool, FlashInfer on both pools when importable), a short
table last. Usage: ``python benchmarks/proto_fewrows.py [--json OUT]``."""

from __future__ import annotations

import argparse
import json
import math
import sys
import time

import torch

from fp8mla.bench.cases import Case
from fp8mla.bench.inputs import build_inputs
from fp8mla.bench.measure import copy_bandwidth_tbps, kv_bytes, time_graph
from fp8mla.kernels import mla_tiles as T
from fp8mla.ops.mla_attention import LN2_INV, launch_merge
from fp8mla.ops.planner import KernelConfig, LaunchPlan
from fp8mla.reference import mla_reference
from fp8mla.testing import make_batch, rel_err

SM_SCALE = 1 / math.sqrt(192)
CVT = {"ptx": (T.CVT_PTX_E4M3, T.CVT_PTX_E5M2), "int": (T.CVT_INT_E4M3, T.CVT_INT_E5M2)}


def launch_few(q_nope, q_pe, ckv, kpe, qo_indptr, kv_indptr, kv_indices, kv_len, out, lse,
               ws, *, batch, splits, causal, ckv_scale=1.0, kpe_scale=1.0, scale_arr=None,
               pw=4, cvt="ptx", pr=None, vr=None, rows=None, merge=True):  # fmt: skip
    from fp8mla.kernels.mla_fewrows import _mla_attn_fewrows_kernel as kernel

    tokens, heads, d = q_nope.shape
    if rows is None:
        rows = max(1, (int(qo_indptr.diff().max().item()) if batch else 1) * heads)
    block = 16 if rows <= 16 else 32
    assert rows <= 32
    e4m3 = ckv.dtype == torch.float8_e4m3fn
    fp8_cvt = int(CVT[cvt][0 if e4m3 else 1])
    ckv8, kpe8 = ckv.view(torch.uint8), kpe.view(torch.uint8)
    split = splits > 1
    if split:
        mid_o = ws[: splits * tokens * heads * d].view(splits, tokens * heads, d)
        mid_lse = ws[splits * tokens * heads * d :][: splits * tokens * heads].view(splits, -1)
        o_dst, l_dst = mid_o, mid_lse
        so, sl = (mid_o.stride(0), heads * d, d), (mid_lse.stride(0), heads)
    else:
        o_dst, l_dst = out, lse if lse is not None else out
        so, sl = (0, out.stride(0), out.stride(1)), (0, lse.stride(0) if lse is not None else 0)
    ck_ptr = isinstance(ckv_scale, torch.Tensor)
    kp_ptr = isinstance(kpe_scale, torch.Tensor)
    tg = scale_arr is not None
    kernel[(1, batch, splits)](
        q_nope, q_pe, ckv8, kpe8, scale_arr if tg else ckv8,
        ckv_scale if ck_ptr else ckv8, kpe_scale if kp_ptr else ckv8,
        qo_indptr, kv_indptr, kv_indices, kv_len, o_dst, l_dst,
        q_nope.stride(0), q_nope.stride(1), q_pe.stride(0), q_pe.stride(1),
        ckv8.stride(0), ckv8.stride(1), kpe8.stride(0), kpe8.stride(1),
        scale_arr.stride(0) if tg else 0, scale_arr.stride(1) if tg else 0,
        *so, *sl, heads, tokens, ckv.shape[0], kv_indices.numel(),
        SM_SCALE * LN2_INV, 1.0 if ck_ptr else float(ckv_scale), 1.0 if kp_ptr else float(kpe_scale),
        PAGE_SIZE=ckv.shape[1], BLOCK_M=block, BLOCK_N=64, D_CKV=512, D_KPE=64, CAUSAL=causal,
        TOKEN_GROUP=tg, CKV_SCALE_PTR=ck_ptr, KPE_SCALE_PTR=kp_ptr, DOT_DTYPE=torch.float16,
        WRITE_LSE=split or lse is not None, FP8_CVT=fp8_cvt, PRODUCER_WARPS=pw,
        PRODUCER_REGS=pr or 128, VALUE_REGS=vr or 104, num_warps=4,
    )  # fmt: skip
    if split and merge:
        plan = LaunchPlan(KernelConfig(block, 64, 4, 1), m_tiles=1, num_splits=splits)
        launch_merge(mid_o, mid_lse, out, lse, qo_indptr, plan, batch, heads)
    return out


def check(label, batch, *, causal=False, splits=1, scale_ptr=False, **kw):
    dev = batch.q_nope.device
    out = torch.full_like(batch.q_nope, float("nan"))
    lse = torch.full(batch.q_nope.shape[:2], float("nan"), device=dev)
    ws = torch.empty(64 << 20, dtype=torch.float32, device=dev)
    sc = dict(ckv_scale=batch.ckv_scale, kpe_scale=batch.kpe_scale)
    if scale_ptr:
        sc = {k: torch.tensor([v], device=dev) for k, v in sc.items()}
    if batch.ckv_scale_arr is not None:
        sc = dict(ckv_scale=1.0, kpe_scale=batch.kpe_scale, scale_arr=batch.ckv_scale_arr)
    launch_few(batch.q_nope, batch.q_pe, batch.ckv, batch.kpe, *batch.plan_args(), out, lse, ws,
               batch=batch.batch, splits=splits, causal=causal, **sc, **kw)  # fmt: skip
    torch.cuda.synchronize()
    ref, ref_lse = mla_reference(
        batch.q_nope, batch.q_pe, batch.ckv, batch.kpe, *batch.plan_args(), sm_scale=SM_SCALE,
        causal=causal, ckv_scale=batch.ckv_scale, kpe_scale=batch.kpe_scale,
        ckv_scale_arr=batch.ckv_scale_arr,
    )  # fmt: skip
    err = rel_err(out, ref)
    empty = torch.isinf(ref_lse)
    lse_err = (
        (lse.double().cpu() - ref_lse.cpu())[~empty.cpu()].abs().max().item()
        if (~empty).any()
        else 0.0
    )
    ok = err <= 3e-3 and torch.isfinite(out).all().item() and lse_err < 2e-3
    ok = ok and torch.equal(torch.isinf(lse).cpu(), empty.cpu())
    print(f"{'ok ' if ok else 'BAD'} {label:<58} err {err:.2e} lse {lse_err:.1e}")
    return ok


def correctness(variants) -> bool:
    g = lambda s: torch.Generator().manual_seed(s)
    dev = "cuda"
    all_ok = True
    lens = [0, 1, 17, 64, 65, 300, 1024, 2049]
    for pw, cvt in variants:
        kw = dict(pw=pw, cvt=cvt)
        tag = f"pw{pw} {cvt}"
        for heads, ps, dt, splits in [(16, 1, torch.float8_e4m3fn, 1), (16, 16, torch.float8_e5m2, 3),
                                      (32, 64, torch.float8_e4m3fn, 4), (8, 1, torch.float8_e4m3fn, 7),
                                      (32, 1, torch.float8_e5m2, 64), (1, 16, torch.float8_e4m3fn, 2)]:  # fmt: skip
            b = make_batch(
                lens, heads, page_size=ps, kv_dtype=dt, device=dev, generator=g(heads + ps)
            )
            all_ok &= check(
                f"{tag} H{heads} P{ps} {str(dt)[-6:]} S{splits}", b, splits=splits, **kw
            )
        b = make_batch(lens, 16, page_size=16, device=dev, generator=g(5))
        all_ok &= check(f"{tag} H16 device scales S2", b, splits=2, scale_ptr=True, **kw)
        b = make_batch(lens, 16, page_size=64, scale_mode="token_group", device=dev, generator=g(6))
        all_ok &= check(f"{tag} H16 token-group scales S3", b, splits=3, **kw)
        for qo, heads in [(2, 16), (4, 8), (3, 10)]:
            b = make_batch([5, 64, 300, 1000], heads, qo_lens=qo, page_size=16, device=dev,
                           generator=g(qo))  # fmt: skip
            all_ok &= check(
                f"{tag} causal {qo} tokens x H{heads} S2", b, causal=True, splits=2, **kw
            )
        # a bad page id: that request NaN, the others right
        b = make_batch([100, 200, 300], 16, page_size=1, device=dev, generator=g(9))
        b.kv_indices[150] = b.ckv.shape[0] + 5
        out = torch.zeros_like(b.q_nope)
        lse = torch.zeros(b.q_nope.shape[:2], device=dev)
        ws = torch.empty(64 << 20, dtype=torch.float32, device=dev)
        launch_few(b.q_nope, b.q_pe, b.ckv, b.kpe, *b.plan_args(), out, lse, ws, batch=3,
                   splits=2, causal=False, ckv_scale=b.ckv_scale, kpe_scale=b.kpe_scale, **kw)  # fmt: skip
        torch.cuda.synchronize()
        nan_ok = out[1].isnan().all().item() and lse[1].isnan().all().item()
        fin_ok = torch.isfinite(out[[0, 2]]).all().item()
        print(f"{'ok ' if nan_ok and fin_ok else 'BAD'} {tag} bad page id -> NaN request")
        all_ok &= nan_ok and fin_ok
    return all_ok


def flashinfer_runner(inp, kv_dtype, pool):
    import os
    import pathlib

    aot = os.environ.get("FP8MLA_FLASHINFER_AOT")
    if aot:
        import flashinfer.jit.env as fi_env

        fi_env.FLASHINFER_AOT_DIR = pathlib.Path(aot)
    from flashinfer.mla import BatchMLAPagedAttentionWrapper as FI

    w = FI(torch.empty(256 << 20, dtype=torch.uint8, device="cuda"))
    w.plan(inp.qo_indptr, inp.kv_indptr, inp.kv_indices, inp.kv_len, inp.case.heads, 512, 64,
           1, False, SM_SCALE, torch.bfloat16, kv_dtype)  # fmt: skip
    ckv, kpe = inp.paged(pool)
    kw = dict(ckv_scale=1.0, kpe_scale=1.0) if kv_dtype != torch.bfloat16 else {}
    out = torch.empty_like(inp.q_nope)
    return lambda: w.run(inp.q_nope, inp.q_pe, ckv, kpe, out=out, **kw)


def fp8mla_runner(inp, pool):
    from fp8mla.bench.impls import planned_wrapper

    w = planned_wrapper(inp, pool.dtype)
    ckv, kpe = inp.paged(pool)
    out = torch.empty_like(inp.q_nope)
    return lambda: w.run(inp.q_nope, inp.q_pe, ckv, kpe, out=out)


def few_runner(inp, splits, placements=None, **kw):
    ckv, kpe = inp.paged()
    out = torch.empty_like(inp.q_nope)
    ws = torch.empty(64 << 20, dtype=torch.float32, device="cuda")
    sets = placements or [inp.kv_indices]

    def run():
        for idx in sets:
            launch_few(inp.q_nope, inp.q_pe, ckv, kpe, inp.qo_indptr, inp.kv_indptr, idx,
                       inp.kv_len, out, None, ws, batch=inp.case.batch, splits=splits,
                       causal=False, rows=inp.case.heads, **kw)  # fmt: skip
        return out

    return run


def timing(variants, rows_out):
    copy = copy_bandwidth_tbps(torch.device("cuda"))
    print(f"copy bandwidth {copy:.2f} TB/s")
    pool = None
    cases = [Case(32, 32, 4096), Case(64, 16, 4096), Case(8, 32, 16384), Case(1, 32, 4096)]
    bf16_pool = None
    for case in cases:
        inp = build_inputs(case, torch.device("cuda"), seed=1, pool=pool)
        pool = inp.pool
        if bf16_pool is None:
            bf16_pool = pool.to(torch.bfloat16)
        floor = kv_bytes(case) / (copy * 1e12) * 1e6
        ref_fn = fp8mla_runner(inp, pool)
        ref = ref_fn().float()
        res = {"case": case.name, "floor_us": floor}
        auto = max(1, min(132 // case.batch, case.context // 64, 64))
        # small cases: many token placements per graph, so that the L2 does not hold them all
        n_pl = 32 if case.batch == 1 else 1
        pl = [inp.kv_indices] + [
            torch.randint(0, pool.shape[0], inp.kv_indices.shape, device="cuda", dtype=torch.int32)
            for _ in range(n_pl - 1)
        ]
        for pw, cvt in variants:
            for splits in sorted({auto, min(64, 2 * auto), max(1, auto // 2)}):
                fn = few_runner(inp, splits, pw=pw, cvt=cvt)
                err = rel_err(fn().float(), ref)
                t = (
                    time_graph(
                        few_runner(inp, splits, placements=pl, pw=pw, cvt=cvt), reps=30
                    ).us_median
                    / n_pl
                )
                res[f"few pw{pw} {cvt} S{splits}"] = t
                tk = (
                    time_graph(
                        few_runner(inp, splits, placements=pl, pw=pw, cvt=cvt, merge=False), reps=30
                    ).us_median
                    / n_pl
                )
                res[f"kernel only pw{pw} {cvt} S{splits}"] = tk
                print(
                    f"{case.name} few pw{pw} {cvt} S{splits}: {t:.1f} us, kernel alone {tk:.1f} (vs current {err:.1e})"
                )
        res["fp8mla fp8 (current)"] = time_graph(ref_fn, reps=30).us_median
        res["fp8mla bf16 pool"] = time_graph(fp8mla_runner(inp, bf16_pool), reps=30).us_median
        for name, dt, p in (("flashinfer fp8", torch.float8_e4m3fn, pool),
                            ("flashinfer bf16", torch.bfloat16, bf16_pool)):  # fmt: skip
            try:
                res[name] = time_graph(flashinfer_runner(inp, dt, p), reps=30).us_median
            except Exception as exc:  # noqa: BLE001
                print(f"{name}: unavailable ({type(exc).__name__}: {str(exc)[:120]})")
        rows_out.append(res)
        print(json.dumps(res))
    return rows_out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--skip-check", action="store_true")
    args = ap.parse_args()
    print(torch.cuda.get_device_name(), torch.__version__)
    variants = [(4, "ptx"), (4, "int")]
    t0 = time.time()
    ok = True if args.skip_check else correctness(variants)
    print(f"correctness {'PASSED' if ok else 'FAILED'} ({time.time() - t0:.0f} s)")
    rows = timing(variants, [])
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    print("\ncase | floor | best few-row | current fp8 | fp8mla bf16 | FI fp8 | FI bf16")
    for r in rows:
        few = {k: v for k, v in r.items() if k.startswith("few")}
        best = min(few, key=few.get)
        g = lambda k: f"{r[k]:.1f}" if k in r else "-"
        print(f"{r['case']} | {r['floor_us']:.1f} | {few[best]:.1f} ({best[4:]}) | "
              f"{g('fp8mla fp8 (current)')} | {g('fp8mla bf16 pool')} | {g('flashinfer fp8')} | "
              f"{g('flashinfer bf16')}")  # fmt: skip
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
