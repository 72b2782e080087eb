"""Kernel and op families: what kind of work a launch is, from its name.

Families (the keys of :data:`FAMILIES`): ``cast_copy`` (dtype casts and same-dtype copies done
by kernels), ``gemm``, ``attention``, ``norm``, ``elementwise``, ``communication``, ``memcpy``
(copy engine transfers and memsets), ``other``.
"""

from __future__ import annotations

import functools
import re

FAMILIES = {
    "cast_copy": "cast/copy",
    "gemm": "GEMM",
    "attention": "attention",
    "norm": "norm",
    "elementwise": "elementwise",
    "communication": "communication",
    "memcpy": "memcpy",
    "other": "other",
}

# Order matters: the first match wins (a copy kernel is elementwise too; a fused
# "attention + norm" kernel counts as attention).
_KERNEL_RULES: tuple[tuple[str, re.Pattern[str]], ...] = (
    (
        "communication",
        re.compile(
            r"nccl|rccl|all_?reduce|allgather|all_gather|reduce_?scatter|all_?to_?all|alltoall"
            r"|cross_device|custom_ar|one_shot|two_shot|deep_?ep|moe_a2a|mscclpp",
            re.I,
        ),
    ),
    (
        "cast_copy",
        re.compile(
            r"direct_copy_kernel|copy_kernel|LoadWithCast|_to_copy|float8_copy|CatArrayBatchedCopy"
            r"|copy_device_to_device|\bcast|_cast_|convert_(?:fp8|kv)|dequant|type_convert",
            re.I,
        ),
    ),
    (
        "attention",
        re.compile(
            r"attn|attention|flash|fmha|mla|_fwd_(?:grouped_)?kernel|decode_att|paged|splitkv"
            r"|sdpa|scaled_dot_product|xformers|merge_state",
            re.I,
        ),
    ),
    (
        "gemm",
        re.compile(
            r"gemm|nvjet|cutlass|cublas|\bCijk_|xmma|wgmma|sm\d+_xmma|splitKreduce|matmul|_mm_"
            r"|triton_mm|deep_gemm|fp8_gemm|bmm|hgemm|sgemm|s\d+gemm|ampere_|hopper_|volta_|turing_"
            r"|grouped_mm|fused_moe|moe_align",
            re.I,
        ),
    ),
    ("norm", re.compile(r"norm", re.I)),
    (
        "elementwise",
        re.compile(
            r"elementwise|triton_poi|triton_red|reduce_kernel|silu|gelu|swiglu|act_and_mul|rotary"
            r"|rope|softmax|fill|index|gather|scatter|arange|topk|sort|argmax|cumsum|embedding",
            re.I,
        ),
    ),
)

_OP_RULES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("communication", re.compile(r"c10d::|nccl|gloo|all_?reduce|all_gather|broadcast", re.I)),
    ("cast_copy", re.compile(r"aten::(?:to|_to_copy|copy_|clone|contiguous|type_as|_copy_from)$")),
    ("attention", re.compile(r"attention|attn|flash|mla|sdpa|decode", re.I)),
    (
        "gemm",
        re.compile(r"aten::(?:mm|addmm|bmm|baddbmm|matmul|linear|_scaled_mm|einsum)$|gemm", re.I),
    ),
    ("norm", re.compile(r"norm", re.I)),
    (
        "elementwise",
        re.compile(
            r"aten::(?:add|sub|mul|div|silu|gelu|relu|sigmoid|tanh|exp|pow|rsqrt|softmax|_softmax"
            r"|index|index_select|gather|scatter|embedding|argmax|topk|cat|where|masked_fill"
            r"|sum|mean|max|min|neg|abs|clamp|fill_|zero_|zeros|ones|full)",
            re.I,
        ),
    ),
)


@functools.lru_cache(maxsize=8192)
def classify_kernel(name: str, kind: str = "kernel") -> str:
    """Family of a GPU activity from its kernel name (``kind`` memcpy/memset → ``memcpy``)."""
    if kind != "kernel":
        return "memcpy"
    for family, pattern in _KERNEL_RULES:
        if pattern.search(name):
            return family
    return "other"


@functools.lru_cache(maxsize=8192)
def classify_op(name: str) -> str:
    """Family of a CPU op (CPU-only traces) from its operator name."""
    for family, pattern in _OP_RULES:
        if pattern.search(name):
            return family
    return "other"


def short_name(name: str, width: int = 90) -> str:
    """A kernel name without return type, arguments and deep template noise, for display.

    ``void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda(...)
    ...>(int, ...)`` → ``at::native::unrolled_elementwise_kernel<direct_copy_kernel_cuda …>``.
    """
    text = name[5:] if name.startswith("void ") else name
    text = text.replace("(anonymous namespace)::", "").replace("at::native::", "")
    depth = 0
    cut = len(text)
    for i, ch in enumerate(text):  # drop the trailing argument list
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == "(" and depth == 0:
            cut = i
            break
    text = text[:cut]
    lt = text.find("<")
    if lt >= 0:
        label = re.split(r"[<>({]", text[lt + 1 :], maxsplit=1)[0].strip()[:40]
        text = f"{text[:lt]}<{label} …>"
    if len(text) > width:
        text = text[: width - 1] + "…"
    return text
