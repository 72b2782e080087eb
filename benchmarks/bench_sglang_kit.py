"""Time one decode step of attention through SGLang's kit: fp8mla beside SGLang's ``triton``.

Both backends run on the same kind of pool (FP8 ``MLATokenToKVPool``, MLA dims) built by
SGLang's attention kit; one layer's ``RadixAttention`` call is timed after
``init_forward_metadata`` (CUDA events, median of ``--iters``). Appends JSONL records with
case ``SGLANG_DECODE_B<b>_H<h>_L<l>_float8_e4m3fn`` and impls ``fp8mla`` / ``sglang-triton``.

    python benchmarks/bench_sglang_kit.py --out results.jsonl [--batch 1 8 64] [--ctx 4096]

With ``FP8MLA_ENGINES_PATH`` set (a GPU machine's unpacked carry, benchmarks/
run_engines_on_gpu.sh), SGLang is found there with the tests' set-up: the folder appended to
``sys.path`` and the test stand-ins where the real packages are absent
(``tests/integrations/engines_path.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import unittest
from pathlib import Path

import torch


def _case(kit, mode, backend, b, h, ctx, page):
    return kit.MLAAttentionCase(
        name=f"bench_{backend}_b{b}_h{h}_l{ctx}",
        backend=backend,
        forward_mode=mode,
        num_heads=h,
        page_size=page,
        prefix_lens=(ctx - 1,) * b,
    )


def time_backend(kit, mode, backend, b, h, ctx, page, iters):
    from sglang.srt.model_executor.forward_context import ForwardContext, forward_context

    case = _case(kit, mode, backend, b, h, ctx, page)
    fx = kit.build_mla_attention_fixture(
        unittest.TestCase(), case, kv_lora_rank=512, qk_rope_head_dim=64, hidden_size=64,
        max_context_len=ctx + page, dtype=torch.bfloat16, device="cuda", fp8_kv_cache=True,
        loc_layout="contiguous",
    )  # fmt: skip
    mod, fb = fx.actual_module, fx.forward_batch
    with torch.no_grad(), forward_context(ForwardContext(attn_backend=fx.backend)):
        q_nope, k_nope, q_rope, k_rope = mod.forward_absorb_prepare(fx.input_hidden)
        mod.write_kv_cache(fb.out_cache_loc, k_nope, k_rope)
        q = torch.cat([q_nope, q_rope], dim=-1).flatten(1, 2)
        fx.backend.init_forward_metadata(fb)
        call = lambda: mod.attn_mqa(q, None, None, fb, save_kv_cache=False)  # noqa: E731
        out = call()
        for _ in range(3):
            call()
        torch.cuda.synchronize()
        times = []
        for _ in range(iters):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            call()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end) * 1e3)
    return out.float(), times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--heads", type=int, nargs="+", default=[16])
    ap.add_argument("--ctx", type=int, nargs="+", default=[1024, 4096])
    ap.add_argument("--page-size", type=int, default=1)
    ap.add_argument("--iters", type=int, default=30)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_sglang_kit: needs a CUDA GPU (it times with CUDA events)")
    if os.environ.get("FP8MLA_ENGINES_PATH"):
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
        from integrations.engines_path import use_engines

        use_engines()

    from fp8mla.integrations.sglang import register

    register()
    import sglang
    import triton
    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    from sglang.test.kits.attention_unittest.attention_methods import mla_attention as kit

    base = dict(
        gpu=torch.cuda.get_device_name(), date=time.strftime("%Y-%m-%d"),
        torch=torch.__version__, triton=triton.__version__, sglang=sglang.__version__,
        page_size=args.page_size, kv_dtype="float8_e4m3fn", qo_len=1,
    )  # fmt: skip
    with open(args.out, "a") as f:
        for h in args.heads:
            for b in args.batch:
                for ctx in args.ctx:
                    outs = {}
                    for impl, backend in (("fp8mla", "fp8mla"), ("sglang-triton", "triton")):
                        rec = dict(base, case=f"SGLANG_DECODE_B{b}_H{h}_L{ctx}_float8_e4m3fn",
                                   batch=b, heads=h, context=ctx, impl=impl)  # fmt: skip
                        try:
                            out, t = time_backend(
                                kit, ForwardMode.DECODE, backend, b, h, ctx, args.page_size,
                                args.iters,
                            )  # fmt: skip
                            outs[impl] = out
                            q = statistics.quantiles(t, n=5)
                            rec.update(us_median=round(statistics.median(t), 2),
                                       us_p20=round(q[0], 2), us_p80=round(q[-1], 2))  # fmt: skip
                        except Exception as exc:  # record what fails (e.g. a newer-torch API)
                            rec.update(error=f"{type(exc).__name__}: {exc}"[:400])
                        if impl == "sglang-triton" and len(outs) == 2:
                            d = (outs["fp8mla"] - outs["sglang-triton"]).abs().max().item()
                            rec["max_abs_diff_vs_fp8mla"] = round(d, 5)
                        print(json.dumps(rec), flush=True)
                        f.write(json.dumps(rec) + "\n")
                        f.flush()  # kept if a time limit stops the run
                        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
