"""The sparse MLA kernels as the compile matrix builds them: every tile a target's table can
choose (``sparse_plan.SPARSE_TABLES``), for the packed cache (with its FP8 decoding there) and a
bf16 cache, writing split partials and the output directly, and the split merge; the index
lists' compaction; on SM90 the FP8 × FP8 decode kernel and the FP8 and 16-bit ping-pong kernels
in their 16-bit RoPE mode over the packed cache (``sparse_sm90.py``), split and in row tiles.

``sparse_builds(target)`` returns ``(label, Build, tile)`` triples (``tile``: the spill limits'
key) for
``fp8mla.tools.kernel_builds.measure``; nothing here compiles. Representative constexprs:
page size 64 (vLLM's and FlashMLA's pages) in the partials build, contiguous pages (page size 1
addressing: SGLang's pool) in the direct one, 16-byte stride units, bf16 queries.
"""

from __future__ import annotations

import dataclasses

import torch

from fp8mla.attention.targets import Target
from fp8mla.dsa.sparse_plan import MAX_SPLITS, MAX_TOPK, merge_blocks, sparse_table
from fp8mla.dsa.sparse_sm90 import compact_shape, fp8qk_options, sparse_options
from fp8mla.tools.kernel_builds import SCALE_ARR_STRIDES, Build

KERNEL = "fp8mla.kernels.portable.sparse_mla:sparse_mla_kernel"
COMPACT = "fp8mla.kernels.portable.sparse_compact:sparse_compact_kernel"
MERGE = "fp8mla.kernels.portable.sparse_mla:sparse_mla_merge_kernel"
GATHER = "fp8mla.kernels.portable.sparse_gather"


def _attention_build(tile, packed: bool, split: bool, cvt: int, target: Target) -> Build:
    kv = "u8" if packed else "bf16"
    ptrs = dict(
        q_nope_ptr="bf16",
        q_pe_ptr="bf16",
        kv_ptr=kv,
        scale_ptr="fp32" if packed else kv,
        rope_ptr="bf16",
        indices_ptr="i32",
        topk_length_ptr="i32",
        o_ptr="fp32" if split else "bf16",
        lse_ptr="fp32",
    )
    consts = dict(
        PAGE_SIZE=64 if split else 1,
        UNIT=16,
        BLOCK_H=tile.block_h,
        BLOCK_N=tile.block_n,
        VALUE_SPLIT=tile.value_split,
        PACKED=packed,
        HAS_TOPK_LENGTH=split,
        SPLIT=split,
        WRITE_LSE=True,
        DOT_DTYPE="tl.float16" if packed else "tl.bfloat16",
        ROPE_DTYPE="tl.bfloat16",
        FP8_CVT=cvt,
        DECODE_SCALE=256.0 if cvt in (3, 5) else 1.0,
    )
    cap = tile.max_registers(target.warp_size) if target.backend == "cuda" else None
    return Build(KERNEL, tuple(ptrs.items()), tuple(consts.items()), tile.num_warps,
                 tile.num_stages, cap)  # fmt: skip


def sm90_rope16_builds(target: Target) -> list[tuple[str, Build, str]]:
    """The SM90 Gluon kernels as the sparse path launches them, ``(label, Build, tile)``: the
    dense matrix's e4m3 builds with the scales as float32 token-group scales and the RoPE
    part in bf16 -- the FP8 × FP8 kernel's token-group and row-tile builds over compacted lists
    and over the index lists as they are (``SPARSE_LISTS``, page size 1), and the FP8 ping-pong
    kernel's split and direct builds (page size 1, compacted lists; named by a plan)."""
    from fp8mla.dsa.sparse_plan import sm90_kernel
    from fp8mla.tools.compile_matrix import attention_jobs

    if sm90_kernel("auto", target, 32, torch.bfloat16, torch.uint8, interpreted=False) is None:
        return []
    out = []
    for job in attention_jobs(target):
        v = job.variant
        if not v.startswith("e4m3"):
            continue
        consts = dict(job.build.constexprs, TOKEN_GROUP=True)
        waits = bool(consts.get("WAIT_PRIOR"))
        if job.build.kernel.endswith(":mla_fp8qk_kernel") and ("group" in v or "rowtiles" in v):
            for lists in (False, True):
                opts = dict(consts, **fp8qk_options(waits, lists))
                if lists:
                    opts["PAGE_SIZE"] = 1
                label = f"packed {v.split(' ', 1)[1]} rope16{' lists' if lists else ''}"
                out.append((label, _packed_scales(job.build, opts), "rope16"))
                if lists and "split+group" in v:  # and with the merge in the grid
                    for mode, name in ((1, "merge-in-grid"), (2, "merge-in-grid+helpers")):
                        out.append((f"{label} {name}", _merge_in_grid(
                            _packed_scales(job.build, opts), mode), "rope16"))  # fmt: skip
        elif job.build.kernel.endswith(":mla_pingpong8_kernel") and (
            "split+group" in v or "direct" in v
        ):
            opts = dict(consts, PAGE_SIZE=1, **sparse_options("pingpong8", waits))
            label = v.split(" ", 1)[1].replace("direct", "direct+group")
            out.append((f"packed {label} rope16", _packed_scales(job.build, opts),
                        "pingpong8-rope16"))  # fmt: skip
    out += _pingpong16_builds(target)
    return out


def _pingpong16_builds(target: Target) -> list[tuple[str, Build, str]]:
    """The 16-bit ping-pong kernel's sparse builds (split and direct, page size 1): the dense
    matrix's bf16 32-token builds over the packed rows -- e4m3 bytes converted to fp16 by the
    producer times their token-group scales, the RoPE part bf16 (``ROPE_16BIT``)."""
    from fp8mla.attention.launch import fp8_conversion
    from fp8mla.attention.planner import PINGPONG_TILE
    from fp8mla.tools.compile_matrix import attention_jobs

    # the decoding the launch takes for this kernel's tile
    cvt = fp8_conversion(
        torch.float8_e4m3fn, torch.device("cuda"), False, PINGPONG_TILE.fp8_cvt, target
    )
    out = []
    for job in attention_jobs(target):
        v = job.variant
        if not (v.startswith("bf16") and job.build.kernel.endswith(":mla_pingpong_kernel")):
            continue
        consts = dict(job.build.constexprs)
        if consts["BLOCK_N"] != 32:
            continue
        consts.update(PAGE_SIZE=1, TOKEN_GROUP=True, DOT_DTYPE="tl.float16", FP8_CVT=cvt,
                      **sparse_options("pingpong", False))  # fmt: skip
        ptrs = dict(job.build.pointers, ckv_ptr="u8", kpe_ptr="u8", ckv_scale_ptr="u8",
                    kpe_scale_ptr="u8")  # fmt: skip
        build = dataclasses.replace(job.build, pointers=tuple(ptrs.items()))
        label = v.split(" ", 1)[1].rsplit(" ", 1)[0] + "+group"
        out.append((f"packed {label} rope16", _packed_scales(build, consts), "pingpong-rope16"))
    return out


def _merge_in_grid(build: Build, mode: int) -> Build:
    """``build`` merging its splits in the grid (``MERGE_IN_GRID`` = ``mode``: 2 with the
    merging programs): the output, its LSE and the requests' barrier words as arguments."""
    ptrs = dict(build.pointers, out_ptr="bf16", out_lse_ptr="fp32", sync_ptr="i64")
    consts = dict(build.constexprs, MERGE_IN_GRID=mode, WRITE_OUT_LSE=True)
    return dataclasses.replace(
        build, pointers=tuple(ptrs.items()), constexprs=tuple(consts.items()),
        passed=build.passed + ("stride_out_t", "stride_out_h", "stride_out_lse_t"),
    )  # fmt: skip


def _packed_scales(build: Build, consts: dict) -> Build:
    """``build`` with ``consts`` and the packed rows' float32 scales (a row stride of 164
    floats, which Triton does not specialize as a multiple of 16)."""
    ptrs = dict(build.pointers, scale_arr_ptr="fp32")
    return Build(build.kernel, tuple(ptrs.items()), tuple(consts.items()), build.num_warps,
                 build.num_stages, build.maxnreg, unaligned=SCALE_ARR_STRIDES)  # fmt: skip


def sparse_builds(target: Target) -> list[tuple[str, Build, str]]:
    """``(label, Build, tile)`` of every sparse kernel build of ``target``."""
    from fp8mla.attention.launch import fp8_conversion

    choice = sparse_table(target).fp8_cvt  # the decoding the launch takes for "auto"
    cvt = fp8_conversion(torch.float8_e4m3fn, torch.device("cuda"), False, choice, target)
    builds = []
    for tile in sparse_table(target).tiles():
        for packed in (True, False):
            for split in (True, False):
                label = (
                    f"{'packed' if packed else 'bf16'} {tile.name} "
                    f"{'split+page64' if split else 'direct'}"
                )
                builds.append(
                    (
                        label,
                        _attention_build(tile, packed, split, cvt, target),
                        tile.name.split(" ")[0],
                    )
                )
    for splits in (2, 8, MAX_SPLITS):
        for rows in (32, 4096):
            block_d, block_s = merge_blocks(rows, splits, 132)
            ptrs = (("part_o_ptr", "fp32"), ("part_lse_ptr", "fp32"), ("o_ptr", "bf16"),
                    ("lse_ptr", "fp32"))  # fmt: skip
            consts = (("BLOCK_S", block_s), ("BLOCK_D", block_d),
                      ("WRITE_LSE", True))  # fmt: skip
            label = f"merge {splits} splits, {block_d} cols"
            builds.append((label, Build(MERGE, ptrs, consts, 4), ""))
    compact = (("indices_ptr", "i32"), ("topk_length_ptr", "i32"), ("out_ptr", "i32"),
               ("count_ptr", "i32"))  # fmt: skip
    for paged in (False, True):  # token rows that follow each other; pages with a gap
        for topk in (2048, MAX_TOPK):  # the models' lists in one step; the longest in four
            block, warps = compact_shape(topk)
            consts = (("HAS_TOPK_LENGTH", True), ("PAGED", paged), ("BLOCK", block),
                      ("LAUNCH_NEXT", target.dependent_launch))  # fmt: skip
            label = f"compact {block}{', pages with a gap' if paged else ''}"
            builds.append((label, Build(COMPACT, compact, consts, warps), ""))
    builds += gather_builds()
    builds += sm90_rope16_builds(target)
    return list(dict.fromkeys(builds))


def gather_builds() -> list[tuple[str, Build, str]]:
    """The fp16 copy's five passes (``kernels/portable/sparse_gather.py``), as ``copy16``
    plans launch them."""
    from fp8mla.kernels.portable.sparse_gather import (
        DEQUANT_ROWS,
        DEQUANT_WARPS,
        GATHER_BLOCK,
        SCAN_BLOCK,
        SCAN_SUMS,
    )

    lists = (("lists_ptr", "i32"), ("counts_ptr", "i32"))
    block = (("BLOCK", GATHER_BLOCK),)
    scan = (("claimed_ptr", "i8"), ("block_sums_ptr", "i32"))
    passes = (
        ("claim", lists + (("claimed_ptr", "i8"),), block),
        ("count", scan, (("BLOCK", SCAN_BLOCK),)),
        (
            "number",
            scan + (("copy_row_ptr", "i32"), ("source_ptr", "i32"), ("counter_ptr", "i32")),
            (("BLOCK", SCAN_BLOCK), ("SUMS", SCAN_SUMS)),
        ),
        ("rewrite", lists + (("copy_row_ptr", "i32"),), block),
        (
            "dequantize",
            (
                ("rows_ptr", "u8"),
                ("source_ptr", "i32"),
                ("counter_ptr", "i32"),
                ("copy_ptr", "fp16"),
            ),
            (("ROWS", DEQUANT_ROWS),),
        ),  # fmt: skip
    )
    warps = {"dequantize": DEQUANT_WARPS}
    return [(f"copy16 {name}", Build(f"{GATHER}:{name}_kernel", ptrs, consts,
                                     warps.get(name, 4)), "")
            for name, ptrs, consts in passes]  # fmt: skip
