"""What the compile matrix accepts as spilling: the default limit and the measured exceptions
(read by ``compile_matrix`` to judge builds and by ``matrix_report`` to explain them)."""

from __future__ import annotations

# Spill limit per thread (CUDA spill stores) or lane (AMD: 4 bytes per spilled VGPR).
SPILL_LIMIT = 128
# Larger limits, each with the reason it is accepted: (target names, kernel, tile) → limit.
# A tile key is one tile ("64x64 rows": rows × tokens and the variant), a variant ("vsplit":
# every tile of it) or "" (all). The measurements behind them: docs/design/.
SPILL_EXCEPTIONS: list[tuple[tuple[str, ...], str, str, int, str]] = [
    (
        ("sm80", "sm90", "sm100"),
        "attention",
        "64x64 rows",
        1536,
        "the H200's 64-row tile (kept where it fits) spills ~200-1200 B (with the page-table "
        "bounds checks), yet measured fastest there for 128 heads (149 vs ~50 TFLOP/s for "
        "16-row tiles)",
    ),
    (
        ("sm90", "sm100"),
        "attention",
        "vsplit",  # the value-split tiles, 64 and 128 rows
        1024,
        "the H200's value-split tiles spill ~150-650 B, yet measured fastest there for extend "
        "chunks, 4 speculative tokens and 128-head decode (docs/design/portable.md)",
    ),
    (
        ("sm90",),
        "fp8q",  # the portable kernels' FP8-query builds
        "",
        1280,
        "the portable kernels' FP8-query builds on SM90, which runs FP8 queries through the "
        "Gluon kernels (fp8qk's own FP8-query build, the others' converted to bf16) unless "
        "kernel_config names rows or vsplit: "
        "Triton 3.9 spills 288-324 B in 16-row tiles and 1,096 B in the 128-row value-split "
        "tile; not timed yet (docs/design/fp8-queries.md)",
    ),
    (
        ("gfx1100",),
        "attention",
        "",
        4096,
        "RDNA3 WMMA holds 16 values per lane per 16×16 operand tile, so the 576-deep Q·Kᵀ "
        "operands alone need ~576 of 256 VGPRs: every tile spills until Q·Kᵀ is chunked over "
        "the latent dimension",
    ),
    (
        ("sm90",),
        "attention",
        "32x64 fewrows",
        256,
        "the few-row Gluon kernel's 32-row tile: four partitions share 64K registers; "
        "Triton 3.9 spills 100-230 B of it, Triton 3.6 (the H200 runs) 16 B",
    ),
    (
        ("sm90",),
        "attention",
        "64x64 pingpong64",
        384,
        "the ping-pong kernel's 64-token tiles (16-bit pools, more than one row tile a "
        "request): both consumer warpgroups at 224 registers hold S [64, 64], P and a 64 × 256 "
        "accumulator; Triton 3.9 spills 268-304 B, Triton 3.6 (the H200 runs) 56-64 B, and it "
        "is the fastest tile there for long extend chunks at 128 heads "
        "(docs/design/sm90-pingpong.md)",
    ),
    (
        ("sm90",),
        "attention",
        "64x64 pingpong8",
        2560,
        "the ping-pong kernel on FP8 tiles: both consumer warpgroups at 232 registers hold a "
        "64 × 256 accumulator, S [64, 64], a scores part and two value operands; Triton 3.6 "
        "(the H200 runs) spills 76-208 B with per-tensor scales (the fastest 128-head FP8 "
        "decode there) and 1,356 B with token-group scales (a few percent slower there than the "
        "32-row FP8 × FP8 tiles); Triton 3.9 768-780 B and 2,556 B, and its ptxas serializes "
        "the wgmma there (the H200's Triton 3.6 per-tensor builds do not; "
        "docs/design/sm90-pingpong8.md)",
    ),
    (
        ("sm90",),
        "attention",
        "fp8qk",  # the FP8 × FP8 kernel's tiles (16 and 32 rows)
        256,
        "the FP8 × FP8 Gluon kernel with token-group scales (the score warpgroup adds four "
        "scaled parts, the value warpgroups scale V): Triton 3.9 spills 72-92 B, Triton 3.6 "
        "(the H200 runs) 88 B; with per-tensor scales 32-44 B and 0-16 B",
    ),
    (
        ("gfx1100",),
        "sparse",
        "",
        2048,
        "RDNA3: the sparse kernel's queries alone outgrow the 256 VGPRs; the smallest tile spills "
        "least",
    ),
    (
        ("gfx1100",),
        "indexer",
        "",
        1024,
        "RDNA3: the indexer's 128-deep query operand and its scores tile crowd the 256 VGPRs "
        "(WMMA holds 16 values per lane per 16×16 operand tile), and the top-k merge's 8,192 "
        "candidates at 32 waves: 190-790 B spill at the smallest tiles that compile",
    ),
    (
        ("sm90",),
        "sparse",
        "rope16",
        256,
        "the FP8 × FP8 kernel's token-group builds (its *q limit) in the 16-bit RoPE mode",
    ),
    (
        ("sm90",),
        "sparse",
        "pingpong8-rope16",
        2816,
        "the FP8 ping-pong kernel's token-group builds (its 64x64 pingpong8 limit) in the "
        "16-bit RoPE mode, the query's RoPE part in registers (16 a thread more, so that the "
        "stages' bf16 RoPE parts fit in shared memory): Triton 3.6 (the H200 runs) spills "
        "1,268-1,616 B, Triton 3.9 2,496-2,692 B, and both serialize its wgmma for want of "
        "registers (ptxas C7512), as they do for the dense token-group build; named by a plan "
        "only: 12-18% slower than the FP8 × FP8 kernel at 128 heads on an H100 "
        "(docs/design/sparse.md, s8a)",
    ),
    (
        ("sm80", "sm90", "sm100"),
        "attention",
        "16x64 rows",
        256,
        "16-bit KV's 16-row two-stage tile was at 255 registers with 56-120 B of spill before "
        "the kernels bounded every page-table entry they read; the bounds add 40-90 B",
    ),
]
