"""The compile matrix's builds of the kernels around the attention: the split merge, the KV
writer of ``MLAKVCache``, the FP8 → fp16 staging of long extend batches and the packed
``fp8_ds_mla`` writer, each as ``(label, build)`` in the configurations their launchers use
(``compile_matrix`` makes them rows of the matrix)."""

from __future__ import annotations

import torch

from fp8mla.attention.targets import Target
from fp8mla.tools.kernel_builds import TORCH_TO_TRITON, Build

KV_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2, torch.bfloat16, torch.float16)
SHORT = {
    torch.float8_e4m3fn: "e4m3",
    torch.float8_e5m2: "e5m2",
    torch.bfloat16: "bf16",
    torch.float16: "fp16",
}
CVT_NAMES = {
    0: "native",
    1: "ptx",
    2: "ptx",
    3: "int-ptx",
    4: "int-ptx",
    5: "int-triton",
    6: "int-triton",
}
MERGE = "fp8mla.kernels.portable.merge:mla_merge_kernel"
KV_WRITE = "fp8mla.kernels.portable.kv_write:kv_write_kernel"
KV_STAGE = "fp8mla.kernels.portable.kv_stage:kv_stage_kernel"
DS_MLA_PACK = "fp8mla.kernels.portable.ds_mla_pack:ds_mla_pack_kernel"


def merge_builds(target: Target) -> list[tuple[str, Build]]:
    """The split merge as the launcher runs it: fp32 partials (and, where a kernel of the
    target writes them, fp16 partials with their factors, in the planner's warps) into a
    bf16 output, in each column block the planner picks (``planner.merge_block_d``) reading
    the most splits per pass it allows (``planner.merge_block_s``); where a kernel of the
    target launches it as a programmatic dependent, also the build that waits for that kernel
    (and lets the next attention grid launch from its start)."""
    from fp8mla.attention.planner import MAX_SPLITS, merge_block_s, merge_warps
    from fp8mla.attention.variants import REGISTRY

    fp8_few = [
        v for v in REGISTRY.values() if v.supports(target, torch.float8_e4m3fn, 32, 64) is None
    ]
    waits = target.dependent_launch and any(v.launches_dependents for v in fp8_few)
    halves = [False] + ([True] if any(v.half_partials for v in fp8_few) else [])
    out = []
    for half in halves:
        ptrs = dict(mid_o_ptr="fp16" if half else "fp32", mid_lse_ptr="fp32", o_ptr="bf16",
                    lse_ptr="fp32", qo_indptr_ptr="i32")  # fmt: skip
        if half:
            ptrs["mid_mult_ptr"] = "fp32"
        for block_d in (128, 256, 512):
            for write_lse, wait in ((True, False), (False, False), (True, True)):
                if wait and not waits:
                    continue
                warps = merge_warps(block_d, half)
                block_s = merge_block_s(MAX_SPLITS, block_d, warps, half)  # most a pass reads
                consts = (("D", 512), ("BLOCK_D", block_d), ("BLOCK_S", block_s),
                          ("WRITE_LSE", write_lse))  # fmt: skip
                consts += (("WAIT_PRIOR", wait), ("LAUNCH_NEXT", wait))
                build = Build(MERGE, tuple(ptrs.items()), consts, warps)
                variant = f"{block_d} cols, bf16 out" + (" + LSE" if write_lse else "")
                variant += ", fp16 partials" if half else ""
                variant += ", waits for the attention" if wait else ""
                out.append((variant, build))
    return out


def kv_write_builds(target: Target) -> list[tuple[str, Build]]:
    """The fused KV write for every storage dtype and scale mode of ``MLAKVCache``."""
    from fp8mla.cache.kv_write import FP8_FIELDS, STORE_KIND
    from fp8mla.formats import FP8_MAX, SCALE_GROUP

    out = []
    for kv in KV_DTYPES:
        kind, view = STORE_KIND[kv]
        mbits, emin, bias = FP8_FIELDS.get(kv, (0, 0, 0))
        for token_group in (False, True) if kv.itemsize == 1 else (False,):
            ptrs = dict(
                ckv_ptr="bf16",
                kpe_ptr="bf16",
                slot_ptr="i64",
                cache_ptr=TORCH_TO_TRITON[str(view).split(".")[-1]],
                scale_arr_ptr="fp32" if token_group else "bf16",
            )
            consts = dict(
                D_CKV=512,
                D_KPE=64,
                GROUP=SCALE_GROUP,
                FP8_MAX=float(FP8_MAX.get(kv, 0.0)),
                MBITS=mbits,
                EMIN=emin,
                BIAS=bias,
                STORE_KIND=kind,
                TOKEN_GROUP=token_group,
            )
            build = Build(KV_WRITE, tuple(ptrs.items()), tuple(consts.items()), 4, None)
            variant = f"{SHORT[kv]} {'token-group' if token_group else 'tensor'} scale"
            out.append((variant, build))
    return out


def kv_stage_builds(target: Target) -> list[tuple[str, Build]]:
    """The FP8 → fp16 staging of a plan's pages (``attention/stage.py``) for both FP8
    dtypes and scale modes, with the target's FP8 decoding."""
    from fp8mla.attention.launch import fp8_conversion
    from fp8mla.kernels.portable.kv_stage import STAGE_TOKENS

    out = []
    for kv in KV_DTYPES:
        if kv.itemsize != 1:
            continue
        cvt = fp8_conversion(kv, torch.device("cuda"), False, "ptx", target)
        kv_ptr = "u8" if cvt else TORCH_TO_TRITON[str(kv).split(".")[-1]]
        for token_group in (False, True):
            ptrs = dict(
                ckv_ptr=kv_ptr,
                kpe_ptr=kv_ptr,
                scale_arr_ptr="fp32" if token_group else kv_ptr,
                out_ptr="fp16",
                kv_indices_ptr="i32",
            )
            consts = dict(
                PAGE_SIZE=1,
                D_CKV=512,
                D_KPE=64,
                TOKENS=STAGE_TOKENS,
                TOKEN_GROUP=token_group,
                FP8_CVT=cvt,
            )
            build = Build(KV_STAGE, tuple(ptrs.items()), tuple(consts.items()), 4, None)
            scale = "token-group" if token_group else "tensor"
            variant = f"{SHORT[kv]} {scale} scale {CVT_NAMES[cvt]}"
            out.append((variant, build))
    return out


def ds_mla_pack_builds(target: Target) -> list[tuple[str, Build]]:
    """The packed ``fp8_ds_mla`` writer (``fp8mla.pack_ds_mla``) for each row dtype and scale
    format, with the target's e4m3 rounding (the GPU's conversion on CUDA SM89+, the integer
    encoder elsewhere)."""
    from fp8mla.dsa.format import PACK_TOKENS, PACK_WARPS

    native = target.backend == "cuda" and int(target.arch) >= 89
    out = []
    for rows, ptr, kind in (("bf16", "u16", 0), ("fp16", "fp16", 1), ("fp32", "fp32", 2)):
        for pow2 in (False, True):
            ptrs = (("ckv_ptr", ptr), ("kpe_ptr", ptr), ("slot_ptr", "i64"), ("cache_ptr", "u8"))
            consts = (("IN_KIND", kind), ("POW2", pow2), ("NATIVE_CVT", native),
                      ("BLOCK_T", PACK_TOKENS))  # fmt: skip
            build = Build(DS_MLA_PACK, ptrs, consts, PACK_WARPS, None)
            variant = f"{rows} {'pow2' if pow2 else 'arbitrary'} {'native' if native else 'int'}"
            out.append((variant, build))
    return out
