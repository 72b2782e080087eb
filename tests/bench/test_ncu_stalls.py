"""``benchmarks/ncu_stalls.py`` on a small source page of the form Nsight Compute writes."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "ncu_stalls.py"


def load():
    spec = importlib.util.spec_from_file_location("ncu_stalls", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # (its dataclass looks its module up there)
    spec.loader.exec_module(module)
    return module


HEADER = (
    '"Address","Source","Warp Stall Sampling (All Samples)",'
    '"Warp Stall Sampling (Not-issued Samples)","Instructions Executed",'
    '"stall_long_sb","stall_barrier","stall_selected","stall_long_sb (Not Issued)"'
)


def page(rows: list[tuple[int, str, int, int, int, int, int]]) -> list[str]:
    lines = ['"Kernel Name","k",', HEADER]
    for addr, src, samples, executed, long_sb, barrier, selected in rows:
        lines.append(f'"0x{addr:x}","{src}","{samples}","0","{executed}","{long_sb}",'
                     f'"{barrier}","{selected}","{long_sb}"')  # fmt: skip
    return lines


# a loop at 0x10-0x40 whose barrier wait branches forward to its retry stub (0x60: the
# try-wait again in place, then back to just after the forward branch), as ptxas lays it out
CODE = [
    (0x00, "MOV R1, c[0x0][0x28] ;", 1, 1, 0, 0, 1),
    (0x10, "LDG.E R2, desc[UR4][R4.64] ;", 2, 10, 0, 0, 2),
    (0x20, "SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [R3], R5 ;", 5, 10, 0, 5, 0),
    (0x28, "@!P0 BRA 0x60 ;", 0, 10, 0, 0, 0),
    (0x30, "FMUL R6, R2, 256 ;", 40, 10, 38, 0, 2),
    (0x40, "@P1 BRA 0x10 ;", 2, 10, 0, 0, 2),
    (0x50, "EXIT ;", 0, 1, 0, 0, 0),
    (0x60, "SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [R3], R5 ;", 30, 3, 0, 30, 0),
    (0x68, "@!P0 BRA 0x60 ;", 0, 3, 0, 0, 0),
    (0x70, "BRA 0x30 ;", 0, 3, 0, 0, 0),
]


def test_the_loop_and_its_stalls_are_found_and_retry_stubs_are_not_loops():
    m = load()
    code = m.read_source_page(page(CODE))
    assert [i.address for i in code] == [c[0] for c in CODE]
    assert code[5].opcode == "BRA" and code[4].stalls["long_sb"] == 38
    assert m.loops(code) == [(1, 5)]
    lines = m.summary(code, top=2)
    assert lines[0] == "10 instructions, 80 samples, 61 warp-instructions executed"
    assert lines[2].startswith("  1-5: 61.3%, 5 instructions, long_sb 78%, selected 12%")
    assert lines[-2].startswith("  4: 50.0%, 10, FMUL R6, R2, 256 ;, long_sb 95%")
    assert lines[-1].startswith("  7: 37.5%, 3, SYNCS.PHASECHK")


def test_a_page_without_the_source_header_is_refused():
    m = load()
    with pytest.raises(ValueError, match="source page's header"):
        m.read_source_page(['"Kernel Name","k",', '"a","b"'])


def test_shared_accesses_over_their_ideal_wavefronts_are_reported_as_conflicts():
    m = load()
    header = HEADER + ',"L1 Wavefronts Shared","L1 Wavefronts Shared Ideal"'
    rows = [
        ("0x0", "STS.128 [R1], R4 ;", 8, 4),  # two threads on each unit's banks
        ("0x10", "LDS R2, [R3] ;", 1, 1),
        ("0x20", "STS.128 [R1+0x800], R8 ;", 12, 4),
        ("0x30", "FMUL R6, R2, 256 ;", 0, 0),
    ]
    lines = ['"Kernel Name","k",', header]
    for addr, src, waves, ideal in rows:
        lines.append(f'"{addr}","{src}","1","0","1","0","0","1","0","{waves}","{ideal}"')
    code = m.read_source_page(lines)
    assert [(i.wavefronts, i.ideal) for i in code] == [(8, 4), (1, 1), (12, 4), (0, 0)]
    report = m.conflicts(code)
    assert report[0].startswith("shared bank conflicts: 2 instructions, 57.1% of 21 shared")
    assert report[1:] == ["  2: 3.00x, STS.128 [R1+0x800], R8 ;", "  0: 2.00x, STS.128 [R1], R4 ;"]
    assert m.summary(code)[-3:] == report
    # a page without the wavefront columns reports none
    assert m.conflicts(m.read_source_page(page(CODE))) == []
