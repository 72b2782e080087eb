"""What the scanner reports: findings, skipped files, and the result of a scan."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Final

# -- kinds and their severities -----------------------------------------------------------------

WHOLE_POOL_CAST: Final = "whole_pool_cast"
"""A dtype cast of a whole KV pool buffer (or a basic-slice view of one): the bug."""
GATHERED_CAST: Final = "gathered_cast"
"""A cast of rows gathered from a KV buffer: its cost scales with the batch, not the pool."""
PLAN_KV_DTYPE_HINT: Final = "plan_kv_dtype_hint"
"""An attention wrapper planned with the query dtype as its KV dtype (needs a cast KV cache)."""

SEVERITY: Final[dict[str, str]] = {
    WHOLE_POOL_CAST: "high",
    PLAN_KV_DTYPE_HINT: "medium",
    GATHERED_CAST: "low",
}
SEVERITY_ORDER: Final[tuple[str, ...]] = ("high", "medium", "low")

SUGGESTION: Final[dict[str, str]] = {
    WHOLE_POOL_CAST: (
        "read the FP8 cache in-kernel: plan fp8mla.BatchMLAPagedAttentionWrapper with "
        "kv_data_type=<the pool's storage dtype> and pass the buffer uncast to run() (an MLA "
        "latent pool; separate K and V pools need a paged kernel that takes FP8 K/V, e.g. "
        "FlashInfer's BatchDecodeWithPagedKVCacheWrapper); or gather-then-cast only the rows "
        "this batch reads (buf[kv_indices].to(...))"
    ),
    GATHERED_CAST: (
        "fine: gather-then-cast touches only the gathered rows; reading the FP8 cache in-kernel "
        "with fp8mla.BatchMLAPagedAttentionWrapper(kv_data_type=...) would skip this copy too"
    ),
    PLAN_KV_DTYPE_HINT: (
        "if the KV cache stores FP8, pass the cache's storage dtype as kv_data_type "
        "(e.g. torch.float8_e4m3fn) so the kernel reads the pool directly; "
        "fp8mla.BatchMLAPagedAttentionWrapper accepts q_data_type != kv_data_type"
    ),
}


@dataclass(frozen=True)
class ScanFinding:
    """One flagged line.

    ``function`` is the enclosing definition as ``Class.method``, ``func``, ``outer.inner`` or
    ``<module>``; its last dotted part is the name a profiler's stack frame shows.
    """

    path: str
    line: int
    function: str
    code: str
    kind: str
    severity: str
    suggestion: str
    reason: str

    def to_dict(self) -> dict[str, Any]:
        """The finding as a JSON-ready dict (the ``--json`` schema, plus ``reason``)."""
        return asdict(self)


@dataclass(frozen=True)
class SkippedFile:
    """A file that could not be scanned, and why (syntax error, bad encoding, binary, I/O)."""

    path: str
    reason: str

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


@dataclass(frozen=True)
class FileNote:
    """Something to know about a scanned file: parsed in parts, or only partly scanned."""

    path: str
    note: str

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


@dataclass
class ScanResult:
    """Findings of a scan over files, directories or an installed package, in path/line order."""

    findings: list[ScanFinding] = field(default_factory=list)
    skipped: list[SkippedFile] = field(default_factory=list)
    files_scanned: int = 0
    notes: list[FileNote] = field(default_factory=list)
    hidden: int = 0  # findings left out by :meth:`at_least`

    _whole_pool: bool = field(default=False, repr=False)

    @property
    def has_whole_pool_cast(self) -> bool:
        """True when any finding (shown or hidden by :meth:`at_least`) is the whole-pool cast."""
        return self._whole_pool or any(f.kind == WHOLE_POOL_CAST for f in self.findings)

    def counts(self) -> dict[str, int]:
        """Number of findings of each kind, in severity order."""
        out: dict[str, int] = {}
        for kind in sorted(SEVERITY, key=lambda k: SEVERITY_ORDER.index(SEVERITY[k])):
            n = sum(f.kind == kind for f in self.findings)
            if n:
                out[kind] = n
        return out

    def at_least(self, severity: str) -> ScanResult:
        """The same result with only the findings of ``severity`` or worse (``hidden`` counts
        the others); ``has_whole_pool_cast`` still reflects every finding."""
        if severity not in SEVERITY_ORDER:
            raise ValueError(f"expected a severity in {SEVERITY_ORDER}, got {severity!r}")
        keep = SEVERITY_ORDER[: SEVERITY_ORDER.index(severity) + 1]
        shown = [f for f in self.findings if f.severity in keep]
        return ScanResult(
            findings=shown,
            skipped=self.skipped,
            files_scanned=self.files_scanned,
            notes=self.notes,
            hidden=self.hidden + len(self.findings) - len(shown),
            _whole_pool=self.has_whole_pool_cast,
        )

    def to_dict(self) -> dict[str, Any]:
        """``{"findings": [...], "skipped": [...], "files_scanned": N, "notes": [...]}``."""
        return {
            "findings": [f.to_dict() for f in self.findings],
            "skipped": [s.to_dict() for s in self.skipped],
            "files_scanned": self.files_scanned,
            "notes": [n.to_dict() for n in self.notes],
        }
