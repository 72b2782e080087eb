"""The lightning indexer's kernels as the compile matrix builds them, for each target's table
(``indexer_plan.INDEXER_TABLES``): the key-cache writer (key dtypes × scale formats), the paged
logits kernel (1 and 2 tokens a request × 32 and 64 heads: GLM-5 and DeepSeek-V3.2, pages of
64), the ragged prefill kernel, the fused logits + top-k kernel, the top-k's chunk and merge
programs at k = 2,048 (the sizes the planner reaches: whole rows of 16,384 positions, chunks
of 8,192, eight regions merged) and the slot conversion.

``indexer_builds(target)`` returns ``(label, Build, tile)`` triples for
``fp8mla.tools.kernel_builds.measure``; nothing here compiles.
"""

from __future__ import annotations

import torch

from fp8mla.attention.targets import Target
from fp8mla.dsa.index_cache import PACK_TOKENS, PACK_WARPS
from fp8mla.dsa.indexer_plan import (
    HIST_BITS,
    SELECT_ENTRIES,
    indexer_table,
    logits_warps,
    pow2_at_least,
    select_warps,
)
from fp8mla.tools.kernel_builds import Build

PORTABLE = "fp8mla.kernels.portable"
PACK = f"{PORTABLE}.indexer_pack:index_pack_kernel"
PAGED = f"{PORTABLE}.indexer_logits:paged_logits_kernel"
RAGGED = f"{PORTABLE}.indexer_logits:ragged_logits_kernel"
FUSED = f"{PORTABLE}.indexer_fused:paged_topk_kernel"
CHUNK = f"{PORTABLE}.indexer_topk:topk_chunk_kernel"
MERGE = f"{PORTABLE}.indexer_topk:topk_merge_kernel"
SLOTS = f"{PORTABLE}.indexer_topk:to_slots_kernel"
HIST = f"{PORTABLE}.indexer_topk:topk_hist_kernel"
PRUNE = f"{PORTABLE}.indexer_topk:topk_prune_kernel"
GATHER = f"{PORTABLE}.indexer_topk:topk_gather_kernel"
DIGIT = f"{PORTABLE}.indexer_topk:topk_digit_kernel"
TOPK = 2048
RADIX_CHECK = 8  # the histogram steps' build compiled beside each table's own
DOT_MODES = {"fp8": 0, "fp16": 1, "fp32": 2}


def _decoding(target: Target) -> tuple[int, float]:
    """``(FP8_CVT, DECODE_SCALE)`` of the logits kernels on ``target``."""
    from fp8mla.attention.launch import fp8_conversion

    if indexer_table(target).logits.dot != "fp16":
        return 0, 1.0
    cvt = fp8_conversion(torch.float8_e4m3fn, torch.device("cuda"), False, "auto", target)
    return cvt, 65536.0 if cvt in (3, 5) else 1.0


def _logits_consts(target: Target, next_n: int, heads: int) -> dict:
    tile = indexer_table(target).logits
    cvt, scale = _decoding(target)
    np_ = pow2_at_least(next_n)
    hp = max(pow2_at_least(heads), pow2_at_least(-(-16 // np_)))
    return dict(PAGE_SIZE=64, NEXT_N=next_n, NP=np_, HP=hp, BLOCK_N=tile.block_n,
                DOT=DOT_MODES[tile.dot], FP8_CVT=cvt, DECODE_SCALE=scale)  # fmt: skip


def indexer_builds(target: Target) -> list[tuple[str, Build, str]]:
    """``(label, Build, tile)`` of every indexer kernel build of ``target``."""
    table = indexer_table(target)
    tile = table.logits
    builds: list[tuple[str, Build, str]] = []
    native = target.backend == "cuda" and int(target.arch) >= 89
    radix = table.radix_bits
    for rows, ptr, kind in (("bf16", "u16", 0), ("fp16", "fp16", 1), ("fp32", "fp32", 2)):
        for pow2 in (True, False):
            consts = (("PAGE_SIZE", 64), ("IN_KIND", kind), ("POW2", pow2),
                      ("NATIVE_CVT", native), ("BLOCK_T", PACK_TOKENS))  # fmt: skip
            build = Build(PACK, (("k_ptr", ptr), ("slot_ptr", "i64"), ("cache_ptr", "u8")),
                          consts, PACK_WARPS)  # fmt: skip
            label = f"pack {rows} {'pow2' if pow2 else 'arbitrary'}"
            builds.append((label, build, ""))
    paged_ptrs = (("q_ptr", "u8"), ("w_ptr", "fp32"), ("cache_ptr", "u8"), ("bt_ptr", "i32"),
                  ("lens_ptr", "i32"))  # fmt: skip
    for next_n in (1, 2):
        for heads in (32, 64):
            consts = _logits_consts(target, next_n, heads)
            warps = logits_warps(tile, consts["NP"] * consts["HP"])
            build = Build(PAGED, paged_ptrs + (("out_ptr", "fp32"),), tuple(consts.items()),
                          warps, tile.num_stages)  # fmt: skip
            builds.append((f"paged {tile.name} next_n {next_n} H{heads}", build, ""))
            fused = dict(consts, CAP=pow2_at_least(TOPK + tile.block_n), RADIX_BITS=radix)
            ptrs = paged_ptrs + (("pos_ptr", "i32"), ("key_ptr", "i32"), ("count_ptr", "i32"))
            build = Build(FUSED, ptrs, tuple(fused.items()), table.fused_warps, tile.num_stages)
            builds.append((f"fused {tile.name} next_n {next_n} H{heads} k{TOPK}", build, ""))
    for heads in (32, 64):
        consts = _logits_consts(target, 1, heads)
        rows = 128 // heads
        consts = dict(ROWS=rows, HP=heads, BLOCK_N=tile.block_n, DOT=consts["DOT"],
                      FP8_CVT=consts["FP8_CVT"], DECODE_SCALE=consts["DECODE_SCALE"])  # fmt: skip
        ptrs = (("q_ptr", "u8"), ("w_ptr", "fp32"), ("k_ptr", "u8"), ("ks_ptr", "fp32"),
                ("start_ptr", "i32"), ("end_ptr", "i32"), ("out_ptr", "fp32"))  # fmt: skip
        build = Build(RAGGED, ptrs, tuple(consts.items()), logits_warps(tile, rows * heads),
                      tile.num_stages)  # fmt: skip
        builds.append((f"ragged {tile.name} {rows} rows H{heads}", build, ""))
    topk_ptrs = (("logits_ptr", "fp32"), ("start_ptr", "i32"), ("end_ptr", "i32"),
                 ("out_ptr", "i32"), ("key_ptr", "i32"), ("count_ptr", "i32"),
                 ("slot_ptr", "i32"), ("bt_ptr", "i32"))  # fmt: skip
    # the chunk kernel also with the k-th key found by 8-bit histogram steps (radix_bits 8:
    # 256 bins, a multiple of 32- and 64-lane warps), which the tables may choose
    for chunk, final, rb in ((SELECT_ENTRIES, True, radix), (2 * TOPK, False, radix),
                             (SELECT_ENTRIES, False, RADIX_CHECK)):  # fmt: skip
        consts = (("HAS_START", not final), ("CHUNK", chunk), ("KP", TOPK), ("FINAL", final),
                  ("WRITE_SLOTS", final), ("PAGE_SIZE", 64), ("RADIX_BITS", rb))  # fmt: skip
        build = Build(CHUNK, topk_ptrs, consts, select_warps(chunk, table))
        label = f"topk chunk {chunk}{' final+slots' if final else ''} k{TOPK}"
        builds.append((label + (f" radix {rb}" if rb else ""), build, ""))
    merge_ptrs = (("in_pos_ptr", "i32"), ("in_key_ptr", "i32"), ("in_count_ptr", "i32"),
                  ("out_ptr", "i32"), ("key_ptr", "i32"), ("count_ptr", "i32"),
                  ("slot_ptr", "i32"), ("bt_ptr", "i32"))  # fmt: skip
    group = SELECT_ENTRIES // TOPK
    for final in (True, False):
        consts = (("G", group), ("CAPR", TOPK), ("KP", TOPK), ("FINAL", final),
                  ("WRITE_SLOTS", final), ("PAGE_SIZE", 64), ("RADIX_BITS", radix))  # fmt: skip
        build = Build(MERGE, merge_ptrs, consts, select_warps(group * TOPK, table))
        label = f"topk merge {group}x{TOPK}{' final+slots' if final else ''}"
        builds.append((label, build, ""))
    # the histogram path (IndexerTable.topk_path): chunks of SELECT_ENTRIES, k = TOPK
    warps = select_warps(SELECT_ENTRIES, table)
    hist_ptrs = (("logits_ptr", "fp32"), ("start_ptr", "i32"), ("end_ptr", "i32"),
                 ("hist_ptr", "i32"))  # fmt: skip
    consts = (("HAS_START", False), ("CHUNK", SELECT_ENTRIES), ("NB_BITS", HIST_BITS))
    builds.append((f"topk histogram {SELECT_ENTRIES}", Build(HIST, hist_ptrs, consts, warps), ""))
    prune_ptrs = hist_ptrs + (("out_ptr", "i32"), ("key_ptr", "i32"), ("count_ptr", "i32"))
    consts = (("HAS_START", False), ("CHUNK", SELECT_ENTRIES), ("KP", TOPK),
              ("NB_BITS", HIST_BITS), ("RADIX_BITS", radix))  # fmt: skip
    build = Build(PRUNE, prune_ptrs, consts, warps)
    builds.append((f"topk prune {SELECT_ENTRIES} k{TOPK}", build, ""))
    gather_ptrs = (("in_pos_ptr", "i32"), ("in_key_ptr", "i32"), ("in_count_ptr", "i32"),
                   ("stage_pos_ptr", "i32"), ("stage_key_ptr", "i32"), ("out_ptr", "i32"),
                   ("slot_ptr", "i32"), ("bt_ptr", "i32"))  # fmt: skip
    consts = (("KP", TOPK), ("STAGE", SELECT_ENTRIES), ("WRITE_SLOTS", True), ("PAGE_SIZE", 64),
              ("RADIX_BITS", radix))  # fmt: skip
    build = Build(GATHER, gather_ptrs, consts, warps)
    builds.append((f"topk gather {SELECT_ENTRIES} k{TOPK} final+slots", build, ""))
    # the digits path (IndexerTable.topk_path): the table's chunks, 131,072 columns a row
    chunks = pow2_at_least(131072 // table.digit_chunk)
    digit_ptrs = (("logits_ptr", "fp32"), ("start_ptr", "i32"), ("end_ptr", "i32"),
                  ("hist_ptr", "i32"), ("above_ptr", "i32"), ("out_ptr", "i32"),
                  ("slot_ptr", "i32"), ("bt_ptr", "i32"))  # fmt: skip
    for p in (0, 3, 4):
        consts = (("HAS_START", False), ("CHUNK", table.digit_chunk), ("CP", chunks),
                  ("KP", TOPK), ("PASS", p), ("WRITE_SLOTS", p == 4), ("PAGE_SIZE", 64))  # fmt: skip
        label = f"topk digits pass {p} {table.digit_chunk}x{chunks}"
        label += f" k{TOPK} final+slots" if p == 4 else ""
        builds.append((label, Build(DIGIT, digit_ptrs, consts, table.digit_warps), ""))
    ptrs = (("pos_ptr", "i32"), ("req_ptr", "i32"), ("bt_ptr", "i32"), ("out_ptr", "i32"))
    consts = (("HAS_REQ", True), ("PAGE_SIZE", 64), ("BLOCK", 1024))
    builds.append(("to_slots", Build(SLOTS, ptrs, consts, 4), ""))
    return builds
