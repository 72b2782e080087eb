"""Why fewrows fails the back-to-back test: per layer error with and without the
programmatic-dependent launch, per head half and column half."""

import dataclasses, sys, torch

sys.path[:0] = ["tests", "tests/attention"]
import fp8mla.attention.wrapper as WR
from fp8mla import BatchMLAPagedAttentionWrapper
from fp8mla.testing import make_batch
from attention_utils import workspace, SM_SCALE, reference

orig = WR.make_launch_plan


def run(waits, kernel, num_splits):
    WR.make_launch_plan = lambda *a, **k: (
        dataclasses.replace(orig(*a, **k), attention_waits=waits) if not waits else orig(*a, **k)
    )
    gen = torch.Generator().manual_seed(31)
    base = make_batch([4096, 1000, 3001, 17], 32, page_size=1, device="cuda", generator=gen)
    g = torch.Generator(device="cuda").manual_seed(32)
    layers = []
    for _ in range(3):
        raw = torch.randn(base.pool.shape, generator=g, device="cuda")
        pool = torch.where(base.pool.float().isnan(), float("nan"), raw).to(base.pool.dtype)
        rows = pool.view(-1, base.page_size, 576)
        layers.append(
            dataclasses.replace(
                base,
                pool=pool,
                ckv=rows[..., :512],
                kpe=rows[..., 512:],
                q_nope=torch.randn(base.q_nope.shape, generator=g, device="cuda").to(
                    torch.bfloat16
                ),
                q_pe=torch.randn(base.q_pe.shape, generator=g, device="cuda").to(torch.bfloat16),
            )
        )
    layers.insert(0, base)
    w = BatchMLAPagedAttentionWrapper(workspace("cuda"), backend="triton")
    w.plan(
        *base.plan_args(),
        32,
        512,
        64,
        1,
        False,
        SM_SCALE,
        torch.bfloat16,
        base.ckv.dtype,
        num_splits=num_splits,
        kernel_config=kernel,
    )
    print(
        kernel,
        num_splits,
        "waits",
        w._launch.plan.attention_waits,
        w._launch.plan.config,
        flush=True,
    )
    for rep in range(2):
        for i, b in enumerate(layers):
            o = w.run(b.q_nope, b.q_pe, b.ckv, b.kpe, **b.scale_kwargs())
            torch.cuda.synchronize()
            ref, _ = reference(b)
            ref = ref.to(o.device).float()
            of = o.float()
            e = lambda sl: ((of[sl] - ref[sl]).norm() / ref[sl].norm()).item()
            print(
                f"  rep {rep} layer {i}: all {e((...)):.3e} heads<16 {e((slice(None), slice(0, 16))):.3e} heads>=16 {e((slice(None), slice(16, 32))):.3e} cols<256 {e((..., slice(0, 256))):.3e} cols>=256 {e((..., slice(256, 512))):.3e} finite {torch.isfinite(o).all().item()}",
                flush=True,
            )


for waits in (True, False):
    run(waits, "fewrows", 1)
