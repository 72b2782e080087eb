"""Name and call rules that decide what the scanner treats as a KV pool buffer or a dtype cast.

Everything here is a pure function of AST nodes and names; no source is imported or executed.
The rules are heuristics tuned on serving-engine attention backends (SGLang, vLLM, FlashInfer
callers): they read identifiers the way an engineer grepping the backend would.
"""

from __future__ import annotations

import ast
import re
from typing import Literal

ArgKind = Literal["dtype", "device", "tensor", "other"]

# -- KV pool receivers --------------------------------------------------------------------------

# ``get_key_buffer``, ``get_value_buffer``, ``get_kv_buffer``: ``get_<kv words>_buffer``.
_GETTER_RE = re.compile(r"^get_(\w+)_buf(?:fer)?s?$")

# Tokens (``_``-separated, lower case) that mark a name as holding key/value cache data.
_KV_TOKENS = frozenset({"k", "v", "kv", "key", "value", "ckv", "kpe"})
_BUFFER_TAILS = frozenset({"buffer", "buffers", "buf", "bufs", "cache", "caches"})
_POOL_TOKENS = frozenset({"pool", "pools"})

# A ``*_pool*`` name with one of these tokens is not a KV pool (index tables, thread pools,
# pooling layers), and a name ending in a metadata token describes a buffer without holding it.
_NOT_KV_POOL_TOKENS = frozenset(
    {"req", "thread", "process", "worker", "max", "avg", "adaptive", "conn", "connection"}
)
_METADATA_TAILS = frozenset(
    {
        "dtype", "size", "sizes", "shape", "len", "lens", "id", "ids", "idx", "indices",
        "index", "ptr", "ptrs", "stride", "strides", "device", "layout", "config", "cls",
        "type", "name", "names", "num", "bytes", "spec", "specs", "manager", "allocator",
    }
)  # fmt: skip

# Tokens of an index expression that selects one layer (or one virtual engine) of a per-layer
# list of pools: ``k_buffer[layer_id - self.start_layer]`` still names a whole pool.
_LAYER_INDEX_TOKENS = frozenset({"layer", "layers", "engine", "ve"})


# Tokens naming a tensor that was gathered (or all-gathered across ranks) rather than a pool:
# ``gathered_kv_cache``, ``all_gather_kv_cache_for_dcp(...)``.
_GATHER_TOKENS = frozenset({"gather", "gathered", "allgather", "allgathered", "gathers"})
# Tokens of an argument that selects token slots: a getter called with one returns those rows.
_SLOT_INDEX_TOKENS = frozenset(
    {"indices", "index", "idx", "idxs", "loc", "locs", "slots", "slot", "ids", "positions"}
)
# Decorators of functions whose body is a device kernel (Triton, TileLang, CuTe DSL, Numba):
# their ``x.to(tl.int64)`` converts a register block, not a KV pool.
_KERNEL_DECORATORS = frozenset({"jit", "autotune", "heuristics", "kernel", "prim_func"})
_KERNEL_MODULES = frozenset({"triton", "tl", "tilelang", "T", "cute", "numba", "cuda"})
_INTEGER_DTYPES = frozenset(
    {
        "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "long", "int",
        "short", "bool", "int1",
    }
)  # fmt: skip


def _tokens(name: str) -> list[str]:
    return [t for t in name.lower().strip("_").split("_") if t]


def is_gathered_name(name: str) -> bool:
    """True for names that say the tensor was gathered: ``gathered_kv``, ``all_gather_kv``."""
    return bool(_GATHER_TOKENS.intersection(_tokens(name)))


def is_slot_index(node: ast.expr) -> bool:
    """True for an argument naming token slots (``kv_indices``, ``out_cache_loc``)."""
    name = dotted_name(node.value if isinstance(node, ast.Starred) else node)
    if name is None:
        return False
    return bool(_SLOT_INDEX_TOKENS.intersection(_tokens(name.rpartition(".")[2])))


def is_kernel_decorator(node: ast.expr) -> bool:
    """True for ``@triton.jit``, ``@triton.autotune(...)``, ``@tilelang.jit``, ``@jit``."""
    if isinstance(node, ast.Call):
        node = node.func
    name = dotted_name(node)
    if name is None:
        return False
    head, _, last = name.rpartition(".")
    if last not in _KERNEL_DECORATORS:
        return False
    return not head or head.split(".")[0] in _KERNEL_MODULES


def is_integer_dtype(node: ast.expr) -> bool:
    """True for ``torch.int64``, ``tl.int32``, ``torch.long``, ``torch.bool``: index and mask
    dtypes, never what a KV pool's values are converted to."""
    name = dotted_name(node)
    if name is None:
        return False
    head, _, last = name.rpartition(".")
    return head.split(".")[-1] in ("torch", "tl", "language", "triton", "np", "numpy") and (
        last in _INTEGER_DTYPES
    )


def is_buffer_getter(name: str) -> bool:
    """True for method names like ``get_key_buffer`` that return a whole KV pool buffer.

    The words between ``get_`` and ``_buffer`` must say key/value/cache/pool, so engine helpers
    such as ``get_global_dp_buffer`` or ``get_label_buffer`` are not taken for KV pools.
    """
    match = _GETTER_RE.match(name)
    if match is None:
        return False
    return bool(set(_tokens(match.group(1))) & (_KV_TOKENS | _BUFFER_TAILS | _POOL_TOKENS))


def is_buffer_name(name: str) -> bool:
    """True for identifiers such as ``k_buffer``, ``kv_cache``, ``token_to_kv_pool``.

    A ``*_buffer``/``*_cache`` name counts when another token says key/value (``kv_buffer``,
    ``key_cache``, ``kv_c_and_k_pe_cache``); a ``*_pool*`` name counts unless it is an index
    table, a thread pool or a pooling layer, or ends in a metadata word (``kv_pool_size``).
    """
    tokens = _tokens(name)
    if len(tokens) < 2 and tokens != ["pool"]:
        return False
    if tokens[-1] in _METADATA_TAILS:
        return False
    if tokens[-1] in _BUFFER_TAILS and any(t in _KV_TOKENS for t in tokens[:-1]):
        return True
    return bool(_POOL_TOKENS.intersection(tokens)) and not _NOT_KV_POOL_TOKENS.intersection(tokens)


def is_scalar_index(index: ast.expr, scalars: frozenset[str] = frozenset()) -> bool:
    """True when a subscript index picks one layer, engine or integer, not a set of token slots.

    Integers, names in ``scalars`` (loop counters the caller knows are ints) and names with a
    layer/engine token (``layer_id - self.start_layer``) select one pool of a per-layer list.
    """
    if isinstance(index, ast.Constant):
        return isinstance(index.value, int) and not isinstance(index.value, bool)
    if isinstance(index, ast.UnaryOp):
        return is_scalar_index(index.operand, scalars)
    if isinstance(index, ast.BinOp):
        return is_scalar_index(index.left, scalars) and is_scalar_index(index.right, scalars)
    if isinstance(index, ast.Name):
        return index.id in scalars or bool(_LAYER_INDEX_TOKENS.intersection(_tokens(index.id)))
    if isinstance(index, ast.Attribute):
        return bool(_LAYER_INDEX_TOKENS.intersection(_tokens(index.attr)))
    return False


def is_basic_index(index: ast.expr, scalars: frozenset[str] = frozenset()) -> bool:
    """True when ``buf[index]`` is a view of the whole buffer rather than a gather.

    Basic indexing (``:`` slices with any bounds, ``...``, ``None``, integers, layer ids) keeps
    every token slot of the pool; advanced indexing with a tensor, list or named index set
    (``buf[loc]``, ``buf[:, indices]``) gathers only the rows it names.
    """
    parts = index.elts if isinstance(index, ast.Tuple) else [index]
    for part in parts:
        if isinstance(part, ast.Slice):
            continue
        if isinstance(part, ast.Constant) and (part.value is None or part.value is Ellipsis):
            continue
        if not is_scalar_index(part, scalars):
            return False
    return True


# -- methods that pass a buffer through, gather from it, or cast it -----------------------------

# Methods returning a view (or tuple of views) of their receiver: the result still spans the pool.
VIEW_METHODS = frozenset(
    {
        "view", "reshape", "flatten", "unflatten", "contiguous", "squeeze", "unsqueeze",
        "transpose", "permute", "t", "narrow", "select", "split", "chunk", "unbind",
        "tensor_split", "movedim", "expand", "detach", "view_as", "reshape_as", "as_strided",
    }
)  # fmt: skip
# ``torch.<fn>(buffer, ...)`` forms of the same views.
VIEW_FUNCTIONS = frozenset({"flatten", "reshape", "squeeze", "unsqueeze", "transpose", "permute",
                            "narrow", "select", "split", "chunk", "unbind", "movedim"})  # fmt: skip
# Methods and ``torch.<fn>(buffer, ...)`` functions that gather a subset of rows.
GATHER_METHODS = frozenset({"index_select", "gather", "take", "take_along_dim", "masked_select"})

# ``torch.<fn>([a, b], ...)``: joins a cached prefix to the new tokens.
CONCAT_FUNCTIONS = frozenset({"cat", "concat", "concatenate"})
# Casting methods that take no dtype argument (float32, float16, bfloat16, float64).
FIXED_CASTS = frozenset({"float", "half", "bfloat16", "double"})
# ``torch.<fn>(data, dtype=...)`` constructors that copy-convert an existing tensor.
TENSOR_CONSTRUCTORS = frozenset({"as_tensor", "asarray"})

_TORCH_DTYPES = frozenset(
    {
        "float16", "half", "bfloat16", "float32", "float", "float64", "double",
        "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz",
        "int8", "uint8", "int16", "int32", "int64", "long", "int", "bool",
    }
)  # fmt: skip
_DEVICE_TOKENS = frozenset({"device", "devices", "dev", "rank", "gpu", "cuda", "cpu", "gpus"})


def dotted_name(node: ast.expr) -> str | None:
    """``a.b.c`` for a chain of attribute reads on a name, else ``None``."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return ".".join(reversed(parts))


def call_name(call: ast.Call) -> str | None:
    """The called method's or function's own name (``to`` for ``x.y.to(...)``)."""
    func = call.func
    if isinstance(func, ast.Attribute):
        return func.attr
    if isinstance(func, ast.Name):
        return func.id
    return None


def is_torch_function(call: ast.Call, names: frozenset[str]) -> bool:
    """True for ``torch.<name>(...)`` with ``name`` in ``names``."""
    func = call.func
    return (
        isinstance(func, ast.Attribute)
        and func.attr in names
        and isinstance(func.value, ast.Name)
        and func.value.id == "torch"
    )


def arg_kind(node: ast.expr) -> ArgKind:
    """Guess what a ``.to(...)`` argument is: a dtype, a device, a tensor (whose dtype is taken)."""
    if isinstance(node, ast.Constant):
        return "device" if isinstance(node.value, str) else "other"
    if isinstance(node, ast.Call):
        name = call_name(node) or ""
        if "dtype" in name or "data_type" in name:
            return "dtype"
        return "device" if "device" in name or name in {"cuda", "cpu"} else "other"
    name = dotted_name(node)
    if name is None:
        return "other"
    head, _, last = name.rpartition(".")
    if head == "torch" and last in _TORCH_DTYPES:
        return "dtype"
    if head == "torch" and last == "device":
        return "device"
    lowered = last.lower()
    if "dtype" in lowered or "data_type" in lowered or (not head and lowered in _TORCH_DTYPES):
        return "dtype"
    if _DEVICE_TOKENS.intersection(_tokens(lowered)):
        return "device"
    return "tensor"


def is_dtype_like(node: ast.expr) -> bool:
    """True for expressions that name a dtype (``torch.bfloat16``, ``self.data_type``)."""
    return arg_kind(node) == "dtype"
