"""The AST walk: find dtype casts of KV pool buffers and wrappers planned with a query-dtype KV.

One pass over a module in source order. Each function gets a scope that remembers which local
names (and ``self.x`` attributes) were assigned from a KV pool buffer, so ``k = pool.get_key_buffer
(i)`` followed by ``k.to(q.dtype)`` is found, while ``k[loc].to(q.dtype)`` is told apart as a
gather-then-cast.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from fp8mla.scan import patterns as pat
from fp8mla.scan.calls import cast_operand, index_snippet, plan_dtype_hint, snippet
from fp8mla.scan.findings import (
    GATHERED_CAST,
    SEVERITY,
    SUGGESTION,
    WHOLE_POOL_CAST,
    ScanFinding,
)


@dataclass(frozen=True)
class Receiver:
    """A KV pool buffer an expression evaluates to (whole, or rows gathered from it)."""

    origin: str  # source of the buffer: a name, attribute or getter call
    gathered_by: str | None = None  # ``[loc]`` or ``.index_select(...)`` when rows were gathered
    alias: str | None = None  # the local name (or ``self.x``) last assigned the buffer
    alias_line: int | None = None


@dataclass
class _Scope:
    kind: str  # "module", "class" or "function"
    bindings: dict[str, Receiver] = field(default_factory=dict)
    scalars: set[str] = field(default_factory=set)

    def child(self, kind: str) -> _Scope:
        return _Scope(kind, dict(self.bindings), set(self.scalars))


class KVCastVisitor(ast.NodeVisitor):
    """Collects :class:`ScanFinding` objects for one parsed module."""

    def __init__(self, path: str, lines: list[str]) -> None:
        self.path = path
        self.lines = lines
        self.findings: list[ScanFinding] = []
        self._prefix_casts: set[int] = set()  # casts listed in a torch.cat(...) with new tokens
        self._qualname: list[str] = []
        self._scopes: list[_Scope] = [_Scope("module")]

    # -- scopes -----------------------------------------------------------------------------

    @property
    def _scope(self) -> _Scope:
        return self._scopes[-1]

    def _enclosing_non_class(self) -> _Scope:
        return next(s for s in reversed(self._scopes) if s.kind != "class")

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        for expr in [*node.decorator_list, *node.bases, *(k.value for k in node.keywords)]:
            self.visit(expr)
        self._qualname.append(node.name)
        self._scopes.append(_Scope("class"))
        for stmt in node.body:
            self.visit(stmt)
        self._scopes.pop()
        self._qualname.pop()

    def _visit_function(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        args = node.args
        for expr in [*node.decorator_list, *args.defaults, *args.kw_defaults]:
            if expr is not None:
                self.visit(expr)
        if any(pat.is_kernel_decorator(d) for d in node.decorator_list):
            return  # a device kernel (@triton.jit, ...): its casts convert registers, not pools
        scope = self._enclosing_non_class().child("function")
        for arg in [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]:
            if arg is not None:  # a parameter shadows an outer alias of the same name
                scope.bindings.pop(arg.arg, None)
                scope.scalars.discard(arg.arg)
        self._qualname.append(node.name)
        self._scopes.append(scope)
        for stmt in node.body:
            self.visit(stmt)
        self._scopes.pop()
        self._qualname.pop()

    visit_FunctionDef = _visit_function
    visit_AsyncFunctionDef = _visit_function

    def _visit_comprehension(
        self, node: ast.ListComp | ast.SetComp | ast.GeneratorExp | ast.DictComp
    ) -> None:
        self._scopes.append(self._scope.child("function"))
        for gen in node.generators:
            self.visit(gen.iter)
            self._bind_loop_target(gen.target, gen.iter)
            for cond in gen.ifs:
                self.visit(cond)
        for part in (node.key, node.value) if isinstance(node, ast.DictComp) else (node.elt,):
            self.visit(part)
        self._scopes.pop()

    visit_ListComp = _visit_comprehension
    visit_SetComp = _visit_comprehension
    visit_GeneratorExp = _visit_comprehension
    visit_DictComp = _visit_comprehension

    # -- assignments: track local aliases of pool buffers ------------------------------------

    def visit_Assign(self, node: ast.Assign) -> None:
        self.visit(node.value)
        for target in node.targets:
            self.visit(target)
            self._assign(target, node.value)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        if node.value is not None:
            self.visit(node.value)
            self._assign(node.target, node.value)

    def visit_NamedExpr(self, node: ast.NamedExpr) -> None:
        self.visit(node.value)
        self._assign(node.target, node.value)

    def _visit_for(self, node: ast.For | ast.AsyncFor) -> None:
        self.visit(node.iter)
        self._bind_loop_target(node.target, node.iter)
        for stmt in [*node.body, *node.orelse]:
            self.visit(stmt)

    visit_For = _visit_for
    visit_AsyncFor = _visit_for

    def _bind_loop_target(self, target: ast.expr, iterable: ast.expr) -> None:
        """Bind a ``for`` target: items of a pool list, or int counters of range/enumerate."""
        self._bind(target, self._receiver(iterable), iterable)
        iter_call = pat.call_name(iterable) if isinstance(iterable, ast.Call) else None
        if iter_call == "range" and isinstance(target, ast.Name):
            self._scope.scalars.add(target.id)
        elif iter_call == "enumerate" and isinstance(target, ast.Tuple) and len(target.elts) == 2:
            index, item = target.elts
            if isinstance(index, ast.Name):
                self._scope.scalars.add(index.id)
            if isinstance(iterable, ast.Call) and iterable.args:
                self._bind(item, self._receiver(iterable.args[0]), iterable.args[0])

    def _assign(self, target: ast.expr, value: ast.expr) -> None:
        if isinstance(target, ast.Tuple | ast.List) and isinstance(value, ast.Tuple | ast.List):
            starred = any(isinstance(e, ast.Starred) for e in [*target.elts, *value.elts])
            if not starred and len(target.elts) == len(value.elts):
                for t, v in zip(target.elts, value.elts):
                    self._assign(t, v)
                return
        is_int = isinstance(value, ast.Constant) and type(value.value) is int
        if isinstance(target, ast.Name):
            (self._scope.scalars.add if is_int else self._scope.scalars.discard)(target.id)
        self._bind(target, self._receiver(value), value)

    def _bind(self, target: ast.expr, receiver: Receiver | None, value: ast.expr) -> None:
        if isinstance(target, ast.Starred):
            target = target.value
        if isinstance(target, ast.Tuple | ast.List):
            for elt in target.elts:
                self._bind(elt, receiver, value)
            return
        key = pat.dotted_name(target)
        if key is None:
            return
        if receiver is None:
            self._scope.bindings.pop(key, None)
            return
        self._scope.bindings[key] = replace(receiver, alias=key, alias_line=value.lineno)

    # -- receivers ---------------------------------------------------------------------------

    def _receiver(self, node: ast.expr) -> Receiver | None:
        """The KV pool buffer ``node`` evaluates to, or ``None`` for anything else."""
        if isinstance(node, ast.Name | ast.Attribute):
            key = pat.dotted_name(node)
            if key is not None and key in self._scope.bindings:
                return self._scope.bindings[key]
            name = node.id if isinstance(node, ast.Name) else node.attr
            if not pat.is_buffer_name(name):
                return None
            if pat.is_gathered_name(name):
                return Receiver(snippet(node), gathered_by=f"`{name}` (a gathered copy)")
            return Receiver(snippet(node))
        if isinstance(node, ast.Subscript):
            base = self._receiver(node.value)
            if base is None or base.gathered_by is not None:
                return base
            if pat.is_basic_index(node.slice, frozenset(self._scope.scalars)):
                return base
            return replace(base, gathered_by=f"[{index_snippet(node.slice)}]")
        if isinstance(node, ast.NamedExpr):
            return self._receiver(node.value)
        if not isinstance(node, ast.Call):
            return None
        name = pat.call_name(node)
        if name is not None and pat.is_buffer_getter(name):
            selectors = [a for a in [*node.args[1:], *(k.value for k in node.keywords)]]
            rows = next((a for a in selectors if pat.is_slot_index(a)), None)
            if rows is not None:  # get_mla_kv_buffer(layer, kv_indices, ...): those rows only
                return Receiver(snippet(node), gathered_by=f"{name}(…, {snippet(rows)})")
            return Receiver(snippet(node))
        if node.args and pat.is_torch_function(node, pat.VIEW_FUNCTIONS):
            return self._receiver(node.args[0])
        if node.args and pat.is_torch_function(node, pat.GATHER_METHODS):
            return self._gathered(self._receiver(node.args[0]), f"torch.{name}(...)")
        if isinstance(node.func, ast.Attribute) and name in pat.VIEW_METHODS:
            return self._receiver(node.func.value)
        if isinstance(node.func, ast.Attribute) and name in pat.GATHER_METHODS:
            return self._gathered(self._receiver(node.func.value), f".{name}(...)")
        if name is not None and pat.is_gathered_name(name):
            sources = [self._receiver(a) for a in node.args if isinstance(a, ast.expr)]
            if any(r is not None for r in sources) or pat.is_buffer_name(name):
                return Receiver(snippet(node), gathered_by=f"{name}(...)")
        return None

    @staticmethod
    def _gathered(base: Receiver | None, how: str) -> Receiver | None:
        if base is None or base.gathered_by is not None:
            return base
        return replace(base, gathered_by=how)

    # -- calls: casts and plan() -------------------------------------------------------------

    def visit_Call(self, node: ast.Call) -> None:
        if pat.is_torch_function(node, pat.CONCAT_FUNCTIONS) and node.args:
            parts = node.args[0]
            if isinstance(parts, ast.List | ast.Tuple) and len(parts.elts) > 1:
                self._prefix_casts.update(id(e) for e in parts.elts if isinstance(e, ast.Call))
        cast = cast_operand(node)
        if cast is not None:
            operand, line = cast
            receiver = self._receiver(operand)
            if receiver is not None and id(node) in self._prefix_casts:
                receiver = replace(receiver, gathered_by="torch.cat(...)")
            if receiver is not None:
                self._report_cast(snippet(node), operand, receiver, line)
        hint = plan_dtype_hint(node)
        if hint is not None:
            self._add(*hint)
        self.generic_visit(node)

    def _report_cast(self, cast: str, operand: ast.expr, receiver: Receiver, line: int) -> None:
        source = ""  # the cast's own text names the buffer unless it came through an alias
        if receiver.alias is not None and receiver.alias != receiver.origin:
            source = (
                f" `{receiver.alias}` (from `{receiver.origin}`, assigned on line "
                f"{receiver.alias_line})"
            )
        if receiver.gathered_by == "torch.cat(...)":
            reason = (
                f"`{cast}` converts the cached KV{source or f' `{receiver.origin}`'} that "
                "torch.cat joins to the new tokens: attention reads all of it, so the cost "
                "scales with the context, not with a preallocated pool"
            )
            self._add(line, GATHERED_CAST, reason)
            return
        if receiver.gathered_by is not None:
            by = receiver.gathered_by
            by = by if by.startswith("`") else f"`{by}`"
            reason = (
                f"`{cast}` casts rows gathered by {by} from KV buffer"
                f"{source or f' `{receiver.origin}`'}: its cost scales with the batch, not the pool"
            )
            self._add(line, GATHERED_CAST, reason)
            return
        sliced = isinstance(operand, ast.Subscript) and any(
            isinstance(n, ast.Slice) for n in ast.walk(operand.slice)
        )
        note = ", and a basic slice still views every slot" if sliced else ""
        reason = (
            f"`{cast}` casts a whole KV pool buffer{source}{note}: every call copies the "
            "entire preallocated pool, however few tokens the batch reads"
        )
        self._add(line, WHOLE_POOL_CAST, reason)

    def _add(self, line: int, kind: str, reason: str) -> None:
        code = self.lines[line - 1].strip() if 0 < line <= len(self.lines) else ""
        self.findings.append(
            ScanFinding(
                path=self.path,
                line=line,
                function=".".join(self._qualname) or "<module>",
                code=code,
                kind=kind,
                severity=SEVERITY[kind],
                suggestion=SUGGESTION[kind],
                reason=reason,
            )
        )


def find_casts(tree: ast.AST | Iterable[ast.AST], path: str, lines: list[str]) -> list[ScanFinding]:
    """Run the walk over a parsed module, or over its parts in source order (module-level
    aliases carry from one part to the next); ``lines`` are its source lines (for ``code``)."""
    visitor = KVCastVisitor(path, lines)
    for part in [tree] if isinstance(tree, ast.AST) else tree:
        visitor.visit(part)
    return sorted(visitor.findings, key=lambda f: (f.line, f.kind))
