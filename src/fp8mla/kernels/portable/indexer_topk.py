"""Exact top-k of float32 logits per row, on every target: ``k`` positions of the largest
values, the lower position first among equal values, listed in ascending position order with
-1 after them when a row has fewer than ``k`` positions.

Values compare as 32-bit keys that order like the floats (``order_key``: -0 as +0, NaN above
+inf). A block of candidates held in registers is selected in one go (``select_top``): the
k-th largest key is found from the top bits down (``kth_key``) -- two bits a step, 16
block-wide sums each counting the keys at or above three candidate thresholds
(``RADIX_BITS`` 0), or ``RADIX_BITS`` bits a step, one block-wide histogram of the next
digit of the keys that share the bits found so far -- then every key above it is taken, and
of the keys equal to it the first ones in order until ``k``; a prefix sum over the chosen
ones gives each its place, so the order of the candidates is kept. A block holds at most
2^21 - 1 candidates (the two-bit steps' packed counts).

A long row is cut into chunks (``topk_chunk_kernel``): each program keeps its chunk's own
top-k -- a superset of the row's top-k within the chunk -- as a list of (key, position) in
position order, its "region". ``topk_merge_kernel`` selects again over a group of regions
(their concatenation is in position order too) into one region, level after level, the last
level writing the row's output (and, given a block table, the cache slots of the positions).
"""

import triton
import triton.language as tl

NEG_ONE = tl.constexpr(-1)


@triton.jit
def order_key(x):
    """float32 → uint32 keys in the floats' order: -0 and +0 alike, NaN (any) the largest."""
    x = tl.where(x == 0.0, 0.0, x)
    b = x.to(tl.uint32, bitcast=True)
    key = tl.where((b >> 31) != 0, ~b, b | 0x80000000)
    return tl.where(x != x, 0xFFFFFFFF, key)


@triton.jit
def kth_key(keys, live, k, RADIX_BITS: tl.constexpr):
    """The largest threshold ``T`` with at least ``k`` live keys ``>= T`` (0 when fewer than
    ``k`` keys live: every key is then above it), found from the top bits down: two bits a
    step, the counts at the step's three candidate thresholds riding in one 64-bit sum (21
    bits each), when ``RADIX_BITS`` is 0; else ``radix_kth_key``."""
    if RADIX_BITS > 0:
        return radix_kth_key(keys, live, k, RADIX_BITS)
    t = tl.zeros([], tl.uint32)
    field = (1 << 21) - 1
    for i in tl.static_range(16):
        c1 = t | (1 << (30 - 2 * i))
        c2 = t | (2 << (30 - 2 * i))
        c3 = t | (3 << (30 - 2 * i))
        hits = (keys >= c1).to(tl.int64) + ((keys >= c2).to(tl.int64) << 21)
        hits += (keys >= c3).to(tl.int64) << 42
        total = tl.sum(tl.where(live, hits, 0), axis=0)
        n1 = (total & field).to(tl.int32)
        n2 = ((total >> 21) & field).to(tl.int32)
        n3 = (total >> 42).to(tl.int32)
        t = tl.where(n3 >= k, c3, tl.where(n2 >= k, c2, tl.where(n1 >= k, c1, t)))
    return t


@triton.jit
def radix_kth_key(keys, live, k, BITS: tl.constexpr):
    """``kth_key`` one ``BITS``-bit digit a step from the top (the first step takes what is
    left of 32 bits): a block-wide histogram (``tl.histogram``, ``2^BITS`` bins, a multiple of
    the warp's lanes) of the digit over the live keys whose higher bits equal the threshold's
    so far; the step's digit is the largest whose bin and the bins above it hold the keys
    still needed."""
    NB: tl.constexpr = 1 << BITS
    STEPS: tl.constexpr = (32 + BITS - 1) // BITS
    d = tl.arange(0, NB)
    t = tl.zeros([], tl.uint32)
    need = k + tl.zeros([], tl.int32)
    total = tl.sum(live.to(tl.int32), axis=0)
    for i in tl.static_range(STEPS):
        shift = (STEPS - 1 - i) * BITS
        if i == 0:
            match = live
        else:  # the higher bits, shift + BITS <= 32 - (the first step's bits) < 32
            match = live & ((keys >> (shift + BITS)) == (t >> (shift + BITS)))
        digit = ((keys >> shift) & (NB - 1)).to(tl.int32)
        h = tl.histogram(digit, NB, mask=match)
        at_or_above = tl.sum(h, axis=0) - tl.cumsum(h, axis=0) + h
        best = tl.max(tl.where(at_or_above >= need, d, 0), axis=0)
        need -= tl.sum(tl.where(d > best, h, 0), axis=0)
        t = t | (best.to(tl.uint32) << shift)
    return tl.where(total >= k, t, 0)


@triton.jit
def select_top(keys, live, k, RADIX_BITS: tl.constexpr):
    """The top ``k`` of the 1-D ``keys`` where ``live``, the earlier entry first among equal
    keys: ``(chosen mask, place of each chosen entry in order, how many, the k-th key)``."""
    t = kth_key(keys, live, k, RADIX_BITS)
    above = live & (keys > t)
    tie = (live & (keys == t)).to(tl.int32)
    need = k - tl.sum(above.to(tl.int32), axis=0)
    tie_rank = tl.cumsum(tie, axis=0) - tie
    chosen = above | ((tie != 0) & (tie_rank < need))
    c = chosen.to(tl.int32)
    place = tl.cumsum(c, axis=0) - c
    return chosen, place, tl.sum(c, axis=0), t


@triton.jit
def shrink_list(pos_ptr, key_ptr, base, size, k, CAP: tl.constexpr, RADIX_BITS: tl.constexpr):
    """Compact the list of ``size`` entries at ``base`` to its top ``k`` in place; returns the
    k-th key and the new size. Barriers order the list's stores and loads across threads."""
    tl.debug_barrier()
    j = tl.arange(0, CAP)
    live = j < size
    keys = tl.load(key_ptr + base + j, mask=live, other=0).to(tl.uint32, bitcast=True)
    pos = tl.load(pos_ptr + base + j, mask=live, other=0)
    chosen, place, count, kth = select_top(keys, live, k, RADIX_BITS)
    tl.debug_barrier()
    tl.store(key_ptr + base + place, keys.to(tl.int32, bitcast=True), mask=chosen)
    tl.store(pos_ptr + base + place, pos, mask=chosen)
    tl.debug_barrier()
    return kth, count


@triton.jit
def chunk_keys(logits_ptr, start_ptr, end_ptr, row, c, stride_l_row, num_cols,
               HAS_START: tl.constexpr, CHUNK: tl.constexpr):  # fmt: skip
    """Chunk ``c`` of the row's ``[start, end)`` columns: its positions (relative to the row's
    first column), which of them the row has, and their keys."""
    if HAS_START:
        lo = tl.minimum(tl.maximum(tl.load(start_ptr + row), 0), num_cols)
    else:
        lo = 0
    hi = tl.minimum(tl.maximum(tl.load(end_ptr + row), lo), num_cols)
    rel = c * CHUNK + tl.arange(0, CHUNK)
    live = rel < hi - lo
    x = tl.load(logits_ptr + row.to(tl.int64) * stride_l_row + lo + rel, mask=live, other=0.0)
    return rel, live, order_key(x)


@triton.jit
def threshold_key(hist_ptr, row, chunks, k, NB_BITS: tl.constexpr):
    """The lowest key of the histogram bin that holds the row's k-th largest key: every key of
    the row's top k is at or above it (0 when the row has fewer than ``k`` keys). The row's
    histogram is the sum of its chunks' (``topk_hist_kernel``)."""
    NB: tl.constexpr = 1 << NB_BITS
    b = tl.arange(0, NB)
    total = tl.zeros([NB], tl.int32)
    base = hist_ptr + row.to(tl.int64) * chunks * NB
    for c in range(chunks):
        total += tl.load(base + c * NB + b)
    at_or_above = tl.sum(total, axis=0) - tl.cumsum(total, axis=0) + total  # keys in bins >= b
    top_bin = tl.max(tl.where(at_or_above >= k, b, 0), axis=0)
    return top_bin.to(tl.uint32) << (32 - NB_BITS)


@triton.jit
def write_output(out_ptr, slot_ptr, bt_ptr, row, stride_out_row, stride_bt_b, rows_per_request,
                 pos, chosen, place, count, k, num_pages, KP: tl.constexpr,
                 PAGE_SIZE: tl.constexpr, WRITE_SLOTS: tl.constexpr):  # fmt: skip
    """Row ``row``'s output: chosen positions at their places, -1 from ``count`` to ``k``; with
    ``WRITE_SLOTS`` also each position's cache slot through the row's block-table row (``row
    // rows_per_request``; -1 for a page id outside ``[0, num_pages)``)."""
    out_row = out_ptr + row.to(tl.int64) * stride_out_row
    tl.store(out_row + place, pos, mask=chosen)
    j = tl.arange(0, KP)
    pad = (j >= count) & (j < k)
    tl.store(out_row + j, tl.full([KP], -1, tl.int32), mask=pad)
    if WRITE_SLOTS:
        slot_row = slot_ptr + row.to(tl.int64) * stride_out_row
        bt_row = bt_ptr + (row // rows_per_request).to(tl.int64) * stride_bt_b
        page = tl.load(bt_row + pos // PAGE_SIZE, mask=chosen, other=-1)
        slot = page * PAGE_SIZE + pos % PAGE_SIZE
        slot = tl.where((page >= 0) & (page < num_pages), slot, NEG_ONE)
        tl.store(slot_row + place, slot, mask=chosen)
        tl.store(slot_row + j, tl.full([KP], -1, tl.int32), mask=pad)


@triton.jit
def store_region(pos_ptr, key_ptr, count_ptr, region, pos, keys, chosen, place, count,
                 KP: tl.constexpr):  # fmt: skip
    """A chosen list as region ``region`` (of ``[rows, regions, KP]``): positions and keys at
    their places, and its size."""
    at = region.to(tl.int64) * KP + place
    tl.store(pos_ptr + at, pos, mask=chosen)
    tl.store(key_ptr + at, keys.to(tl.int32, bitcast=True), mask=chosen)
    tl.store(count_ptr + region, count)


@triton.jit(do_not_specialize=["k", "num_pages"])
def topk_chunk_kernel(
    logits_ptr,  # [rows, L] float32
    start_ptr,  # [rows] int32 first column of each row (HAS_START)
    end_ptr,  # [rows] int32 one past its last column
    out_ptr,  # FINAL: [rows, k] int32 positions; else [rows, chunks, KP] region positions
    key_ptr,  # [rows, chunks, KP] region keys (uint32 bits in int32; not FINAL)
    count_ptr,  # [rows, chunks] int32 region sizes (not FINAL)
    slot_ptr,  # [rows, k] int32 cache slots (FINAL with WRITE_SLOTS)
    bt_ptr,  # [B, max_pages] int32 block table (WRITE_SLOTS)
    stride_l_row,
    stride_out_row,
    stride_bt_b,
    rows_per_request,  # rows of one block-table row (WRITE_SLOTS)
    num_cols,  # L
    num_pages,
    k,
    HAS_START: tl.constexpr,
    CHUNK: tl.constexpr,  # columns per program, a power of two
    KP: tl.constexpr,  # k rounded up to a power of two (a region's capacity)
    FINAL: tl.constexpr,  # one chunk a row: write the row's output
    WRITE_SLOTS: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    RADIX_BITS: tl.constexpr,  # kth_key's steps
):
    c = tl.program_id(0)
    row = tl.program_id(1)
    chunks = tl.num_programs(0)
    rel, live, keys = chunk_keys(logits_ptr, start_ptr, end_ptr, row, c, stride_l_row,
                                 num_cols, HAS_START, CHUNK)  # fmt: skip
    chosen, place, count, _ = select_top(keys, live, k, RADIX_BITS)

    # -- the row's output, or the chunk's region --
    if FINAL:
        write_output(out_ptr, slot_ptr, bt_ptr, row, stride_out_row, stride_bt_b, rows_per_request,
                     rel, chosen, place, count, k, num_pages,
                     KP, PAGE_SIZE, WRITE_SLOTS)  # fmt: skip
    else:
        store_region(
            out_ptr, key_ptr, count_ptr, row * chunks + c, rel, keys, chosen, place, count, KP
        )


@triton.jit(do_not_specialize=["k", "num_pages", "regions_in"])
def topk_merge_kernel(
    in_pos_ptr,  # [rows, regions_in, region_stride] int32 positions
    in_key_ptr,  # [rows, regions_in, region_stride] keys (uint32 bits in int32)
    in_count_ptr,  # [rows, regions_in] int32 sizes (each <= CAPR)
    out_ptr,  # FINAL: [rows, k] int32 positions; else [rows, groups, KP] region positions
    key_ptr,  # [rows, groups, KP] keys (uint32 bits in int32; not FINAL)
    count_ptr,  # [rows, groups] int32 (not FINAL)
    slot_ptr,  # [rows, k] int32 (FINAL with WRITE_SLOTS)
    bt_ptr,  # [B, max_pages] int32 (WRITE_SLOTS)
    stride_out_row,
    stride_bt_b,
    rows_per_request,
    regions_in,
    region_stride,  # entries between regions of the input
    num_pages,
    k,
    G: tl.constexpr,  # input regions per program, a power of two
    CAPR: tl.constexpr,  # entries read per input region (>= its size), a power of two
    KP: tl.constexpr,
    FINAL: tl.constexpr,
    WRITE_SLOTS: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    RADIX_BITS: tl.constexpr,
):
    g = tl.program_id(0)
    row = tl.program_id(1)
    groups = tl.num_programs(0)

    # -- the group's regions, concatenated in order --
    reg = g * G + tl.arange(0, G)
    reg_ok = reg < regions_in
    sizes = tl.load(in_count_ptr + row * regions_in + reg, mask=reg_ok, other=0)
    j = tl.arange(0, CAPR)
    live = j[None, :] < sizes[:, None]
    at = (row * regions_in + reg).to(tl.int64)[:, None] * region_stride + j[None, :]
    keys = tl.load(in_key_ptr + at, mask=live, other=0).to(tl.uint32, bitcast=True)
    keys = tl.reshape(keys, [G * CAPR])
    pos = tl.reshape(tl.load(in_pos_ptr + at, mask=live, other=0), [G * CAPR])
    live = tl.reshape(live, [G * CAPR])
    chosen, place, count, _ = select_top(keys, live, k, RADIX_BITS)

    if FINAL:
        write_output(out_ptr, slot_ptr, bt_ptr, row, stride_out_row, stride_bt_b, rows_per_request,
                     pos, chosen, place, count, k, num_pages,
                     KP, PAGE_SIZE, WRITE_SLOTS)  # fmt: skip
    else:
        store_region(
            out_ptr, key_ptr, count_ptr, row * groups + g, pos, keys, chosen, place, count, KP
        )


@triton.jit(do_not_specialize=["num_cols"])
def topk_hist_kernel(
    logits_ptr,  # [rows, L] float32
    start_ptr,  # [rows] int32 first column of each row (HAS_START)
    end_ptr,  # [rows] int32 one past its last column
    hist_ptr,  # [rows, chunks, 2^NB_BITS] int32: each chunk's counts of its keys' top bits
    stride_l_row,
    num_cols,
    HAS_START: tl.constexpr,
    CHUNK: tl.constexpr,
    NB_BITS: tl.constexpr,
):
    """The histogram path's first grid: each chunk's histogram of its keys' top ``NB_BITS``
    bits (the float's sign, exponent and leading mantissa bits, in key order)."""
    c = tl.program_id(0)
    row = tl.program_id(1)
    chunks = tl.num_programs(0)
    _, live, keys = chunk_keys(logits_ptr, start_ptr, end_ptr, row, c, stride_l_row, num_cols,
                               HAS_START, CHUNK)  # fmt: skip
    bins = (keys >> (32 - NB_BITS)).to(tl.int32)
    counts = tl.histogram(bins, 1 << NB_BITS, mask=live)
    at = (row * chunks + c).to(tl.int64) * (1 << NB_BITS) + tl.arange(0, 1 << NB_BITS)
    tl.store(hist_ptr + at, counts)


@triton.jit(do_not_specialize=["k", "num_cols"])
def topk_prune_kernel(
    logits_ptr,  # [rows, L] float32
    start_ptr,  # [rows] int32 (HAS_START)
    end_ptr,  # [rows] int32
    hist_ptr,  # [rows, chunks, 2^NB_BITS] int32 (topk_hist_kernel)
    out_ptr,  # [rows, chunks, KP] region positions
    key_ptr,  # [rows, chunks, KP] region keys (uint32 bits in int32)
    count_ptr,  # [rows, chunks] int32 region sizes
    stride_l_row,
    num_cols,
    k,
    HAS_START: tl.constexpr,
    CHUNK: tl.constexpr,
    KP: tl.constexpr,
    NB_BITS: tl.constexpr,
    RADIX_BITS: tl.constexpr,
):
    """The histogram path's second grid: each chunk keeps its keys at or above the row's
    threshold key (``threshold_key``), or of those its own top ``k`` where more are: a
    superset of the row's top k within the chunk, in position order. Most chunks keep few
    keys, and none needs the k-th key's search unless it keeps more than ``k``."""
    c = tl.program_id(0)
    row = tl.program_id(1)
    chunks = tl.num_programs(0)
    rel, live, keys = chunk_keys(logits_ptr, start_ptr, end_ptr, row, c, stride_l_row,
                                 num_cols, HAS_START, CHUNK)  # fmt: skip
    floor = threshold_key(hist_ptr, row, chunks, k, NB_BITS)
    chosen = live & (keys >= floor)
    n = tl.sum(chosen.to(tl.int32), axis=0)
    if n > k:
        chosen, place, n, _ = select_top(keys, chosen, k, RADIX_BITS)
    else:
        place = tl.cumsum(chosen.to(tl.int32), axis=0) - chosen.to(tl.int32)
    store_region(out_ptr, key_ptr, count_ptr, row * chunks + c, rel, keys, chosen, place, n, KP)


@triton.jit(do_not_specialize=["k", "num_pages", "regions"])
def topk_gather_kernel(
    in_pos_ptr,  # [rows, regions, KP] int32 positions (topk_prune_kernel)
    in_key_ptr,  # [rows, regions, KP] keys
    in_count_ptr,  # [rows, regions] int32 sizes (each <= k)
    stage_pos_ptr,  # [rows, STAGE] int32 workspace
    stage_key_ptr,  # [rows, STAGE] int32 workspace
    out_ptr,  # [rows, k] int32 positions
    slot_ptr,  # [rows, k] int32 cache slots (WRITE_SLOTS)
    bt_ptr,  # [B, max_pages] int32 block table (WRITE_SLOTS)
    stride_out_row,
    stride_bt_b,
    rows_per_request,
    regions,
    num_pages,
    k,
    KP: tl.constexpr,
    STAGE: tl.constexpr,  # staged entries one selection takes, >= 2 * KP
    WRITE_SLOTS: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    RADIX_BITS: tl.constexpr,
):
    """The histogram path's last grid, one program a row: the regions appended in order to a
    staging list, which is cut to its top ``k`` (``shrink_list``) whenever the next region
    would not fit; then the list's top ``k`` is the row's output. One selection when the
    regions hold at most ``STAGE`` entries together (the threshold's bin is narrow), one more
    per overflow otherwise: exact either way, the earlier position first among equal keys."""
    row = tl.program_id(1)
    base = row.to(tl.int64) * STAGE
    j = tl.arange(0, KP)
    n = 0
    for r in range(regions):
        size = tl.load(in_count_ptr + row * regions + r)
        if n + size > STAGE:
            _, n = shrink_list(stage_pos_ptr, stage_key_ptr, base, n, k, STAGE, RADIX_BITS)
        at = (row * regions + r).to(tl.int64) * KP + j
        has = j < size
        tl.store(stage_key_ptr + base + n + j, tl.load(in_key_ptr + at, mask=has), mask=has)
        tl.store(stage_pos_ptr + base + n + j, tl.load(in_pos_ptr + at, mask=has), mask=has)
        n += size
    # the list's top k, in position order at its front (one selection code path, so that the
    # program holds one list's worth of registers), then the row's output from it
    _, n = shrink_list(stage_pos_ptr, stage_key_ptr, base, n, k, STAGE, RADIX_BITS)
    kept = j < n
    pos = tl.load(stage_pos_ptr + base + j, mask=kept, other=0)
    write_output(out_ptr, slot_ptr, bt_ptr, row, stride_out_row, stride_bt_b, rows_per_request,
                 pos, kept, j, n, k, num_pages, KP, PAGE_SIZE,
                 WRITE_SLOTS)  # fmt: skip


@triton.jit
def to_slots_kernel(
    pos_ptr,  # [T, k] int32 request-relative positions (-1: none)
    req_ptr,  # [T] int32 block-table row of each token (HAS_REQ), else t // rows_per_request
    bt_ptr,  # [B, max_pages] int32
    out_ptr,  # [T, k] int32 slots
    stride_pos_t,
    stride_out_t,
    stride_bt_b,
    rows_per_request,
    num_requests,
    max_pages,
    num_pages,
    k,
    HAS_REQ: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    BLOCK: tl.constexpr,
):
    t = tl.program_id(1)
    j = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    in_row = j < k
    if HAS_REQ:
        req = tl.load(req_ptr + t)
    else:
        req = t // rows_per_request
    req = req + tl.zeros([BLOCK], tl.int32)  # a vector: the interpreter's scalar masks differ
    pos = tl.load(pos_ptr + t.to(tl.int64) * stride_pos_t + j, mask=in_row, other=-1)
    slot_page = pos // PAGE_SIZE
    ok = in_row & (req >= 0) & (req < num_requests) & (pos >= 0) & (slot_page < max_pages)
    page = tl.load(bt_ptr + req.to(tl.int64) * stride_bt_b + slot_page, mask=ok, other=-1)
    ok = ok & (page >= 0) & (page < num_pages)
    slot = tl.where(ok, page * PAGE_SIZE + (pos - slot_page * PAGE_SIZE), NEG_ONE)
    tl.store(out_ptr + t.to(tl.int64) * stride_out_t + j, slot, mask=in_row)


# -- the digits path: the row's exact k-th key in four 8-bit digits, one grid each ---------
DIGIT_BITS = tl.constexpr(8)
DIGIT_BINS = tl.constexpr(256)
DIGITS = tl.constexpr(4)


@triton.jit
def row_digits(hist_ptr, row, chunks, k, FOUND: tl.constexpr, CP: tl.constexpr):
    """The first ``FOUND`` 8-bit digits of the row's k-th largest key, from its chunks'
    histograms (``hist [rows, chunks, DIGITS, 256]``: chunk ``c``'s counts of digit ``j`` over
    its keys that share digits ``0..j-1`` with the k-th key): ``(the digits as the key's top
    bits, the keys still needed among those sharing them, the row's live keys)``."""
    c = tl.arange(0, CP)
    d = tl.arange(0, DIGIT_BINS)
    t = tl.zeros([], tl.uint32)
    need = k + tl.zeros([], tl.int32)
    total = tl.zeros([], tl.int32)
    for j in tl.static_range(FOUND):
        at = ((row * chunks + c) * DIGITS + j).to(tl.int64)[:, None] * DIGIT_BINS + d[None, :]
        h = tl.sum(tl.load(hist_ptr + at, mask=(c < chunks)[:, None], other=0), axis=0)
        if j == 0:
            total = tl.sum(h, axis=0)
        at_or_above = tl.sum(h, axis=0) - tl.cumsum(h, axis=0) + h
        b = tl.max(tl.where(at_or_above >= need, d, 0), axis=0)
        need -= tl.sum(tl.where(d > b, h, 0), axis=0)
        t = t | (b.to(tl.uint32) << (24 - 8 * j))
    return t, need, total


@triton.jit
def shares_digits(keys, live, t, FOUND: tl.constexpr):
    """Live keys whose first ``FOUND`` digits are those of ``t``."""
    if FOUND == 0:
        return live
    else:
        return live & ((keys >> (32 - 8 * FOUND)) == (t >> (32 - 8 * FOUND)))


@triton.jit(do_not_specialize=["k", "num_cols", "num_pages"])
def topk_digit_kernel(
    logits_ptr,  # [rows, L] float32
    start_ptr,  # [rows] int32 first column of each row (HAS_START)
    end_ptr,  # [rows] int32 one past its last column
    hist_ptr,  # [rows, chunks, DIGITS, 256] int32 digit histograms (written by passes 0-3)
    above_ptr,  # [rows, chunks, DIGITS] int32 keys above each found digit (passes 1-3)
    out_ptr,  # [rows, k] int32 positions (pass 4)
    slot_ptr,  # [rows, k] int32 cache slots (pass 4 with WRITE_SLOTS)
    bt_ptr,  # [B, max_pages] int32 block table (WRITE_SLOTS)
    stride_l_row,
    stride_out_row,
    stride_bt_b,
    rows_per_request,
    num_cols,
    num_pages,
    k,
    HAS_START: tl.constexpr,
    CHUNK: tl.constexpr,  # columns per program, a power of two
    CP: tl.constexpr,  # chunks a row, rounded up to a power of two
    KP: tl.constexpr,  # k rounded up to a power of two
    PASS: tl.constexpr,  # 0-3: histogram digit PASS; 4: write the row's output
    WRITE_SLOTS: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
):
    """The digits path of the top-k, one grid per ``PASS`` over the same chunks (a program
    each). Passes 0-3: from the histograms of the passes before, the k-th key's first
    ``PASS`` digits; the chunk's count of keys that share the digits before the last one
    found and lie above it (``above``), and its histogram of digit ``PASS`` over the keys
    that share all found digits. Pass 4: the k-th key ``T`` whole; the chunk takes its keys
    above ``T`` and, of its keys equal to ``T``, those still needed after the earlier chunks'
    (the earlier position first), and writes them in position order after the earlier
    chunks' choices, whose counts the ``above`` counts and the last histograms give."""
    c = tl.program_id(0)
    row = tl.program_id(1)
    chunks = tl.num_programs(0)
    rel, live, keys = chunk_keys(logits_ptr, start_ptr, end_ptr, row, c, stride_l_row,
                                 num_cols, HAS_START, CHUNK)  # fmt: skip
    t, need, total = row_digits(hist_ptr, row, chunks, k, PASS, CP)
    here = (row * chunks + c).to(tl.int64) * DIGITS
    if PASS > 0 and PASS < DIGITS:  # own keys above the last digit found, of those sharing
        # the ones before
        s = 32 - 8 * PASS
        share = shares_digits(keys, live, t, PASS - 1)
        up = share & (((keys >> s) & 0xFF) > ((t >> s) & 0xFF))
        tl.store(above_ptr + here + PASS - 1, tl.sum(up.to(tl.int32), axis=0))
    if PASS < DIGITS:
        share = shares_digits(keys, live, t, PASS)
        digit = ((keys >> (24 - 8 * PASS)) & 0xFF).to(tl.int32)
        h = tl.histogram(digit, DIGIT_BINS, mask=share)
        tl.store(hist_ptr + (here + PASS) * DIGIT_BINS + tl.arange(0, DIGIT_BINS), h)
    else:
        # the earlier chunks' choices: their keys above T (digit by digit) and equal to it
        cc = tl.arange(0, CP)
        d = tl.arange(0, DIGIT_BINS)
        earlier = cc < c
        first = (row * chunks + cc).to(tl.int64) * DIGITS
        a = tl.load(
            above_ptr + first[:, None] + tl.arange(0, 4)[None, :],
            mask=earlier[:, None] & (tl.arange(0, 4)[None, :] < DIGITS - 1),
            other=0,
        )
        h3 = tl.load(hist_ptr + (first + DIGITS - 1)[:, None] * DIGIT_BINS + d[None, :],
                     mask=earlier[:, None], other=0)  # fmt: skip
        b3 = (t & 0xFF).to(tl.int32)
        above_before = tl.sum(tl.sum(a, axis=1), axis=0)
        above_before += tl.sum(tl.sum(tl.where(d[None, :] > b3, h3, 0), axis=1), axis=0)
        ties_before = tl.sum(tl.sum(tl.where(d[None, :] == b3, h3, 0), axis=1), axis=0)
        few = total < k  # every live key is chosen, the earlier chunks' all live
        base = tl.where(few, c * CHUNK, above_before + tl.minimum(ties_before, need))
        tie = (live & (keys == t) & (total >= k)).to(tl.int32)
        tie_rank = ties_before + tl.cumsum(tie, axis=0) - tie
        chosen = tl.where(few, live, (live & (keys > t)) | ((tie != 0) & (tie_rank < need)))
        ch = chosen.to(tl.int32)
        place = base + tl.cumsum(ch, axis=0) - ch
        count = tl.where(c == 0, tl.minimum(total, k), k)  # chunk 0 writes the -1 padding
        write_output(out_ptr, slot_ptr, bt_ptr, row, stride_out_row, stride_bt_b, rows_per_request,
                     rel, chosen, place, count, k, num_pages, KP,
                     PAGE_SIZE, WRITE_SLOTS)  # fmt: skip
