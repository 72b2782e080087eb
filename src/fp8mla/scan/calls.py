"""Which calls convert a tensor's dtype, and which ``plan()`` calls give the KV the query's dtype.

These look at one call node in isolation; whether the converted tensor is a KV pool buffer is
decided by the walk in :mod:`fp8mla.scan.visitor`.
"""

from __future__ import annotations

import ast

from fp8mla.scan import patterns as pat
from fp8mla.scan.findings import PLAN_KV_DTYPE_HINT

_PLAN_METHODS = frozenset({"plan", "begin_forward"})
_MAX_SNIPPET = 80


def snippet(node: ast.AST) -> str:
    """One-line source of ``node``, shortened to at most 80 characters."""
    text = " ".join(ast.unparse(node).split())
    return text if len(text) <= _MAX_SNIPPET else text[: _MAX_SNIPPET - 3] + "..."


def index_snippet(index: ast.expr) -> str:
    """Source of a subscript index as written between the brackets (``:, loc``)."""
    if isinstance(index, ast.Tuple) and index.elts:
        return ", ".join(snippet(e) for e in index.elts)
    return snippet(index)


def cast_operand(node: ast.Call) -> tuple[ast.expr, int] | None:
    """``(operand, line)`` when ``node`` converts a tensor's dtype; ``line`` holds the cast."""
    func = node.func
    if pat.is_torch_function(node, pat.TENSOR_CONSTRUCTORS) and node.args:
        dtype = next((k.value for k in node.keywords if k.arg == "dtype"), None)
        if dtype is None and len(node.args) > 1:
            dtype = node.args[1]
        if dtype is None or (isinstance(dtype, ast.Constant) and dtype.value is None):
            return None
        if pat.is_integer_dtype(dtype):
            return None
        return node.args[0], node.lineno
    if not isinstance(func, ast.Attribute):
        return None
    line = func.end_lineno or node.lineno
    name = func.attr
    if name in pat.FIXED_CASTS and not node.args:
        return func.value, line
    if name == "to":
        target = _to_dtype(node)
        if target is None or pat.is_integer_dtype(target):  # a move, or an index/mask dtype
            return None
        return func.value, line
    if name in ("type", "type_as"):
        arg = (
            node.args[0]
            if node.args
            else next((k.value for k in node.keywords if k.arg in ("dtype", "other")), None)
        )
        if arg is None or pat.is_integer_dtype(arg):
            return None
        return func.value, line
    return None


def _to_dtype(node: ast.Call) -> ast.expr | None:
    """The dtype (or tensor whose dtype is taken) of a ``.to(...)`` call, ``None`` for moves."""
    for keyword in node.keywords:
        if keyword.arg == "dtype":
            return keyword.value
    for arg in node.args[:2]:
        kind = pat.arg_kind(arg)
        if kind in ("dtype", "tensor"):
            return arg
        if kind != "device":
            return None
    return None


def _is_query_dtype(node: ast.expr) -> bool:
    name = pat.dotted_name(node)
    if name is None or not name.endswith(".dtype"):
        return False
    owner = name.split(".")[-2].lower()
    return owner in ("q", "query") or owner.startswith("q_")


def plan_dtype_hint(node: ast.Call) -> tuple[int, str, str] | None:
    """``(line, PLAN_KV_DTYPE_HINT, reason)`` for a wrapper ``plan()`` whose KV dtype is the query's.

    Recognized: ``q_data_type=X, kv_data_type=X``; ``kv_data_type=q.dtype``; and, without those
    keywords, the same dtype expression as the last two positional arguments (FlashInfer's MLA
    ``plan(..., sm_scale, q_data_type, kv_data_type)``).
    """
    func = node.func
    if not isinstance(func, ast.Attribute) or func.attr not in _PLAN_METHODS:
        return None
    keywords = {k.arg: k.value for k in node.keywords if k.arg is not None}
    q_dtype, kv_dtype = keywords.get("q_data_type"), keywords.get("kv_data_type")
    if kv_dtype is None and q_dtype is None and len(node.args) >= 2:
        if pat.is_dtype_like(node.args[-2]) and pat.is_dtype_like(node.args[-1]):
            q_dtype, kv_dtype = node.args[-2], node.args[-1]
    if kv_dtype is None:
        return None
    line = func.end_lineno or node.lineno
    kv_text = snippet(kv_dtype)
    where = f" (line {kv_dtype.lineno})" if kv_dtype.lineno != line else ""
    if q_dtype is not None and ast.dump(q_dtype) == ast.dump(kv_dtype):
        reason = (
            f"`{snippet(func)}(...)` passes `{kv_text}` as both q_data_type and kv_data_type"
            f"{where}: with an FP8 cache, either the query is declared FP8 or the pool must be "
            "cast to the query's dtype before every run()"
        )
    elif _is_query_dtype(kv_dtype):
        reason = (
            f"`{snippet(func)}(...)` plans kv_data_type=`{kv_text}`, the query's "
            "dtype: an FP8 pool has to be cast before every run()"
        )
    else:
        return None
    return line, PLAN_KV_DTYPE_HINT, reason
