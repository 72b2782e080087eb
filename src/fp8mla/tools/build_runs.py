"""How the compile matrix runs its builds: a cache of measured builds, a pool of build
processes that die with the run, and its progress lines.

A build's measurement (registers, spills, shared memory) depends only on the kernel's source
(Triton's ``cache_key``: the kernel and the jit functions it calls), the build's options, the
target and the toolchain (Triton itself, ptxas, the measuring code, Triton's environment
options); the cache keys it on all of them, so a second run rebuilds only what changed.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict

from fp8mla.attention.targets import Target
from fp8mla.tools.kernel_builds import Build, Resources, measure

__all__ = ["ProgressFn", "cached_measure", "default_cache_dir", "die_with_parent", "progress_lines"]

ProgressFn = Callable[[int, int, int], None]
"""``progress(built, total, failed)``, called after each build."""


def default_cache_dir() -> str:
    """``$FP8MLA_CACHE_DIR/compile_matrix``, else ``$XDG_CACHE_HOME`` or ``~/.cache``."""
    root = os.environ.get("FP8MLA_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "fp8mla"
    )
    return os.path.join(root, "compile_matrix")


@functools.cache
def _toolchain(backend: str, arch: str) -> str:
    """What besides the kernel decides a build's resources: Triton itself (its source and
    libraries), ptxas for NVIDIA targets, the measuring code, the environment options that
    Triton's own cache keys on (``TRITON_DEFAULT_FP_FUSION``, ...)."""
    try:
        from triton.runtime.cache import triton_key  # Triton 3.4+
    except ImportError:
        from triton.compiler.compiler import triton_key

    from fp8mla.tools import kernel_builds

    parts = [triton_key()]
    if backend == "cuda":
        from triton.backends.nvidia.compiler import get_ptxas

        st = os.stat(get_ptxas(int(arch)).path)
        parts.append(f"ptxas {st.st_size} {st.st_mtime_ns}")
    with open(kernel_builds.__file__, "rb") as f:
        parts.append(hashlib.sha256(f.read()).hexdigest())
    try:  # the options Triton's own cache keys on (not, say, TRITON_CACHE_AUTOTUNING)
        from triton._C.libtriton import get_cache_invalidating_env_vars

        options = get_cache_invalidating_env_vars()
    except ImportError:
        skip = ("TRITON_INTERPRET", "TRITON_CACHE_DIR", "TRITON_HOME")
        options = {k: v for k, v in os.environ.items() if k.startswith("TRITON_") and k not in skip}
    parts += sorted(f"{k}={v}" for k, v in options.items())
    return "\n".join(parts)


def cached_measure(build: Build, target: Target, cache_dir: str | None) -> Resources:
    """``measure(build, target)``, through the cache in ``cache_dir`` (None: no cache)."""
    with warnings.catch_warnings():  # Triton 3.9 warns about its FP-fusion default change
        warnings.filterwarnings("ignore", message=".*TRITON_DEFAULT_FP_FUSION")
        if cache_dir is None:
            return measure(build, target)
        try:
            source = build.function().cache_key  # the kernel and the jit code it calls
            text = "\n".join(
                [source, repr(build), repr(target), _toolchain(target.backend, str(target.arch))]
            )
        except Exception as exc:  # noqa: BLE001 -- no key: build it without the cache
            _cache_off(f"{type(exc).__name__}: {exc}")
            return measure(build, target)
        key = hashlib.sha256(text.encode()).hexdigest()
        path = os.path.join(cache_dir, key[:2], f"{key}.json")
        try:
            with open(path, encoding="utf-8") as f:
                return Resources(**json.load(f))
        except (OSError, ValueError, TypeError):
            pass
        res = measure(build, target)
    if res.ok:  # a compile error is not kept: it may come from the machine, not the kernel
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".tmp")
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(asdict(res), f)
            os.replace(tmp, path)
        except OSError:
            pass  # a read-only or full cache only costs the rebuild
    return res


@functools.lru_cache(maxsize=1)
def _cache_off(why: str) -> None:
    """Say once per process that builds are not cached, and why."""
    print(f"compile matrix: build cache off ({why})", file=sys.stderr, flush=True)


def die_with_parent(parent: int) -> None:
    """Make this process die with ``parent``, the process that started it (Linux: the kernel
    sends SIGKILL when the parent exits, however it ends), so no build outlives the run. Each
    build process calls it; so does the command itself when ``$FP8MLA_DIE_WITH_PARENT`` holds
    its parent's pid (the compile-matrix test sets it)."""
    if sys.platform.startswith("linux"):
        import ctypes
        import signal

        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent:  # the parent died before the line above
        os._exit(1)


def progress_lines(stream=None, every: int = 20, seconds: float = 60.0) -> ProgressFn:
    """A :data:`ProgressFn` printing ``compile matrix: 120/438 built, 0 failed (145 s)`` every
    ``every`` builds, at least every ``seconds`` while builds complete, and at the end."""
    stream = stream or sys.stderr
    start = last = time.monotonic()

    def report(done: int, total: int, failed: int) -> None:
        nonlocal last
        now = time.monotonic()
        if done % every and done != total and now - last < seconds:
            return
        last = now
        stream.write(
            f"compile matrix: {done}/{total} built, {failed} failed ({now - start:.0f} s)\n"
        )
        stream.flush()

    return report
