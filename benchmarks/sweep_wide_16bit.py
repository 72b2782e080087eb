"""Tiles for many query rows over a 16-bit (bf16) KV pool: the 64-row tile beside value-split
tiles, on the extend chunks and 128-head decode, each checked against the float64 reference
on a ragged 128-head batch (NaN in unused slots, page sizes 1 and 64). Writes
``$OUT/sweep_wide_16bit.json``.

    PYTHONPATH=src python benchmarks/sweep_wide_16bit.py
"""

import json
import os
import time

import torch
import triton

from fp8mla.bench.measure import time_cuda
from fp8mla.ops.planner import KernelConfig
from fp8mla.reference import mla_reference
from fp8mla.testing import make_batch, rel_err
from fp8mla.wrapper import BatchMLAPagedAttentionWrapper

SM_SCALE = 1 / 192**0.5
CONFIGS = {
    "rows 64x64 w8 s1": KernelConfig(64, 64, 8, 1),
    "vsplit 128x32 w8 s2": KernelConfig(128, 32, 8, 2, value_split=True),
    "vsplit 128x32 w8 s1": KernelConfig(128, 32, 8, 1, value_split=True),
    "vsplit 128x64 w8 s1": KernelConfig(128, 64, 8, 1, value_split=True),
    "vsplit 64x32 w4 s3": KernelConfig(64, 32, 4, 3, value_split=True),
}


def runner(b, cfg, causal):
    ws = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    w = BatchMLAPagedAttentionWrapper(ws, backend="triton")
    w.plan(
        *b.plan_args(),
        b.num_heads,
        512,
        64,
        b.page_size,
        causal,
        SM_SCALE,
        torch.bfloat16,
        b.ckv.dtype,
        kernel_config=cfg,
    )
    out = torch.empty_like(b.q_nope)
    return lambda: w.run(b.q_nope, b.q_pe, b.ckv, b.kpe, out=out)


def main():
    rows = []
    g = torch.Generator().manual_seed(0)
    for ps in (1, 64):
        lens = torch.randint(0, 1025, (37,), generator=g).tolist()
        b = make_batch(
            lens,
            128,
            qo_lens=[0 if n == 0 else 1 if n < 300 else 40 for n in lens],
            page_size=ps,
            kv_dtype=torch.bfloat16,
            device="cuda",
            generator=g,
        )
        ref, _ = mla_reference(
            b.q_nope, b.q_pe, b.ckv, b.kpe, *b.plan_args(), sm_scale=SM_SCALE, causal=True
        )
        for name, cfg in CONFIGS.items():
            err = rel_err(runner(b, cfg, True)(), ref)
            rows.append(dict(case=f"check_p{ps}", cfg=name, err=err))
            print(json.dumps(rows[-1]), flush=True)
    cases = [
        ("E4096_P32768_H128", [36864], 128, 4096, True),
        ("E4096_P32768_H32", [36864], 32, 4096, True),
        ("B64_H128_L4096", [4096] * 64, 128, 1, False),
    ]
    for cname, kvl, heads, qo, causal in cases:
        b = make_batch(kvl, heads, qo_lens=qo, kv_dtype=torch.bfloat16, device="cuda", generator=g)
        pairs = sum(sum(k - qo + 1 + i for i in range(qo)) for k in kvl) * heads
        base = None
        for name, cfg in CONFIGS.items():
            run = runner(b, cfg, causal)
            o = run().clone()
            base = o if base is None else base
            t = time_cuda(run, warmup_ms=50, rep_ms=300).us_median
            rows.append(
                dict(
                    case=cname,
                    cfg=name,
                    us=t,
                    tflops=2 * pairs * 1088 / t / 1e6,
                    err_vs_rows=rel_err(o, base),
                )
            )
            print(json.dumps(rows[-1]), flush=True)
    out = os.environ.get("OUT", "/tmp")
    with open(os.path.join(out, "sweep_wide_16bit.json"), "w") as f:
        json.dump(
            dict(
                rows=rows,
                torch=torch.__version__,
                triton=triton.__version__,
                gpu=torch.cuda.get_device_name(0),
                date=time.strftime("%Y-%m-%d"),
            ),
            f,
            indent=1,
        )
    for r in rows:
        if "us" in r:
            print(f"{r['case']:20} {r['cfg']:22} {r['us']:10.1f} us {r['tflops']:7.1f} TFLOP/s")
        else:
            print(f"{r['case']:20} {r['cfg']:22} err {r['err']:.2e}")


if __name__ == "__main__":
    main()
