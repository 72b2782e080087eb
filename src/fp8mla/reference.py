"""The float64 reference of paged MLA attention (public path of
:mod:`fp8mla.attention.reference`): the test oracle and the CPU fallback."""

from fp8mla.attention.reference import (  # noqa: F401
    LOG2E,
    dequantize,
    gather_kv,
    mla_reference,
    request_token_slots,
)

__all__ = ["dequantize", "gather_kv", "mla_reference", "request_token_slots"]
