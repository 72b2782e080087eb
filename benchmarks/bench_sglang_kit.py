"""Time one decode step of attention through SGLang's kit: fp8mla beside SGLang's ``triton``,
eagerly and in a CUDA graph.

Both backends run on the same kind of pool (FP8 ``MLATokenToKVPool``, MLA dims) built by
SGLang's attention kit; one layer's ``RadixAttention`` call (``attn_mqa``) is timed between two
CUDA events (median of ``--iters``):

- ``eager``: after ``init_forward_metadata``, host launch cost included;
- ``cuda-graph``: the backend's graph hooks as SGLang's CUDA-graph runner calls them
  (``init_cuda_graph_state``, ``init_forward_metadata_out_graph`` in capture, then again
  before the replays), the call captured once and replayed.

Records: ``fp8mla bench``'s format with section ``engines``, appended to ``<out>/<gpu>.jsonl``: case
``SGLANG_DECODE_B<b>_H<h>_L<ctx>_float8_e4m3fn``, impls ``fp8mla`` / ``sglang-triton``, and on
``sglang-triton``'s records ``max_abs_diff_vs_fp8mla`` (both read the same FP8 bytes).

    python benchmarks/bench_sglang_kit.py --out OUT [--batch 1 8 32] [--ctx 1024 4096]

With ``FP8MLA_ENGINES_PATH`` set (a GPU machine's unpacked carry, benchmarks/
run_engines_on_gpu.sh), SGLang is found there with the tests' set-up: the folder appended to
``sys.path`` and the test stand-ins where the real packages are absent
(``tests/integrations/engines_path.py``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import unittest
from pathlib import Path

import torch

# a failed measurement's record has these as None, and an ``error``
UNMEASURED = ("us_median", "us_p20", "us_p80", "gbps", "tflops", "floor_us", "x_floor")


def _case(kit, mode, backend, b, h, ctx, page):
    return kit.MLAAttentionCase(
        name=f"bench_{backend}_b{b}_h{h}_l{ctx}",
        backend=backend,
        forward_mode=mode,
        num_heads=h,
        page_size=page,
        prefix_lens=(ctx - 1,) * b,
    )


def _events(fn, iters: int) -> list[float]:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return times


def time_backend(kit, mode, backend, b, h, ctx, page, iters, device="cuda"):
    """(output, eager µs samples, CUDA-graph µs samples) of one layer's decode call."""
    from sglang.srt.model_executor.forward_context import ForwardContext, forward_context

    case = _case(kit, mode, backend, b, h, ctx, page)
    fx = kit.build_mla_attention_fixture(
        unittest.TestCase(), case, kv_lora_rank=512, qk_rope_head_dim=64, hidden_size=64,
        max_context_len=ctx + page, dtype=torch.bfloat16, device=device, fp8_kv_cache=True,
        loc_layout="contiguous", disable_cuda_graph=False, runner_batch_size=b,
    )  # fmt: skip
    mod, fb, backend_ = fx.actual_module, fx.forward_batch, fx.backend
    with torch.no_grad(), forward_context(ForwardContext(attn_backend=backend_)):
        q_nope, k_nope, q_rope, k_rope = mod.forward_absorb_prepare(fx.input_hidden)
        mod.write_kv_cache(fb.out_cache_loc, k_nope, k_rope)
        q = torch.cat([q_nope, q_rope], dim=-1).flatten(1, 2)
        call = lambda: mod.attn_mqa(q, None, None, fb, save_kv_cache=False)  # noqa: E731
        backend_.init_forward_metadata(fb)
        out = call().float()
        eager = _events(call, iters)
        # SGLang's CUDA-graph runner: graph state, capture-time metadata, capture (after a
        # warm-up outside it), then the replay's metadata before every replay
        backend_.init_cuda_graph_state(max_bs=b, max_num_tokens=fb.input_ids.numel())
        backend_.init_forward_metadata_out_graph(fb, in_capture=True)
        backend_.init_forward_metadata_in_graph(fb)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            call()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = call()
        backend_.init_forward_metadata_out_graph(fb)
        graph.replay()
        torch.cuda.synchronize()
        diff = (captured.float() - out).abs().max().item()
        if not diff <= 2 * 2**-8 * max(1.0, out.abs().max().item()):  # two bf16 ulps
            raise AssertionError(f"the graph replay differs from the eager call by {diff}")
        replays = _events(graph.replay, iters)
        del graph
    return out, eager, replays


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path, help="folder of <gpu>.jsonl")
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--heads", type=int, nargs="+", default=[16])
    ap.add_argument("--ctx", type=int, nargs="+", default=[1024, 4096])
    ap.add_argument("--page-size", type=int, default=1)
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--run-id", default=None)
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
    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    from sglang.test.kits.attention_unittest.attention_methods import mla_attention as kit

    from fp8mla.bench.cases import Case
    from fp8mla.bench.measure import Timing
    from fp8mla.bench.report import append_jsonl, results_path
    from fp8mla.bench.runner import BenchContext, Environment, record

    device = torch.device("cuda")
    env = Environment.measure(device, args.run_id)
    ctx = BenchContext(env=env, device=device)
    path = results_path(args.out, env.gpu)
    common = dict(section="engines", engine="sglang", engine_version=sglang.__version__, layers=1)
    written = 0
    for h in args.heads:
        for b in args.batch:
            for c in args.ctx:
                case = Case(b, h, c, page_size=args.page_size)
                name = f"SGLANG_DECODE_B{b}_H{h}_L{c}_float8_e4m3fn"
                outs = {}
                for impl, backend in (("fp8mla", "fp8mla"), ("sglang-triton", "triton")):
                    try:
                        out, eager, replays = time_backend(
                            kit, ForwardMode.DECODE, backend, b, h, c, args.page_size,
                            args.iters,
                        )  # fmt: skip
                    except Exception as exc:  # record what fails (e.g. a newer-torch API)
                        row = record(ctx, case, impl, Timing(1.0, 1.0, 1.0), None, **common)
                        row.update({k: None for k in UNMEASURED})
                        row.update(case=name, error=f"{type(exc).__name__}: {exc}"[:400])
                        continue
                    outs[impl] = out
                    for mode, times in (("cuda-graph", replays), ("eager", eager)):
                        q = statistics.quantiles(times, n=5)
                        t = Timing(statistics.median(times), q[0], q[-1])
                        row = record(ctx, case, impl, t, None, **common)
                        row.update(case=name, timing=f"{mode}, one layer's call")
                        if impl == "sglang-triton" and "fp8mla" in outs:
                            d = (outs["fp8mla"] - out).abs().max().item()
                            row["max_abs_diff_vs_fp8mla"] = round(d, 5)
                    torch.cuda.empty_cache()
                append_jsonl(path, ctx.records[written:])  # kept if a time limit stops the run
                for row in ctx.records[written:]:
                    keys = ("impl", "timing", "us_median", "max_abs_diff_vs_fp8mla", "error")
                    print(name, {k: row[k] for k in keys if k in row}, flush=True)
                written = len(ctx.records)
    print(f"appended {written} records of run {env.run} to {path}")


if __name__ == "__main__":
    main()
