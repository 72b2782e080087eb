"""What one attention launch is: a kernel variant in a tile shape, and its grid."""

from __future__ import annotations

from dataclasses import KW_ONLY, dataclass

REGISTERS_PER_SM = 65536  # SM80 … SM120


@dataclass(frozen=True)
class KernelConfig:
    """A kernel variant (a name in :data:`fp8mla.attention.variants.REGISTRY`) and its tile.

    ``KernelConfig(16, 64, 8, 1)`` is the ``rows`` variant in 16-row tiles of 64 KV tokens,
    8 warps, one pipeline stage; ``plan(kernel_config=...)`` also takes a variant name alone
    (``"fewrows"``), which then runs in the tile the planner's tables give it."""

    block_m: int  # query rows ((token, head) pairs) per program
    block_n: int  # KV tokens per inner-loop step
    num_warps: int
    num_stages: int
    _: KW_ONLY  # the options below are named at every call: new ones cannot shift them
    variant: str = "rows"
    # bf16 queries converted to fp16 by the launcher (a copy the size of q_nope) when the dots
    # run in fp16: Triton then stages the query tile from global memory into shared memory;
    # converted in-kernel, it is re-read into registers every KV step (value split, FP8 KV).
    q_fp16_copy: bool = False
    fp8_cvt: str = "auto"  # FP8 → fp16: auto, native, ptx (SM89+), int (CUDA), portable (any)
    # Programs per SM the split count aims for: 2 fills two full waves when one program is
    # resident per SM (the H200's 16-row FP8 tile: 4 splits beat 2 and 3 for 64 requests).
    occupancy: int = 1

    def max_registers(self, warp_size: int = 32) -> int | None:
        """Registers per thread that leave room for ``occupancy`` programs per SM (64K
        registers on every CUDA target), or None when the cap would be the hardware's 255.
        ptxas is told it (Triton's ``maxnreg``): left to itself it gave the H200's 8-warp FP8
        16-row tile 142 registers, one program per SM where the split count counted on two,
        which made its runs half again as slow (``docs/design/portable.md``)."""
        if self.occupancy <= 1:
            return None
        cap = REGISTERS_PER_SM // (self.occupancy * self.num_warps * warp_size)
        cap -= cap % 8  # ptxas allocates in steps of 8
        return cap if cap < 255 else None


@dataclass(frozen=True)
class LaunchPlan:
    """Grid of one attention launch: ``(m_tiles × programs per tile, batch, num_splits)``
    programs of ``config``."""

    config: KernelConfig
    m_tiles: int  # row tiles of the longest request (shorter ones exit early)
    num_splits: int
    merge_block_d: int = 128  # output columns per program of the split merge (128/256/512)
    # the split merge launched as the attention kernel's programmatic dependent (SM90+): its
    # programs are scheduled while the attention runs and wait for its partials on the GPU
    merge_waits: bool = False
    # the attention kernel launched as a programmatic dependent of the grid before it on the
    # stream (SM90+): its programs may be scheduled before that grid ends, set up, and wait
    # for it before their first global read; the split merge lets the next grid launch early
    attention_waits: bool = False
    # the split partials in fp16 with their factor (workspace.Partials), half the bytes the
    # attention kernel writes and the merge reads
    half_partials: bool = False
    merge_warps: int = 4  # warps per program of the split merge

    @property
    def rows_per_request(self) -> int:
        """Query rows of one request the grid covers: the capacity of a CUDA-graph capture."""
        return self.m_tiles * self.config.block_m


@dataclass(frozen=True)
class LaunchInfo:
    """What a plan launches (``BatchMLAPagedAttentionWrapper.launch_info``): the kernel
    variant, its tile, the attention grid ``(row tiles × programs per tile, requests,
    splits)``, the KV splits per request (a merge follows when more than one) and whether
    ``run()`` stages FP8 pages in fp16 first."""

    variant: str
    config: KernelConfig
    grid: tuple[int, int, int]
    num_splits: int
    staged: bool = False
