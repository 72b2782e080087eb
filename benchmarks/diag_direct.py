import torch, math
from fp8mla import BatchMLAPagedAttentionWrapper
from fp8mla.attention import launch as L
from fp8mla.testing import make_batch
b = make_batch([5, 700, 64], 16, page_size=1, device="cuda", generator=torch.Generator().manual_seed(0))
w = BatchMLAPagedAttentionWrapper(torch.empty(64<<20, dtype=torch.uint8, device="cuda"), backend="triton")
w.plan(*b.plan_args(), 16, 512, 64, 1, False, 1/math.sqrt(192), torch.bfloat16, b.ckv.dtype)
orig = L.KernelLauncher.launch
def spy(self, args, key):
    print("key", key, "direct_ok", self._direct_ok(), "cached", list(self._compiled)[:2], "knobs", L._knobs, getattr(getattr(L._knobs, "runtime", None), "launch_enter_hook", "MISSING"))
    return orig(self, args, key)
L.KernelLauncher.launch = spy
for _ in range(2): w.run(b.q_nope, b.q_pe, b.ckv, b.kpe, **b.scale_kwargs())
l = w._launch
print("interp", l.interpreted, "split", l.split, "direct", l.kernel.direct_launches)
