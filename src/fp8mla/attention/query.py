"""FP8 (e4m3) queries: what ``plan()`` decides for them and what ``run()`` does before the attention.

The query's true value is ``q_fp8 × q_scale``: one scale for the tensor (a float, or a
1-element fp32 device tensor such as vLLM's ``layer._q_scale``, read by the kernels) or one per
(token, head) row (``[T, H]`` fp32). With ``quantize_q`` the caller hands 16-bit queries and
``run()`` quantizes them per row, ``amax / 448``, inside the call.

Two routes, fixed at ``plan()`` by the registry (``Variant.fp8_queries``):

- **direct**: the chosen kernel has an FP8-query build (the portable ``rows`` kernel; on SM90
  the FP8 × FP8 Gluon kernel ``fp8qk``, ``Variant.fp8_queries_planned``) and reads the e4m3
  codes and their scale itself; with ``quantize_q`` one fused kernel
  (``kernels/portable/q_quant.py``) first writes codes and row scales into buffers the plan owns.
- **converted**: every other kernel (the other SM90 Gluon kernels) reads bf16 queries: the same
  fused kernel writes ``q_fp8 × q_scale`` in bf16 (``quantize_q``: the 16-bit queries rounded
  through e4m3 first, the function the direct route computes) and the kernel reads those.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import torch

from fp8mla._checks import check_last_dim_contiguous, check_tensor
from fp8mla.attention.config import KernelConfig
from fp8mla.attention.kernel_launcher import KernelLauncher
from fp8mla.attention.targets import Target
from fp8mla.formats import FP8_MAX, HEAD_DIM_CKV, Q_DTYPES

Q_FP8_DTYPE = torch.float8_e4m3fn
CONVERTED_DTYPE = torch.bfloat16  # what the converted route's kernels read
# the kernels' Q_FP8 builds and Q_SCALE sources (kernels/portable/fp8_query.py)
QF8_NONE, QF8_CVT, QF8_DOT = 0, 1, 2
QS_VALUE, QS_TENSOR, QS_ROWS = 0, 1, 2
PREP_ROWS = 8  # query rows per program of the fused pass


@dataclass(frozen=True)
class QueryScale:
    """``run()``'s ``q_scale``, checked: where the kernels read it from (``QS_*``)."""

    mode: int = QS_VALUE
    value: float = 1.0
    tensor: torch.Tensor | None = None
    stride: int = 0  # token stride of a [T, H] tensor


@dataclass(frozen=True)
class QueryPlan:
    """What ``plan()`` fixed for FP8 queries (or ``quantize_q``)."""

    run_dtype: torch.dtype  # the dtype run() takes
    quantize: bool
    direct: bool  # the attention kernel reads e4m3 queries (else bf16 from the fused pass)
    mode: int  # QF8_CVT / QF8_DOT on the direct route, QF8_NONE converted

    @property
    def prepares(self) -> bool:
        """``run()`` launches the fused pass before the attention."""
        return self.quantize or not self.direct


def check_query_types(
    q_data_type: torch.dtype, quantize_q: bool, o_data_type: torch.dtype | None
) -> tuple[bool, torch.dtype]:
    """``(fp8 queries or quantize_q, output dtype)`` for plan()'s arguments, or ValueError."""
    if q_data_type not in (*Q_DTYPES, Q_FP8_DTYPE):
        raise ValueError(f"expected q_data_type bf16, fp16 or float8_e4m3fn, got {q_data_type}")
    if quantize_q and q_data_type not in Q_DTYPES:
        raise ValueError(f"expected bf16 or fp16 queries with quantize_q=True, got {q_data_type}")
    fp8 = quantize_q or q_data_type == Q_FP8_DTYPE
    default = torch.bfloat16 if q_data_type == Q_FP8_DTYPE else q_data_type
    out = default if o_data_type is None else o_data_type
    if out not in Q_DTYPES or (not fp8 and out != q_data_type):
        allowed = "bf16 or fp16" if fp8 else str(q_data_type)
        raise ValueError(f"expected o_data_type {allowed} with these queries, got {out}")
    return fp8, out


def fp8_query_mode(target: Target, kv_dtype: torch.dtype, config: KernelConfig) -> int:
    """The FP8-query build of the portable kernel for ``target``: e4m3 × e4m3 dots where the
    target has FP8 tensor cores (CUDA SM89+) and the pool is e4m3 in tiles of ≥ 32 tokens (the
    FP8 MMA's depth), and under the interpreter (which computes those dots: the tests cover
    the build the GPUs run); elsewhere the codes decoded to the 16-bit dot dtype."""
    fp8_cores = target.backend == "interpreter" or (target.backend == "cuda" and target.native_fp8)
    if fp8_cores and kv_dtype == Q_FP8_DTYPE and config.block_n >= 32:
        return QF8_DOT
    return QF8_CVT


def check_q_scale(
    q_scale: float | torch.Tensor | None,
    tokens: int,
    heads: int,
    device: torch.device,
    plan: QueryPlan | None,
) -> QueryScale | None:
    """``q_scale`` as the kernels read it: None (1.0), a finite positive real, a 0-d or
    1-element fp32 tensor on the run device (read by the kernel: no host sync; a CPU tensor
    with a CUDA run device is read on the host), or ``[tokens, heads]`` fp32 per row. Only
    FP8 queries take one (``plan`` None: 16-bit queries; ``quantize_q``: made in the call)."""
    if plan is None or plan.quantize:
        if q_scale is not None:
            raise ValueError(f"expected q_scale only with FP8 queries, got {type(q_scale)}")
        return None
    if type(q_scale) is float and 0.0 < q_scale < math.inf:
        return QueryScale(QS_VALUE, q_scale)
    if q_scale is None:
        return QueryScale()
    if isinstance(q_scale, torch.Tensor):
        if q_scale.dim() == 2:
            check_tensor("q_scale", q_scale, shape=(tokens, heads), dtypes=(torch.float32,),
                         device=device)  # fmt: skip
            check_last_dim_contiguous("q_scale", q_scale)
            return QueryScale(QS_ROWS, 1.0, q_scale, q_scale.stride(0))
        if q_scale.numel() != 1 or q_scale.dim() > 1:
            raise ValueError(
                f"expected q_scale as a float, a 1-element tensor or [{tokens}, {heads}], got "
                f"shape {list(q_scale.shape)}"
            )
        if q_scale.device.type == "cpu" and device.type != "cpu":
            q_scale = float(q_scale.item())
        else:
            check_tensor("q_scale", q_scale, dtypes=(torch.float32,), device=device)
            return QueryScale(QS_TENSOR, 1.0, q_scale.reshape(1))
    if isinstance(q_scale, bool) or not isinstance(q_scale, numbers.Real):
        raise ValueError(f"expected q_scale as a float or a tensor, got {type(q_scale).__name__}")
    value = float(q_scale)
    if not (math.isfinite(value) and value > 0.0):
        raise ValueError(f"expected q_scale finite and > 0, got {value}")
    return QueryScale(QS_VALUE, value)


class QueryPrep:
    """The fused pass over one plan's queries (``q_quant_kernel``, one launch) and its output
    buffers, allocated at ``plan()`` (``reuse``: the previous plan's, when they are big enough,
    as a captured CUDA graph keeps reading them).

    Args:
        plan: the plan's :class:`QueryPlan` (``prepares`` is true).
        tokens, heads, head_dim_kpe: the batch's query shape.
        device: where it runs.
        reuse: the previous plan's pass, whose buffers are kept when they hold this batch.
    """

    def __init__(
        self,
        plan: QueryPlan,
        *,
        tokens: int,
        heads: int,
        head_dim_kpe: int,
        device: torch.device,
        reuse: QueryPrep | None = None,
    ) -> None:
        from fp8mla.kernels.portable.q_quant import q_quant_kernel

        self.plan = plan
        self.out_fp8 = plan.direct  # codes and row scales for the FP8-query build
        self.tokens, self.heads, self.d_kpe = tokens, heads, head_dim_kpe
        rows = max(tokens * heads, 1)
        dtype = torch.uint8 if self.out_fp8 else CONVERTED_DTYPE
        width = HEAD_DIM_CKV + head_dim_kpe
        old = reuse._storage if reuse is not None else None
        if old is not None and old.dtype == dtype and old.numel() >= rows * width:
            self._storage, self._scales = old, reuse._scales
        else:
            self._storage = torch.empty(rows * width, dtype=dtype, device=device)
            self._scales = torch.empty(rows, dtype=torch.float32, device=device)
        flat = self._storage[: tokens * heads * width].view(tokens, heads, width)
        self.q_nope, self.q_pe = flat[..., :HEAD_DIM_CKV], flat[..., HEAD_DIM_CKV:]
        self.row_scales = self._scales[: tokens * heads].view(tokens, heads)
        self.kernel = KernelLauncher(
            q_quant_kernel, (-(-rows // PREP_ROWS), 1, 1), {"num_warps": 4},
            device.index if device.type == "cuda" and device.index is not None else 0,
        )  # fmt: skip
        # the kernel writes integers: e4m3 codes, or bf16 bits
        self._out = self.q_nope if self.out_fp8 else self.q_nope.view(torch.int16)
        self._out_pe = self.q_pe if self.out_fp8 else self.q_pe.view(torch.int16)

    def __call__(
        self, q_nope: torch.Tensor, q_pe: torch.Tensor, scale: QueryScale | None
    ) -> tuple[torch.Tensor, torch.Tensor, QueryScale | None]:
        """The queries the attention kernel reads and their scale (None: bf16 values);
        ``scale`` None with ``quantize_q``."""
        scale = scale or QueryScale()
        fp8_in = q_nope.dtype == Q_FP8_DTYPE
        if fp8_in:  # bytes: SM80/86 Triton has no e4m3 pointers
            q_nope, q_pe = q_nope.view(torch.uint8), q_pe.view(torch.uint8)
        pe = q_pe if self.d_kpe else q_nope
        src = scale.tensor if scale.tensor is not None else self._scales
        args = dict(
            q_nope_ptr=q_nope, q_pe_ptr=pe, scale_ptr=src, out_nope_ptr=self._out,
            out_pe_ptr=self._out_pe if self.d_kpe else self._out, out_scale_ptr=self._scales,
            stride_qn_t=q_nope.stride(0), stride_qn_h=q_nope.stride(1),
            stride_qp_t=pe.stride(0), stride_qp_h=pe.stride(1), stride_s_t=scale.stride,
            stride_o_t=self._out.stride(0), stride_o_h=self._out.stride(1),
            num_heads=self.heads, num_tokens=self.tokens, scale_val=scale.value,
            D_CKV=HEAD_DIM_CKV, D_KPE=self.d_kpe, ROWS=PREP_ROWS, IN_FP8=fp8_in,
            SCALE=scale.mode, QUANT=self.plan.quantize, OUT_FP8=self.out_fp8,
        )  # fmt: skip
        if self.tokens:
            self.kernel.launch(args, _specialization(args))
        if not self.out_fp8:
            return self.q_nope, self.q_pe, None
        return self.q_nope, self.q_pe, QueryScale(QS_ROWS, 1.0, self.row_scales, self.heads)


def _specialization(args: dict) -> tuple:
    """What Triton specializes the fused pass on: 16-byte alignment of each pointer, and of
    each integer whether it is 1 or divisible by 16 (with the dtypes and constexprs)."""
    key = []
    for name, v in args.items():
        if isinstance(v, torch.Tensor):
            key.append((v.dtype, v.data_ptr() % 16 == 0))
        elif isinstance(v, int) and name.startswith("stride"):
            key.append((v == 1, v % 16 == 0))
        elif name.isupper():
            key.append(v)
    return tuple(key)


def reference_queries(
    q_nope: torch.Tensor, q_pe: torch.Tensor, scale: QueryScale, quantize: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """The queries' true values in float32, as the kernels see them (the PyTorch backend):
    ``q_fp8 × q_scale``, or 16-bit queries rounded through e4m3 per row (``quantize``)."""
    qn, qp = q_nope.float(), q_pe.float()
    if quantize:
        return quantize_rows(qn, qp)[:2]
    if scale.mode == QS_ROWS:
        s = scale.tensor.float()[..., None]
    elif scale.mode == QS_TENSOR:
        s = scale.tensor.float().reshape(())
    else:
        s = scale.value
    return qn * s, qp * s


def quantize_rows(
    q_nope: torch.Tensor, q_pe: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``quantize_q``'s rounding in PyTorch: per (token, head) row, ``scale = amax / 448`` of
    both parts, codes ``q × (1 / scale)`` rounded to e4m3. Returns the dequantized parts
    (float32), the codes of each part and the scales ``[T, H]``."""
    qn, qp = q_nope.float(), q_pe.float()
    amax = torch.maximum(qn.abs().amax(-1), qp.abs().amax(-1) if qp.shape[-1] else qn.new_zeros(()))
    scale = torch.where(amax > 0, amax / FP8_MAX[Q_FP8_DTYPE], torch.ones_like(amax))
    inv = (1.0 / scale)[..., None]
    big = FP8_MAX[Q_FP8_DTYPE]
    cn = (qn * inv).clamp(-big, big).to(Q_FP8_DTYPE)
    cp = (qp * inv).clamp(-big, big).to(Q_FP8_DTYPE)
    s = scale[..., None]
    return cn.float() * s, cp.float() * s, cn, cp, scale


def named_build(options: dict | None, plan: QueryPlan | None) -> int | None:
    """The FP8-query build ``plan(kernel_options={"Q_FP8": ...})`` names (``QF8_*``), or
    None; ValueError without FP8 queries (the kernel would read 16-bit queries as codes)."""
    build = (options or {}).get("Q_FP8")
    if build is not None and (plan is None or build not in (QF8_NONE, QF8_CVT, QF8_DOT)):
        raise ValueError(f"expected Q_FP8 0, 1 or 2 with FP8 queries (or quantize_q), got {build}")
    return build


def route_queries(
    queries: QueryPlan,
    config: KernelConfig,
    target: Target,
    kv_dtype: torch.dtype,
    out_dtype: torch.dtype,
    forced: int | None = None,
) -> QueryPlan:
    """The route of FP8 queries to the kernel the planner chose (``config``): direct where
    its variant has an FP8-query build (``Variant.fp8_queries``), in :func:`fp8_query_mode`'s
    build, or a Gluon one the planner takes (``Variant.fp8_queries_planned``); else converted
    to bf16 (the other Gluon kernels, which write bf16 outputs). ``forced``:
    ``plan(kernel_options={"Q_FP8": ...})`` names the build (``QF8_NONE``: converted), also
    of a kernel whose FP8-query build runs on request only (``Variant.fp8_queries_on_request``;
    a Gluon kernel reads the codes in FP8 wgmma whichever nonzero build is named)."""
    from fp8mla.attention.variants import get_variant

    variant = get_variant(config.variant)
    mode = fp8_query_mode(target, kv_dtype, config) if variant.fp8_queries else QF8_NONE
    if forced is not None and variant.fp8_queries:
        mode = int(forced)
    elif forced is not None and variant.fp8_queries_on_request:  # its one build: FP8 wgmma
        mode = QF8_DOT if forced else QF8_NONE
    elif variant.fp8_queries_planned:
        mode = QF8_DOT
    if variant.gluon and out_dtype != torch.bfloat16:
        raise ValueError(
            f"expected o_data_type bf16 for the {variant.name} kernel, got {out_dtype}"
        )
    return QueryPlan(queries.run_dtype, queries.quantize, mode != QF8_NONE, mode)
