"""The FP8-query builds the compile matrix adds (``compile_matrix.fp8_query_jobs``).

- The portable kernels (``rows``, ``vsplit``) in their FP8-query build (``Q_FP8``: e4m3 × e4m3
  dots where the target has FP8 tensor cores and the pool is e4m3, the codes decoded to fp16
  elsewhere: ``attention.query.fp8_query_mode``), per-row query scales, writing split partials,
  in every tile the target's tables give them (on SM90 the Triton fallback's tiles, which
  ``kernel_config="rows"`` selects there), for e4m3 (also with per-token-group scales), e5m2
  and bf16 pools.
- The Gluon kernels' FP8-query builds that run on request (``Variant.fp8_queries_on_request``:
  ``pingpong8``), e4m3 and e5m2 pools (also with per-token-group scales), per-row query scales,
  writing split partials or the bf16 output.
- The fused query pass (``kernels/portable/q_quant.py``): e4m3 queries with a per-row scale
  to bf16 (the converted route), bf16 queries to e4m3 codes and row scales (``quantize_q``),
  and bf16 queries rounded through e4m3 to bf16 (``quantize_q`` on the converted route).
"""

from __future__ import annotations

import torch

from fp8mla.attention.targets import Target
from fp8mla.tools.kernel_builds import SCALE_ARR_STRIDES, TORCH_TO_TRITON, Build

Q_QUANT = "fp8mla.kernels.portable.q_quant:q_quant_kernel"
KV_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2, torch.bfloat16)
SHORT = {torch.float8_e4m3fn: "e4m3", torch.float8_e5m2: "e5m2", torch.bfloat16: "bf16"}


def attention_builds(target: Target) -> list[tuple[str, Build, str]]:
    """``(label, build, tile)`` of each FP8-query attention build for ``target``."""
    from fp8mla.attention.launch import fp8_conversion
    from fp8mla.attention.planner import SELECTION_ROWS, tile_for_variant
    from fp8mla.attention.query import QF8_DOT, fp8_query_mode
    from fp8mla.attention.variants import REGISTRY, tile_name

    out = []
    for kv in KV_DTYPES:
        configs = []
        for v in REGISTRY.values():
            for rows in SELECTION_ROWS if v.fp8_queries else ():
                try:
                    configs.append(tile_for_variant(v.name, rows, kv, target))
                except ValueError:  # no tile of this variant in the target's tables
                    break
        for cfg in dict.fromkeys(configs):
            mode = fp8_query_mode(target, kv, cfg)
            cvt = fp8_conversion(kv, torch.device("cuda"), False, cfg.fp8_cvt, target)
            kv_ptr = "u8" if cvt else TORCH_TO_TRITON[str(kv).split(".")[-1]]
            dot = "tl.bfloat16" if kv == torch.bfloat16 else "tl.float16"
            for group in (False, True) if kv.itemsize == 1 else (False,):
                ptrs, consts = _arguments(cfg, kv_ptr, "fp32", True, group, dot, cvt, mode)
                consts.update(ROUND_INT=False, P_PARTS=2)
                # uncapped, as the launcher runs them (at the two-program cap of 128
                # registers the 16-row e4m3 build spilled ~900 B on SM90/SM100)
                build = Build(
                    REGISTRY[cfg.variant].kernel, tuple(ptrs.items()), tuple(consts.items()),
                    cfg.num_warps, cfg.num_stages, None,
                    unaligned=SCALE_ARR_STRIDES if group else (),
                )  # fmt: skip
                tile = tile_name(cfg)
                how = "e4m3-dot" if mode == QF8_DOT and not group else "decoded"
                label = f"{SHORT[kv]} {tile} w{cfg.num_warps}s{cfg.num_stages} "
                label += f"{'split+group' if group else 'split'} fp8q-{how}"
                out.append((label, build, tile))
    return out + on_request_builds(target)


def _arguments(cfg, kv_ptr: str, o_ptr: str, write_lse: bool, group: bool, dot: str, cvt: int,
               mode: int) -> tuple[dict, dict]:  # fmt: skip
    """The pointer types and constexprs of an FP8-query attention build (the codes as bytes,
    per-row query scales; page size 1, no causal mask, per-tensor KV scales)."""
    from fp8mla.attention.query import QS_ROWS

    ptrs = dict(
        q_nope_ptr="u8", q_pe_ptr="u8", ckv_ptr=kv_ptr, kpe_ptr=kv_ptr,
        scale_arr_ptr="fp32" if group else kv_ptr, ckv_scale_ptr=kv_ptr, kpe_scale_ptr=kv_ptr,
        qo_indptr_ptr="i32", kv_indptr_ptr="i32", kv_indices_ptr="i32", kv_len_ptr="i32",
        o_ptr=o_ptr, lse_ptr="fp32" if write_lse else o_ptr, q_scale_ptr="fp32",
    )  # fmt: skip
    consts = dict(
        PAGE_SIZE=1, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, D_CKV=512, D_KPE=64,
        CAUSAL=False, TOKEN_GROUP=group, CKV_SCALE_PTR=False, KPE_SCALE_PTR=False,
        DOT_DTYPE=dot, WRITE_LSE=write_lse, FP8_CVT=cvt, Q_FP8=mode, Q_SCALE=QS_ROWS,
    )  # fmt: skip
    return ptrs, consts


def on_request_builds(target: Target) -> list[tuple[str, Build, str]]:
    """``(label, build, tile)`` of the FP8-query builds of the kernels that run them on
    request (``Variant.fp8_queries_on_request``), in their tiles for 16, 32 and 128 query rows
    (and a kernel compiled apart for row tiles also in that build)."""
    from fp8mla.attention.planner import tile_for_variant
    from fp8mla.attention.variants import REGISTRY

    out = []
    for v in REGISTRY.values():
        for kv in KV_DTYPES[:2] if v.fp8_queries_on_request else ():
            if v.supports(target, kv, 128, 64) is not None:
                continue
            configs = dict.fromkeys(tile_for_variant(v.name, n, kv, target) for n in (16, 32, 128))
            for cfg in configs:
                out += _on_request(v, cfg, kv, target)
    return out


def _on_request(v, cfg, kv: torch.dtype, target: Target) -> list[tuple[str, Build, str]]:
    """The builds of one tile of an on-request FP8-query kernel (``on_request_builds``)."""
    from fp8mla.attention.kernel_launcher import declared_options
    from fp8mla.attention.launch import fp8_conversion
    from fp8mla.attention.query import QF8_DOT
    from fp8mla.attention.variants import tile_name

    out = []
    cvt = fp8_conversion(kv, torch.device("cuda"), False, cfg.fp8_cvt, target)
    tile = tile_name(cfg)
    part = "fp16" if v.half_partials else "fp32"  # the split partials' dtype
    declared = declared_options(v.load())
    outputs = [(part, True, False, "split"), ("bf16", False, False, "direct"),
               (part, True, True, "split+group")]  # fmt: skip
    if "ROW_TILES" in declared:
        outputs.append((part, True, False, "split+rowtiles"))
    if "PV_FP8" in declared:  # its FP8 value products, on request
        outputs.append((part, True, False, "split+pv8"))
    for o_ptr, write_lse, group, how in outputs:  # the FP8 bytes as u8, as the launcher passes them
        ptrs, consts = _arguments(cfg, "u8", o_ptr, write_lse, group, "tl.float16", cvt, QF8_DOT)
        consts.update(v.fp8_query_options)
        if how.endswith("pv8"):
            consts["PV_FP8"] = 1
        if v.launches_dependents and target.dependent_launch:
            consts["WAIT_PRIOR"] = True
        if v.half_partials and write_lse:  # fp16 partials and their factor
            ptrs["mult_ptr"] = "fp32"
            consts["HALF_PARTIALS"] = True
        if "ROW_TILES" in declared:
            consts["ROW_TILES"] = how.endswith("rowtiles")
        build = Build(v.kernel, tuple(ptrs.items()), tuple(consts.items()),
                      cfg.num_warps, None, None, passed=("stride_qs_t", "q_scale_val"),
                      unaligned=SCALE_ARR_STRIDES if group else ())  # fmt: skip
        out.append((f"{SHORT[kv]} {tile} w{cfg.num_warps} {how} fp8q", build, tile))
    return out


def q_quant_builds(target: Target) -> list[tuple[str, Build]]:
    """``(label, build)`` of each build of the fused query pass."""
    from fp8mla.attention.query import PREP_ROWS, QS_ROWS, QS_TENSOR

    out = []
    for label, q_ptr, in_fp8, scale, quant, out_fp8 in (
        ("e4m3 row scales to bf16", "u8", True, QS_ROWS, False, False),
        ("e4m3 device scale to bf16", "u8", True, QS_TENSOR, False, False),
        ("bf16 quantized to e4m3", "bf16", False, 0, True, True),
        ("bf16 rounded through e4m3 to bf16", "bf16", False, 0, True, False),
    ):
        o_ptr = "u8" if out_fp8 else "i16"
        ptrs = dict(q_nope_ptr=q_ptr, q_pe_ptr=q_ptr, scale_ptr="fp32", out_nope_ptr=o_ptr,
                    out_pe_ptr=o_ptr, out_scale_ptr="fp32")  # fmt: skip
        consts = dict(D_CKV=512, D_KPE=64, ROWS=PREP_ROWS, IN_FP8=in_fp8, SCALE=scale,
                      QUANT=quant, OUT_FP8=out_fp8)  # fmt: skip
        build = Build(Q_QUANT, tuple(ptrs.items()), tuple(consts.items()), 4, None)
        out.append((label, build))
    return out
