"""Speculative-decode tiles (8 requests x 4 tokens x 16 heads over 8,192 FP8 tokens) beside the
one-token decode of the same batch: value-split 64-row tiles over block sizes, stages and
split counts, timed as CUDA-graph replays. Writes ``$OUT/sweep_spec.json``.

    PYTHONPATH=src python benchmarks/sweep_spec.py
"""

import json
import os
import time

import torch
import triton

from fp8mla.bench.measure import time_graph
from fp8mla.ops.planner import KernelConfig
from fp8mla.testing import make_batch, rel_err
from fp8mla.wrapper import BatchMLAPagedAttentionWrapper

SM_SCALE = 1 / 192**0.5


def runner(b, cfg, splits, causal):
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
        num_splits=splits,
        kernel_config=cfg,
    )
    out = torch.empty_like(b.q_nope)
    return lambda: w.run(
        b.q_nope, b.q_pe, b.ckv, b.kpe, out=out, ckv_scale=b.ckv_scale, kpe_scale=b.kpe_scale
    )


def main():
    rows = []
    g = torch.Generator().manual_seed(0)
    spec = make_batch([8192] * 8, 16, qo_lens=4, page_size=1, device="cuda", generator=g)
    dec = make_batch([8192] * 8, 16, qo_lens=1, page_size=1, device="cuda", generator=g)
    ref = runner(spec, None, None, True)().clone()
    t_dec = time_graph(runner(dec, None, None, False), reps=20).us_median
    rows.append(dict(case="decode", cfg="default", us=t_dec))
    t = time_graph(runner(spec, None, None, True), reps=20).us_median
    rows.append(dict(case="spec", cfg="default", us=t))
    for bn in (16, 32):
        for stages in (2, 3, 4):
            for splits in (12, 16, 24, 32):
                cfg = KernelConfig(64, bn, 4, stages, value_split=True)
                try:
                    run = runner(spec, cfg, splits, True)
                    err = rel_err(run(), ref)
                    t = time_graph(run, reps=20).us_median
                    rows.append(
                        dict(
                            case="spec", cfg=f"v64x{bn} w4 s{stages}", splits=splits, us=t, err=err
                        )
                    )
                except Exception as ex:  # out of shared memory and the like
                    rows.append(
                        dict(
                            case="spec",
                            cfg=f"v64x{bn} w4 s{stages}",
                            splits=splits,
                            error=str(ex)[-120:],
                        )
                    )
                print(json.dumps(rows[-1]), flush=True)
    for bm, bn, w, s in ((64, 64, 8, 1), (32, 64, 8, 1), (32, 32, 4, 2), (16, 64, 8, 1)):
        for splits in (8, 16, 32):
            cfg = KernelConfig(bm, bn, w, s)
            run = runner(spec, cfg, splits, True)
            err = rel_err(run(), ref)
            t = time_graph(run, reps=20).us_median
            rows.append(
                dict(case="spec", cfg=f"rows{bm}x{bn} w{w} s{s}", splits=splits, us=t, err=err)
            )
            print(json.dumps(rows[-1]), flush=True)
    out = os.environ.get("OUT", "/tmp")
    with open(os.path.join(out, "sweep_spec.json"), "w") as f:
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
    best = sorted((r for r in rows if r["case"] == "spec" and "us" in r), key=lambda r: r["us"])[:8]
    print(f"one-token decode {t_dec:.1f} us; best speculative tiles:")
    for r in best:
        print(
            f"  {r['cfg']:18} splits {r.get('splits', '-'):>3}  {r['us']:7.1f} us  {r['us'] / t_dec:.2f}x  err {r.get('err', 0):.1e}"
        )


if __name__ == "__main__":
    main()
