"""Programmatic dependent launch (SM90+): a kernel launched with it may start before the
kernel ahead of it in the stream has finished, and waits for it only where it reads that
kernel's results.

``griddepcontrol.wait`` blocks until every grid this one depends on has completed and its
memory operations are visible; ``griddepcontrol.launch_dependents`` lets the dependent grid be
scheduled once every program of this grid has issued it (or exited), so its programs can be
resident and waiting when this grid's last program ends. Both are no-ops for a grid launched
without the attribute (or without a dependent). The split merge (``kernels/merge.py``) waits;
the few-row and FP8 × FP8 attention kernels let it launch early (the registry's
``launches_dependents``). Those two kernels are also launched as programmatic dependents of
whatever precedes them on the stream: they set up their barriers, then wait before their
first global read; the merge lets the next grid launch from its start.
"""

import triton
import triton.language as tl

try:  # the trigger is for the Gluon kernels; the merge's wait must import without Gluon
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
except ImportError:  # a Triton older than the Gluon kernels (the planner never picks them)
    gluon = None


@triton.jit
def wait_prior_grid():
    """``griddepcontrol.wait`` by every thread of the program."""
    tl.inline_asm_elementwise(
        "griddepcontrol.wait; mov.u32 $0, 0;", "=r,r", [tl.program_id(0)], dtype=tl.int32,
        is_pure=False, pack=1,
    )  # fmt: skip


@triton.jit
def launch_next_grid():
    """``griddepcontrol.launch_dependents`` by every thread of the program."""
    tl.inline_asm_elementwise(
        "griddepcontrol.launch_dependents; mov.u32 $0, 0;", "=r,r", [tl.program_id(0)],
        dtype=tl.int32, is_pure=False, pack=1,
    )  # fmt: skip


if gluon is not None:

    @gluon.jit
    def wait_prior():
        """``griddepcontrol.wait`` by every thread of the program: the grids this one depends
        on have ended and their memory operations are visible."""
        gl.inline_asm_elementwise(
            "griddepcontrol.wait; mov.u32 $0, 0;", "=r,r", [gl.program_id(0)], dtype=gl.int32,
            is_pure=False, pack=1,
        )  # fmt: skip

    @gluon.jit
    def launch_dependents():
        """``griddepcontrol.launch_dependents`` by the calling threads (one program's call
        counts once)."""
        gl.inline_asm_elementwise(
            "griddepcontrol.launch_dependents; mov.u32 $0, 0;", "=r,r", [gl.program_id(0)],
            dtype=gl.int32, is_pure=False, pack=1,
        )  # fmt: skip
