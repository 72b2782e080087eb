"""What to change for a whole-pool cast: the fix follows the pool's dtype and layout.

An MLA latent pool (``[slots, 1, 576]``) is read in place by fp8mla's MLA wrapper planned with
the pool's own FP8 dtype. Separate K and V pools (``[slots, heads, head_dim]``) need a paged
attention kernel that takes FP8 K/V (FlashInfer's decode and prefill wrappers do); the MLA
wrapper cannot take them. Either way, a kernel that must take 16-bit KV can gather the active
rows first and cast only those.
"""

from __future__ import annotations

from fp8mla.doctor.casts import CastGroup
from fp8mla.doctor.pool_evidence import MHA, MLA, Evidence

__all__ = ["pool_fix", "source_dtype_text"]

_FP8 = ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz")


def source_dtype_text(src: str | None) -> str:
    """``torch.float8_e5m2`` for a known FP8 dtype, else a placeholder that says why."""
    if src in _FP8:
        return f"torch.{src}"
    return "the pool's FP8 dtype (torch.float8_e4m3fn or torch.float8_e5m2: the trace does not record it)"


def _gather(group: CastGroup, ev: Evidence, pools: str) -> str:
    dst = group.dst or "bfloat16"
    unit = "rows" if ev.active_source == "recorded shapes" else "tokens"
    pool = group.shape[0] if unit == "rows" and group.shape else ev.slots
    rows = (
        f" ({ev.active_tokens:,} instead of {pool:,} {unit} per layer)"
        if ev.active_tokens and pool
        else ""
    )
    return (
        f"If the kernel must take {dst}, gather the active entries first and cast only those "
        f"({pools}){rows}."
    )


def _mla(group: CastGroup, ev: Evidence) -> str:
    src = group.src if group.src in _FP8 else "FP8"
    dst = group.dst or "bfloat16"
    return (
        f"Read the {src} latent cache inside the attention kernel instead of converting the "
        f"whole pool every layer: fp8mla.BatchMLAPagedAttentionWrapper, planned with "
        f"kv_data_type={source_dtype_text(group.src)}, reads the FP8 pages in place. "
        + _gather(group, ev, f"pool[kv_indices].to(torch.{dst})")
    )


def _mha(group: CastGroup, ev: Evidence) -> str:
    src = group.src if group.src in _FP8 else "FP8"
    dst = group.dst or "bfloat16"
    return (
        f"Read the {src} K and V pools inside the attention kernel instead of converting them "
        f"every layer: a paged attention kernel that takes FP8 K/V, e.g. FlashInfer's "
        f"BatchDecodeWithPagedKVCacheWrapper (BatchPrefillWithPagedKVCacheWrapper for prefill) "
        f"planned with kv_data_type={source_dtype_text(group.src)}, reads the FP8 pages in "
        f"place (fp8mla's wrapper is for MLA latent pools and cannot take separate K and V). "
        + _gather(
            group, ev, f"k_pool[kv_indices].to(torch.{dst}), v_pool[kv_indices].to(torch.{dst})"
        )
    )


def pool_fix(group: CastGroup, ev: Evidence, saved_ms: float, share: float) -> str:
    """The fix for a whole-pool cast, and what it saves."""
    saves = f" Removes ≈{saved_ms:.1f} ms per step ({share:.0%})."
    kv = source_dtype_text(group.src)
    if ev.layout == MLA and ev.layout_certain:
        return _mla(group, ev) + saves
    if ev.layout == MHA and ev.layout_certain:
        return _mha(group, ev) + saves
    if ev.layout == MLA:
        return (
            f"{_mla(group, ev)}{saves} (The trace has no shapes; each call converts a whole "
            f"number of 576-value MLA rows, once per layer. If the pool holds K and V "
            f"separately instead, use a paged kernel that takes FP8 K/V, e.g. FlashInfer's "
            f"BatchDecodeWithPagedKVCacheWrapper with kv_data_type={kv}: fp8mla's wrapper takes "
            f"MLA latent pools only.)"
        )
    if ev.layout == MHA:
        return (
            f"{_mha(group, ev)}{saves} (The trace has no shapes; the cast runs twice per layer, "
            f"like separate K and V pools. If it is an MLA latent pool instead, "
            f"fp8mla.BatchMLAPagedAttentionWrapper planned with kv_data_type={kv} reads it in "
            f"place.)"
        )
    return (
        f"The trace does not say how the pool is laid out. For an MLA latent pool ([slots, 1, "
        f"576]): {_mla(group, ev)} For separate K and V pools ([slots, heads, head_dim]): "
        f"{_mha(group, ev)}{saves}"
    )
