"""The implementations measured side by side, each prepared outside the timed region.

Every factory returns a zero-argument callable that computes ``out [tokens, H, 512]`` for
the inputs, or raises :class:`Unavailable` when it cannot run here.
"""

from __future__ import annotations

import importlib
import importlib.util
import math
import sys
import types
from collections.abc import Callable
from pathlib import Path

import torch

from fp8mla.attention.functional import shared_workspace
from fp8mla.attention.wrapper import BatchMLAPagedAttentionWrapper
from fp8mla.bench.inputs import BenchInputs

SM_SCALE = 1 / math.sqrt(192)
WORKSPACE_BYTES = 256 << 20

Runner = Callable[[], torch.Tensor]


class Unavailable(RuntimeError):
    """The implementation cannot run in this environment or on this case."""


def planned_wrapper(
    inp: BenchInputs,
    kv_dtype: torch.dtype,
    *,
    kv_indptr=None,
    kv_indices=None,
    page_size=None,
    **plan_kw: object,
) -> BatchMLAPagedAttentionWrapper:
    """A Triton-backend wrapper planned for the inputs (``plan_kw``: fp8mla's tuning
    overrides ``num_splits`` / ``kernel_config``)."""
    w = BatchMLAPagedAttentionWrapper(
        shared_workspace(inp.pool.device, WORKSPACE_BYTES), backend="triton"
    )
    w.plan(
        inp.qo_indptr,
        inp.kv_indptr if kv_indptr is None else kv_indptr,
        inp.kv_indices if kv_indices is None else kv_indices,
        inp.kv_len,
        inp.case.heads,
        512,
        64,
        page_size or inp.page_size,
        inp.case.qo_len > 1,
        SM_SCALE,
        plan_kw.pop("q_data_type", torch.bfloat16),
        kv_dtype,
        **plan_kw,
    )
    return w


def fp8mla_direct(inp: BenchInputs, **plan_kw: object) -> Runner:
    """Our kernel reading the pool in its storage dtype."""
    w = planned_wrapper(inp, inp.pool.dtype, **plan_kw)
    ckv, kpe = inp.paged()
    out = torch.empty_like(inp.q_nope)
    s = inp.scale
    return lambda: w.run(inp.q_nope, inp.q_pe, ckv, kpe, out=out, ckv_scale=s, kpe_scale=s)


def fp8mla_fp8q(
    inp: BenchInputs, fused: bool = False, on_request: bool = False, fp8_values: bool = False
) -> Runner:
    """Our kernels with FP8 (e4m3) queries over the pool. ``fused=False``: the queries are
    quantized outside the timed region, one scale per tensor (``amax / 448``, as vLLM's
    ``_q_scale``, here a device tensor); ``fused``: ``plan(quantize_q=True)``, the bf16
    queries quantized per (token, head) inside each timed call. ``on_request``: the planned
    kernel's FP8-query build that runs only where a plan names it
    (``Variant.fp8_queries_on_request``; Unavailable for a kernel without one);
    ``fp8_values``: that build with ``P·V`` on FP8 tensor cores too (``PV_FP8``, ``P`` in
    e4m3; Unavailable for a kernel without them)."""
    from fp8mla.attention.query import QF8_DOT
    from fp8mla.attention.variants import get_variant

    e4m3 = torch.float8_e4m3fn
    if fused:
        w = planned_wrapper(inp, inp.pool.dtype, quantize_q=True)
        qn, qp, kw = inp.q_nope, inp.q_pe, {}
    else:
        w = planned_wrapper(inp, inp.pool.dtype, q_data_type=e4m3)
        if on_request:
            name = w.launch_info.variant if w.launch_info is not None else "none"
            if not get_variant(name).fp8_queries_on_request:
                raise Unavailable(f"the planned kernel ({name}) has no FP8-query build to name")
            opts = {"Q_FP8": QF8_DOT}
            if fp8_values:
                from fp8mla.attention.kernel_launcher import declared_options

                if "PV_FP8" not in declared_options(get_variant(name).load()):
                    raise Unavailable(f"the planned kernel ({name}) has no FP8 value products")
                opts["PV_FP8"] = 1
            w = planned_wrapper(inp, inp.pool.dtype, q_data_type=e4m3, kernel_options=opts)
        amax = torch.maximum(inp.q_nope.abs().amax(), inp.q_pe.abs().amax()).float()
        q_scale = (amax / 448).reshape(1)
        qn = (inp.q_nope.float() / q_scale).to(torch.float8_e4m3fn)
        qp = (inp.q_pe.float() / q_scale).to(torch.float8_e4m3fn)
        kw = {"q_scale": q_scale}
    ckv, kpe = inp.paged()
    out = torch.empty_like(inp.q_nope)
    s = inp.scale
    return lambda: w.run(qn, qp, ckv, kpe, out=out, ckv_scale=s, kpe_scale=s, **kw)


def fp8mla_bf16kv(inp: BenchInputs, bf16_pool: torch.Tensor) -> Runner:
    """Our kernel on a bf16 pool holding the same (dequantized) values."""
    w = planned_wrapper(inp, torch.bfloat16)
    ckv, kpe = inp.paged(bf16_pool)
    out = torch.empty_like(inp.q_nope)
    return lambda: w.run(inp.q_nope, inp.q_pe, ckv, kpe, out=out)


def full_pool_cast(inp: BenchInputs) -> Runner:
    """``pool.to(bf16)`` of the whole pool, then our bf16 kernel (what engines ship)."""
    w = planned_wrapper(inp, torch.bfloat16)
    out = torch.empty_like(inp.q_nope)
    s = inp.scale

    def run() -> torch.Tensor:
        ckv, kpe = inp.paged(inp.pool.to(torch.bfloat16))
        return w.run(inp.q_nope, inp.q_pe, ckv, kpe, out=out, ckv_scale=s, kpe_scale=s)

    return run


def gather_then_cast(inp: BenchInputs) -> Runner:
    """Gather the active tokens, cast them, then our bf16 kernel over the compact copy."""
    case = inp.case
    dev = inp.pool.device
    i32 = dict(dtype=torch.int32, device=dev)
    n = inp.token_slots.numel()
    w = planned_wrapper(
        inp,
        torch.bfloat16,
        page_size=1,
        kv_indptr=torch.arange(0, n + 1, case.context, **i32),
        kv_indices=torch.arange(n, **i32),
    )
    out = torch.empty_like(inp.q_nope)
    rows = inp.pool.view(inp.pool.shape[0], -1)
    s = inp.scale

    def run() -> torch.Tensor:
        active = rows.index_select(0, inp.token_slots).to(torch.bfloat16).view(n, 1, -1)
        return w.run(
            inp.q_nope,
            inp.q_pe,
            active[..., :512],
            active[..., 512:],
            out=out,
            ckv_scale=s,
            kpe_scale=s,
        )

    return run


SDPA_SCORE_BYTES = 8 << 30  # fp32 scores one SDPA call may materialise (math backend)


def torch_sdpa(inp: BenchInputs) -> Runner:
    """Gather the active tokens, dequantize them to bf16, then PyTorch's
    ``scaled_dot_product_attention`` per request (one shared KV head, bottom-right causal
    mask), over head groups small enough for the math backend's score matrix. Extend and
    speculative cases only: head dim 576 has no fused SDPA backend, so this is the
    reference point an engine gets from PyTorch alone."""
    from torch.nn.attention.bias import causal_lower_right

    case = inp.case
    if case.qo_len == 1:
        raise Unavailable("extend cases only")
    n = inp.token_slots.numel()
    rows = inp.pool.view(inp.pool.shape[0], -1)
    heads_per_call = max(1, min(case.heads, SDPA_SCORE_BYTES // (4 * case.qo_len * case.context)))
    out = torch.empty_like(inp.q_nope)
    q_all = torch.cat([inp.q_nope, inp.q_pe], dim=-1).transpose(0, 1)  # [H, T, 576]

    def run() -> torch.Tensor:
        kv = (rows.index_select(0, inp.token_slots).float() * inp.scale).to(torch.bfloat16)
        kv = kv.view(case.batch, case.context, -1)
        mask = causal_lower_right(case.qo_len, case.context)
        for b in range(case.batch):
            k = kv[b][None, None]  # [1, 1, context, 576]
            q_rows = slice(b * case.qo_len, (b + 1) * case.qo_len)
            for h0 in range(0, case.heads, heads_per_call):
                q = q_all[h0 : h0 + heads_per_call, q_rows][None]
                o = torch.nn.functional.scaled_dot_product_attention(
                    q, k, k[..., :512], attn_mask=mask, scale=SM_SCALE, enable_gqa=True
                )
                out[q_rows, h0 : h0 + heads_per_call] = o[0].transpose(0, 1)
        return out

    assert n == case.batch * case.context
    return run


def torch_reference(inp: BenchInputs) -> Runner:
    """The float32 PyTorch reference (gathers per request); small cases only."""
    from fp8mla.reference import mla_reference

    if inp.token_slots.numel() > (1 << 16) or inp.case.qo_len > 16:
        raise Unavailable("too large for the per-request PyTorch loop")
    ckv, kpe = inp.paged()

    def run() -> torch.Tensor:
        out, _ = mla_reference(
            inp.q_nope,
            inp.q_pe,
            ckv,
            kpe,
            inp.qo_indptr,
            inp.kv_indptr,
            inp.kv_indices,
            inp.kv_len,
            sm_scale=SM_SCALE,
            causal=inp.case.qo_len > 1,
            ckv_scale=inp.scale,
            kpe_scale=inp.scale,
            dtype=torch.float32,
        )
        return out

    return run


# -- optional baselines, when importable ---------------------------------------------------
SGLANG_MODULES = (
    "sglang.srt.layers.attention.triton_ops.decode_attention",
    "sglang.kernels.ops.attention.decode_attention",
)


def load_sglang_decode(path: str | None = None) -> types.ModuleType:
    """SGLang's Triton decode-attention module: installed, or a single file (``path``) from an
    unpacked wheel, loaded with a stub for its one helper import."""
    if path is None:
        for name in SGLANG_MODULES:
            try:
                return importlib.import_module(name)
            except Exception:  # noqa: BLE001 - any import failure means "not available"
                continue
        raise Unavailable("sglang is not importable")
    if "sglang.srt.utils" not in sys.modules:
        for pkg in ("sglang", "sglang.srt"):
            sys.modules.setdefault(pkg, types.ModuleType(pkg))
        utils = types.ModuleType("sglang.srt.utils")
        utils.is_hip = lambda: False  # type: ignore[attr-defined]
        sys.modules["sglang.srt.utils"] = utils
    spec = importlib.util.spec_from_file_location("sglang_decode_attention", Path(path))
    if spec is None or spec.loader is None:
        raise Unavailable(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def sglang_triton(inp: BenchInputs, module: types.ModuleType, num_kv_splits: int = 8) -> Runner:
    """SGLang's split-KV Triton MLA decode on the same FP8 pool (token-level indices)."""
    case = inp.case
    if case.qo_len != 1:
        raise Unavailable("decode only")
    dev = inp.pool.device
    b, h = case.batch, case.heads
    q = torch.cat([inp.q_nope, inp.q_pe], dim=-1)
    k_buffer = inp.pool
    v_buffer = inp.pool[..., :512]
    kv_indptr = torch.arange(0, b * case.context + 1, case.context, dtype=torch.int32, device=dev)
    kv_indices = inp.token_slots.to(torch.int32)
    logits = torch.empty(b, h, num_kv_splits, 512, dtype=torch.float32, device=dev)
    lse = torch.empty(b, h, num_kv_splits, dtype=torch.float32, device=dev)
    splits = torch.full((b,), num_kv_splits, dtype=torch.int32, device=dev)
    out = torch.empty(b, h, 512, dtype=torch.bfloat16, device=dev)

    def run() -> torch.Tensor:
        module.decode_attention_fwd(
            q,
            k_buffer,
            v_buffer,
            out,
            kv_indptr,
            kv_indices,
            logits,
            lse,
            splits,
            num_kv_splits,
            SM_SCALE * inp.scale,
        )
        return out

    return run


FLASHINFER_ENV = "FP8MLA_FLASHINFER"  # a directory holding the flashinfer package
_FI_WORKSPACES: dict[torch.device, torch.Tensor] = {}


def _flashinfer_workspace(device: torch.device) -> torch.Tensor:
    """FlashInfer's own scratch buffer (not shared with fp8mla's wrappers)."""
    if device not in _FI_WORKSPACES:
        _FI_WORKSPACES[device] = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
    return _FI_WORKSPACES[device]


def load_flashinfer(path: str | None = None) -> types.ModuleType:
    """``flashinfer.mla``: installed, or from ``path`` (or ``$FP8MLA_FLASHINFER``), a folder
    holding the ``flashinfer`` package and its dependencies (an unpacked wheel, e.g. a trimmed
    FlashInfer 0.7 copy). Its JIT cache goes to ``$FLASHINFER_WORKSPACE_BASE`` (default: a
    temporary folder); prebuilt modules in ``<path>/_fi_prebuilt`` are used when present."""
    import os
    import tempfile

    path = path or os.environ.get(FLASHINFER_ENV)
    if path:
        folder = Path(path)
        if not (folder / "flashinfer").is_dir():
            raise Unavailable(f"no flashinfer package in {folder}")
        if str(folder) not in sys.path:
            sys.path.insert(0, str(folder))
        os.environ.setdefault(
            "FLASHINFER_WORKSPACE_BASE", os.path.join(tempfile.gettempdir(), "fp8mla_flashinfer")
        )
        if torch.cuda.is_available():
            major, minor = torch.cuda.get_device_capability()
            os.environ.setdefault(
                "FLASHINFER_CUDA_ARCH_LIST", f"{major}.{minor}{'a' if major >= 9 else ''}"
            )
    try:
        module = importlib.import_module("flashinfer.mla")
    except Exception as exc:  # noqa: BLE001
        where = f" from {path}" if path else ""
        raise Unavailable(f"flashinfer is not importable{where} ({type(exc).__name__})") from exc
    if path and (Path(path) / "_fi_prebuilt").is_dir():
        import flashinfer.jit.env as fi_env

        fi_env.FLASHINFER_AOT_DIR = Path(path) / "_fi_prebuilt"
    return module


def flashinfer_wrapper(
    inp: BenchInputs, pool: torch.Tensor, module: types.ModuleType | None = None
) -> Runner:
    """FlashInfer's MLA wrapper on ``pool``: the FP8 pool itself (``flashinfer-fp8``, its
    FP8 path, SM90 only) or a bf16 pool of the same values (``flashinfer-bf16kv``)."""
    mla = module or load_flashinfer()
    w = mla.BatchMLAPagedAttentionWrapper(_flashinfer_workspace(inp.pool.device))
    try:
        w.plan(
            inp.qo_indptr,
            inp.kv_indptr,
            inp.kv_indices,
            inp.kv_len,
            inp.case.heads,
            512,
            64,
            inp.page_size,
            inp.case.qo_len > 1,
            SM_SCALE,
            torch.bfloat16,
            pool.dtype,
        )
    except Exception as exc:  # noqa: BLE001 - FlashInfer refuses what it does not support
        raise Unavailable(
            f"flashinfer refused the plan ({str(exc).splitlines()[0][:100]})"
        ) from exc
    ckv, kpe = inp.paged(pool)
    out = torch.empty_like(inp.q_nope)
    kw = {}
    if pool.dtype.itemsize == 1:
        kw = dict(ckv_scale=inp.scale, kpe_scale=inp.scale)
    return lambda: w.run(inp.q_nope, inp.q_pe, ckv, kpe, out=out, **kw)
