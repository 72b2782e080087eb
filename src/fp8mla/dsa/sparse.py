"""Sparse MLA attention (DeepSeek Sparse Attention) over the packed 656-byte FP8 cache, read in
place: :func:`sparse_mla` (one call) and :class:`SparseMLAWrapper` (``plan()`` once per shape,
``run()`` per layer, capturable in a CUDA graph).

Each query token ``t`` attends, with all its heads, to the cache slots its indexer chose:
``indices[t, :topk_length[t]]`` of global slot ids (``page * page_size + offset``), ``-1`` for
none; duplicates count as often as they are listed and the order does not matter. Shapes:

- ``q_nope [T, H, 512]``, ``q_pe [T, H, 64]``: bf16 or fp16 (the absorbed MLA query);
- ``cache``: the packed cache, uint8/int8/float8_e4m3fn ``[pages, page_size, 656]`` (vLLM),
  ``[pages, page_size, 1, 656]`` (FlashMLA) or ``[slots, 1, 656]`` (SGLang), or a 16-bit cache
  of the same tokens (bf16/fp16 ``[slots, 576]`` and the like: ``fp8mla.dsa.sparse_cache``);
- ``indices [T, topk]`` (or ``[T, 1, topk]``) int32, ``topk`` ≤ 16,384; ``topk_length [T]``
  int32 (optional);
- ``out [T, H, 512]`` in the query dtype; ``lse [T, H]`` float32, natural log.

A token with no slot to attend to gets out 0 and lse +inf (FlashMLA's convention). A slot id
below -1 or past the cache makes that token's out and lse NaN, and is never read; nor is any
slot the lists do not name, whatever its bytes. There is no causal flag: causality is the
indexer's. The softmax scale is the caller's (DeepSeek-V3.2: 192^-0.5 times its YaRN factor).
Values: bf16 queries against the FP8 values, float32 accumulation
(``fp8mla.kernels.portable.sparse_mla``); CPU tensors take the float32 PyTorch path.
"""

from __future__ import annotations

import dataclasses
import math
from collections import OrderedDict
from typing import Literal, overload

import torch

from fp8mla._checks import check_tensor, same_device
from fp8mla.attention.functional import shared_workspace
from fp8mla.attention.planner import device_sm_count
from fp8mla.attention.targets import launch_target
from fp8mla.attention.workspace import split_capacity, split_partials
from fp8mla.dsa.layout import MAX_PAGE_SIZE, NOPE_DIM, ROPE_DIM
from fp8mla.dsa.sparse_cache import DTYPES_16BIT, PACKED_DTYPES, SparseCache, sparse_cache
from fp8mla.dsa.sparse_copy import CopySparseLaunch
from fp8mla.dsa.sparse_launch import SparseLaunch
from fp8mla.dsa.sparse_plan import (
    COPY16,
    MAX_TOPK,
    SM90_KERNELS,
    SparsePlan,
    SparseTile,
    copy16_route,
    make_sparse_plan,
    sm90_kernel,
)
from fp8mla.dsa.sparse_sm90 import FP8QKSparseLaunch
from fp8mla.formats import Q_DTYPES
from fp8mla.runtime import interpreted, resolve_backend

MAX_HEADS = 128
KV_DTYPES = PACKED_DTYPES + DTYPES_16BIT


def _dtype_names(dtypes: tuple[torch.dtype, ...]) -> str:
    return ", ".join(str(d).removeprefix("torch.") for d in dtypes)


class SparseMLAWrapper:
    """Sparse MLA attention of a fixed shape: ``plan()`` once, ``run()`` per layer and step.

    Args:
        workspace: scratch memory on the device the attention runs on (any dtype; 128 MB is
            plenty): the split partials of short batches live here; a small one limits the
            splits.
        use_cuda_graph: the first ``plan()`` fixes the launch (grid, splits, workspace
            layout); a later plan must describe the same heads, topk, page size, dtypes and
            scale and at most as many tokens, and keeps it, so a graph captured after the first
            plan replays correctly. ``run()`` never syncs with the host: rewrite ``indices``
            (and ``topk_length``) in place between replays.
        backend: ``"triton"`` (the kernels; on CPU under ``TRITON_INTERPRET=1``), ``"torch"``
            (the float32 PyTorch path) or ``"auto"`` (Triton for CUDA tensors).

    Example:
        >>> w = SparseMLAWrapper(torch.empty(128 << 20, dtype=torch.uint8, device="cuda"))
        >>> w.plan(128, 16, 2048, 64, torch.bfloat16, 0.1352)
        >>> out = w.run(q_nope, q_pe, cache, indices)  # [128, 16, 512] bf16
    """

    def __init__(
        self, workspace: torch.Tensor, use_cuda_graph: bool = False, *, backend: str = "auto"
    ) -> None:
        check_tensor("workspace", workspace)
        self.device = workspace.device
        self._workspace = workspace
        self._use_cuda_graph = use_cuda_graph
        self._backend = resolve_backend(backend, self.device)
        self._plan: SparsePlan | None = None
        self._launch: SparseLaunch | None = None
        self._signature: tuple | None = None
        self._q_dtype: torch.dtype | None = None
        self._kv_dtype: torch.dtype | None = None
        self._page_size = 0
        self._sm_scale = 0.0

    # ------------------------------------------------------------------ plan
    def plan(
        self,
        num_tokens: int,
        num_heads: int,
        topk: int,
        page_size: int,
        q_data_type: torch.dtype,
        sm_scale: float,
        *,
        kv_data_type: torch.dtype = torch.uint8,
        num_splits: int | None = None,
        tile: SparseTile | None = None,
        fp8_cvt: str = "auto",
        kernel: str = "auto",
    ) -> None:
        """Describe the shape: up to ``num_tokens`` query tokens of ``num_heads`` heads, each
        with ``topk`` index-list entries, over a cache of ``page_size`` tokens per page
        (``[slots, 1, 656]`` pools take any), queries of ``q_data_type``, softmax scale
        ``sm_scale``. ``kv_data_type`` (keyword): the cache's dtype -- uint8 (int8,
        float8_e4m3fn) for the packed cache, bf16/fp16 for a 16-bit one. ``num_splits`` and
        ``tile`` override the planner (tuning, tests); ``fp8_cvt`` the e4m3 decoding (auto: the
        target's table's; ptx, int, portable, native). ``kernel``: ``"auto"`` (the target's
        table), ``"portable"`` (the Triton kernel every target runs), ``"fp8qk"``,
        ``"pingpong8"`` or ``"pingpong"`` (SM90, bf16 queries, the packed cache with its token
        rows following each other: the dense path's FP8 × FP8 decode kernel, or its ping-pong
        kernels of 64-row tiles for many heads -- FP8 stages, or fp16 tiles converted once by a
        producer warpgroup; ``fp8mla.dsa.sparse_sm90``), or ``"copy16"`` (the packed cache
        with its token rows following each other: the rows the lists reference dequantized
        once a call into an fp16 copy, then the dense path's 16-bit kernels; SM90's choice for
        prefill chunks at 128 heads; ``fp8mla.dsa.sparse_copy``)."""
        if kernel not in ("auto", "portable", COPY16, *SM90_KERNELS):
            raise ValueError(
                f"expected kernel auto, portable, fp8qk, pingpong8, pingpong or copy16, got "
                f"{kernel!r}"
            )
        for name, value, lo, hi in (
            ("num_tokens", num_tokens, 1, None),
            ("num_heads", num_heads, 1, MAX_HEADS),
            ("topk", topk, 1, MAX_TOPK),
            ("page_size", page_size, 1, MAX_PAGE_SIZE),
        ):
            if not isinstance(value, int) or value < lo or (hi is not None and value > hi):
                bound = f"[{lo}, {hi}]" if hi is not None else f">= {lo}"
                raise ValueError(f"expected {name} an int in {bound}, got {value!r}")
        if q_data_type not in Q_DTYPES:
            raise ValueError(f"expected q_data_type bf16 or fp16, got {q_data_type}")
        if kv_data_type not in KV_DTYPES:
            raise ValueError(
                f"expected kv_data_type in ({_dtype_names(KV_DTYPES)}), got {kv_data_type}"
            )
        try:
            scale = float(sm_scale)
        except (TypeError, ValueError):
            raise ValueError(f"expected sm_scale as a float, got {sm_scale!r}") from None
        if not (math.isfinite(scale) and scale > 0):
            raise ValueError(f"expected sm_scale finite and > 0, got {sm_scale}")
        signature = (num_heads, topk, page_size, q_data_type, kv_data_type, scale)
        if self._use_cuda_graph and self._plan is not None:
            self._check_graph_fit(signature, num_tokens)
            return
        launch = plan = None
        if self._backend == "triton":
            interp = interpreted()
            target = launch_target(self.device, interp)
            room = split_capacity(self._workspace, 1, NOPE_DIM) // (num_tokens * num_heads)
            plan = make_sparse_plan(
                num_tokens=num_tokens,
                num_heads=num_heads,
                topk=topk,
                sms=device_sm_count(self.device),
                target=target,
                max_splits_by_workspace=max(1, room),
                num_splits=num_splits,
                tile=tile,
            )
            overrides = tile is not None or num_splits is not None or fp8_cvt != "auto"
            if kernel in (COPY16, *SM90_KERNELS) and overrides:
                raise ValueError(
                    f'expected no tile, num_splits or fp8_cvt override with kernel="{kernel}" '
                    "(the dense kernel's planner chooses its own), got one"
                )
            # the overrides tune the portable kernel: they choose it
            asked = "portable" if overrides else kernel
            copy = copy16_route(asked, target, num_tokens, num_heads, topk, kv_data_type)
            # an automatic copy16 plan keeps the kernel it would run without the copy, for a
            # call whose copy does not fit the free memory
            sm90 = (
                None
                if copy and asked != "auto"
                else sm90_kernel(
                    asked, target, num_heads, q_data_type, kv_data_type, interp, num_tokens
                )  # fmt: skip
            )
            if copy:
                fallback = None if sm90 is None else FP8QKSparseLaunch(
                    num_tokens, num_heads, topk, scale, self._workspace, self.device, sm90
                )  # fmt: skip
                launch = CopySparseLaunch(num_tokens, num_heads, topk, scale, self._workspace,
                                          self.device, interp, fallback)  # fmt: skip
                dense = launch.plan
                plan = dataclasses.replace(
                    plan, tile=SparseTile(dense.config.block_m, dense.config.block_n, 4, 1),
                    head_groups=dense.m_tiles, num_splits=dense.num_splits, kernel=COPY16,
                )  # fmt: skip
            elif sm90 is not None:
                launch = FP8QKSparseLaunch(num_tokens, num_heads, topk, scale, self._workspace,
                                           self.device, sm90)  # fmt: skip
                dense = launch.sparse.plan
                plan = dataclasses.replace(
                    plan, tile=SparseTile(dense.config.block_m, dense.config.block_n, 4, 1),
                    head_groups=dense.m_tiles, num_splits=dense.num_splits, kernel=sm90,
                )  # fmt: skip
            else:
                partials = None
                if plan.split:
                    partials = split_partials(
                        self._workspace, plan.num_splits, num_tokens * num_heads, NOPE_DIM
                    )
                launch = SparseLaunch(
                    plan, sm_scale=scale, q_dtype=q_data_type, kv_dtype=kv_data_type,
                    partials=partials, device=self.device, target=target, interpreted=interp,
                    fp8_cvt=fp8_cvt,
                )  # fmt: skip
        else:
            plan = SparsePlan(
                SparseTile(0, 0, 0, 0), num_tokens, num_heads, topk, 1, 1, topk
            )  # the PyTorch path: the shape only
        self._plan, self._launch, self._signature = plan, launch, signature
        self._q_dtype, self._kv_dtype = q_data_type, kv_data_type
        self._page_size, self._sm_scale = page_size, scale

    def _check_graph_fit(self, signature: tuple, num_tokens: int) -> None:
        names = ("num_heads", "topk", "page_size", "q_data_type", "kv_data_type", "sm_scale")
        for name, want, got in zip(names, self._signature, signature):
            if want != got:
                raise ValueError(
                    f"expected {name} {want} under CUDA graphs (fixed by the first plan), got "
                    f"{got}; use one wrapper per captured shape"
                )
        if num_tokens > self._plan.num_tokens:
            raise ValueError(
                f"expected at most {self._plan.num_tokens} tokens under CUDA graphs (fixed by "
                f"the first plan), got {num_tokens}"
            )

    @property
    def launch_plan(self) -> SparsePlan | None:
        """The plan's tile, grid and splits (None before ``plan()``)."""
        return self._plan

    # ------------------------------------------------------------------ run
    @overload
    def run(self, q_nope: torch.Tensor, q_pe: torch.Tensor, cache: torch.Tensor,
            indices: torch.Tensor, topk_length: torch.Tensor | None = ...,
            out: torch.Tensor | None = ..., lse: torch.Tensor | None = ...,
            return_lse: Literal[False] = ...) -> torch.Tensor: ...  # fmt: skip

    @overload
    def run(self, q_nope: torch.Tensor, q_pe: torch.Tensor, cache: torch.Tensor,
            indices: torch.Tensor, topk_length: torch.Tensor | None = ...,
            out: torch.Tensor | None = ..., lse: torch.Tensor | None = ...,
            return_lse: Literal[True] = ...) -> tuple[torch.Tensor, torch.Tensor]: ...  # fmt: skip

    def run(
        self,
        q_nope: torch.Tensor,
        q_pe: torch.Tensor,
        cache: torch.Tensor,
        indices: torch.Tensor,
        topk_length: torch.Tensor | None = None,
        out: torch.Tensor | None = None,
        lse: torch.Tensor | None = None,
        return_lse: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Attention of the planned shape (module docstring): ``q_nope [T, H, 512]`` and
        ``q_pe [T, H, 64]`` with ``T`` up to the planned tokens (0: nothing is launched),
        ``indices [T, topk]``, optional ``topk_length [T]``, ``out [T, H, 512]`` and
        ``lse [T, H]`` float32. Returns ``out``, and ``lse`` (natural log) with
        ``return_lse``."""
        if self._plan is None:
            raise ValueError("expected plan() to be called before run(), got no plan")
        view, idx = self._check_run(q_nope, q_pe, cache, indices, topk_length)
        tokens, heads = q_nope.shape[0], q_nope.shape[1]
        if out is None:
            out = torch.empty(tokens, heads, NOPE_DIM, dtype=q_nope.dtype, device=self.device)
        else:
            check_tensor("out", out, dtypes=(q_nope.dtype,), device=self.device,
                         shape=(tokens, heads, NOPE_DIM))  # fmt: skip
            if out.stride(2) != 1:
                raise ValueError(
                    f"expected out with unit stride in its last dim, got {out.stride()}"
                )
        if lse is not None:
            check_tensor("lse", lse, dtypes=(torch.float32,), device=self.device,
                         shape=(tokens, heads))  # fmt: skip
            if tokens and lse.stride(1) != 1:
                raise ValueError(f"expected lse with unit stride over heads, got {lse.stride()}")
        elif return_lse:
            lse = torch.empty(tokens, heads, dtype=torch.float32, device=self.device)
        if tokens == 0:  # a rank with no tokens this step: nothing to launch on any route
            return (out, lse) if return_lse else out
        if self._launch is None:
            from fp8mla.dsa.reference import sparse_mla_reference

            o, s = sparse_mla_reference(q_nope, q_pe, cache, idx, self._sm_scale, topk_length,
                                        dtype=torch.float32)  # fmt: skip
            out.copy_(o)
            if lse is not None:
                lse.copy_(s)
        else:
            self._launch(q_nope, q_pe, view, idx, topk_length, out, lse)
        return (out, lse) if return_lse else out

    def _check_run(
        self,
        q_nope: torch.Tensor,
        q_pe: torch.Tensor,
        cache: torch.Tensor,
        indices: torch.Tensor,
        topk_length: torch.Tensor | None,
    ) -> tuple[SparseCache, torch.Tensor]:
        """The run's inputs against the plan: the cache's view and the ``[T, topk]`` indices."""
        plan, dev = self._plan, self.device
        check_tensor("q_nope", q_nope, ndim=3, dtypes=(self._q_dtype,), device=dev)
        tokens = q_nope.shape[0]
        if q_nope.shape[1:] != (plan.num_heads, NOPE_DIM) or tokens > plan.num_tokens:
            raise ValueError(
                f"expected q_nope of shape [T <= {plan.num_tokens}, {plan.num_heads}, "
                f"{NOPE_DIM}] (the plan), got {list(q_nope.shape)}"
            )
        check_tensor("q_pe", q_pe, dtypes=(self._q_dtype,), device=dev,
                     shape=(tokens, plan.num_heads, ROPE_DIM))  # fmt: skip
        for name, t in (("q_nope", q_nope), ("q_pe", q_pe)):
            if t.numel() and t.stride(2) != 1:
                raise ValueError(
                    f"expected {name} with unit stride in its last dim, got {t.stride()}"
                )
        if not isinstance(cache, torch.Tensor) or cache.dtype != self._kv_dtype:
            got = cache.dtype if isinstance(cache, torch.Tensor) else type(cache).__name__
            raise ValueError(f"expected the cache of dtype {self._kv_dtype} (the plan), got {got}")
        if not same_device(cache.device, dev):
            raise ValueError(f"expected the cache on {dev}, got {cache.device}")
        view = sparse_cache(cache)
        one_pool = cache.dim() == 3 and cache.shape[1] == 1 or cache.dim() == 2
        if not one_pool and cache.shape[1] != self._page_size:
            raise ValueError(
                f"expected a cache of page size {self._page_size} (the plan), got shape "
                f"{list(cache.shape)}"
            )
        check_tensor("indices", indices, dtypes=(torch.int32,), device=dev)
        idx = indices[:, 0] if indices.dim() == 3 and indices.shape[1] == 1 else indices
        if idx.dim() != 2 or idx.shape[0] != tokens or idx.shape[1] != plan.topk:
            raise ValueError(
                f"expected indices of shape [{tokens}, {plan.topk}] or [{tokens}, 1, "
                f"{plan.topk}] (T of q_nope, topk of the plan), got {list(indices.shape)}"
            )
        if tokens and idx.stride(1) != 1:
            raise ValueError(f"expected indices with unit stride over topk, got {idx.stride()}")
        if topk_length is not None:
            check_tensor("topk_length", topk_length, dtypes=(torch.int32,), device=dev,
                         shape=(tokens,))  # fmt: skip
            if tokens and topk_length.stride(0) != 1:
                raise ValueError("expected a contiguous topk_length, got a strided one")
        return view, idx


_WRAPPERS: OrderedDict[tuple, SparseMLAWrapper] = OrderedDict()
WRAPPERS_KEPT = 64  # planned shapes sparse_mla remembers (layers share theirs)


@overload
def sparse_mla(q_nope: torch.Tensor, q_pe: torch.Tensor, cache: torch.Tensor,
               indices: torch.Tensor, sm_scale: float, *, topk_length: torch.Tensor | None = ...,
               out: torch.Tensor | None = ..., return_lse: Literal[False] = ...,
               backend: str = ...) -> torch.Tensor: ...  # fmt: skip


@overload
def sparse_mla(q_nope: torch.Tensor, q_pe: torch.Tensor, cache: torch.Tensor,
               indices: torch.Tensor, sm_scale: float, *, topk_length: torch.Tensor | None = ...,
               out: torch.Tensor | None = ..., return_lse: Literal[True] = ...,
               backend: str = ...) -> tuple[torch.Tensor, torch.Tensor]: ...  # fmt: skip


def sparse_mla(
    q_nope: torch.Tensor,
    q_pe: torch.Tensor,
    cache: torch.Tensor,
    indices: torch.Tensor,
    sm_scale: float,
    *,
    topk_length: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    return_lse: bool = False,
    backend: str = "auto",
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Sparse MLA attention in one call (module docstring for the shapes and semantics); the
    plan of each shape is kept, so repeated calls (layers, steps) only launch.

    Example (CPU, the PyTorch path)::

        >>> cache = torch.zeros(4, 64, 656, dtype=torch.uint8)  # 256 slots, all values 0
        >>> q_nope = torch.randn(2, 16, 512, dtype=torch.bfloat16)
        >>> q_pe = torch.randn(2, 16, 64, dtype=torch.bfloat16)
        >>> indices = torch.tensor([[3, 70, -1], [-1, -1, -1]], dtype=torch.int32)
        >>> out, lse = sparse_mla(q_nope, q_pe, cache, indices, 0.1352, return_lse=True)
        >>> out.shape, lse[1, 0].item()  # token 1 lists no slot: out 0, lse +inf
        (torch.Size([2, 16, 512]), inf)
    """
    check_tensor("q_nope", q_nope, ndim=3)
    check_tensor("cache", cache)
    check_tensor("indices", indices)
    tokens, heads = q_nope.shape[0], q_nope.shape[1]
    topk = indices.shape[-1]
    page = cache.shape[1] if cache.dim() >= 3 and cache.shape[1] > 1 else 1
    key = (q_nope.device, tokens, heads, topk, page, q_nope.dtype, cache.dtype,
           float(sm_scale) if isinstance(sm_scale, (int, float)) else sm_scale, backend)  # fmt: skip
    w = _WRAPPERS.get(key)
    if w is None:
        w = SparseMLAWrapper(shared_workspace(q_nope.device), backend=backend)
        w.plan(max(tokens, 1), heads, topk, page, q_nope.dtype, sm_scale,
               kv_data_type=cache.dtype)  # fmt: skip
        if len(_WRAPPERS) >= WRAPPERS_KEPT:
            _WRAPPERS.popitem(last=False)
        _WRAPPERS[key] = w
    else:
        _WRAPPERS.move_to_end(key)
    return w.run(q_nope, q_pe, cache, indices, topk_length, out, return_lse=return_lse)


__all__ = ["SparseMLAWrapper", "sparse_mla"]
