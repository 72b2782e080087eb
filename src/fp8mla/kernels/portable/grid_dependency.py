"""Programmatic dependent launch (SM90+) for the Triton kernels: a kernel launched with it may
start before the kernel ahead of it in the stream has finished, and waits for it only where it
reads that kernel's results.

``griddepcontrol.wait`` blocks until every grid this one depends on has completed and its
memory operations are visible; ``griddepcontrol.launch_dependents`` lets the dependent grid be
scheduled once every program of this grid has issued it (or exited), so its programs can be
resident and waiting when this grid's last program ends. Both are no-ops for a grid launched
without the attribute (or without a dependent). The split merge (``merge.py``) waits for the
attention kernel and lets the next grid launch from its start; the Gluon attention kernels'
side is in ``kernels/sm90/common.py`` (the registry's ``launches_dependents``).
"""

import triton
import triton.language as tl


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
