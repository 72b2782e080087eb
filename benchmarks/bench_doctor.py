"""Benchmark ``fp8mla doctor`` on a large synthetic trace: time and peak memory.

Generates a GLM-5-shaped decode trace (78 layers, with Python stacks and shapes) of about
``--size-gb`` GB of uncompressed JSON in /tmp, then runs ``diagnose()`` in a child process and
reports wall time, throughput and the child's peak RSS (``resource.getrusage``). The target in
docs/doctor.md: 1 GB in ≤ 60 s with ≤ 2 GB peak memory on a 2-core machine.

    python benchmarks/bench_doctor.py                 # ~1 GB, plain JSON
    python benchmarks/bench_doctor.py --gzip          # the same, gzipped
    python benchmarks/bench_doctor.py --size-gb 0.1   # a quick run
"""

from __future__ import annotations

import argparse
import datetime
import gzip
import json
import os
import platform
import resource
import subprocess
import sys
import time

from fp8mla.doctor.synth import SynthSpec, iter_events, write_trace

_CHILD = """
import json, sys, time
from fp8mla.doctor import diagnose
t = time.perf_counter()
report = diagnose(sys.argv[1], progress=True)
elapsed = time.perf_counter() - t
top = report["findings"][0] if report["findings"] else {}
print(json.dumps({"seconds": elapsed, "steps": report["steps"]["count"],
                  "method": report["steps"]["method"], "layers": report["layers"],
                  "events": report["trace"]["events"], "kind": top.get("kind"),
                  "calls_per_step": top.get("calls_per_step")}))
"""


def _spec(size_bytes: float) -> SynthSpec:
    base = SynthSpec(layers=78, steps=1, pool_slots=495_552, python_noise=24)
    per_step = sum(len(e) + 2 for e in iter_events(base))
    return SynthSpec(
        layers=78, steps=max(2, round(size_bytes / per_step)), pool_slots=495_552, python_noise=24
    )


def _uncompressed_size(path: str) -> int:
    if not path.endswith(".gz"):
        return os.path.getsize(path)
    total = 0
    with gzip.open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            total += len(chunk)
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-gb", type=float, default=1.0, help="uncompressed size (GB)")
    parser.add_argument("--gzip", action="store_true", help="write .json.gz")
    parser.add_argument("--path", default=None, help="trace path (default: /tmp/...)")
    parser.add_argument("--reuse", action="store_true", help="reuse an existing trace file")
    parser.add_argument("--keep", action="store_true", help="keep the trace afterwards")
    args = parser.parse_args()

    path = args.path or f"/tmp/fp8mla_doctor_bench_{args.size_gb:g}gb.json" + (
        ".gz" if args.gzip else ""
    )
    if not (args.reuse and os.path.exists(path)):
        spec = _spec(args.size_gb * 1e9)
        t = time.perf_counter()
        write_trace(path, spec)
        print(
            f"generated {path}: {spec.steps} steps × {spec.layers} layers, "
            f"{os.path.getsize(path) / 1e9:.2f} GB on disk in {time.perf_counter() - t:.0f} s",
            file=sys.stderr,
        )
    size = _uncompressed_size(path)
    on_disk = os.path.getsize(path)
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, path], capture_output=True, text=True, check=False
    )
    if proc.returncode:
        sys.exit(f"diagnose failed:\n{proc.stderr}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    peak_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024  # Linux: kB
    row = {
        "date": datetime.date.today().isoformat(),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.system()}",
        "python": platform.python_version(),
        "json_gb": round(size / 1e9, 3),
        "file_gb": round(on_disk / 1e9, 3),
        "gzip": args.gzip,
        "seconds": round(result["seconds"], 1),
        "mb_per_s": round(size / 1e6 / result["seconds"], 1),
        "peak_rss_mb": round(peak_mb),
        **{k: result[k] for k in ("events", "steps", "method", "layers", "kind", "calls_per_step")},
    }
    print(json.dumps(row))
    print(
        f"| {row['date']} | {row['machine']} | {row['json_gb']} GB"
        f"{f' ({on_disk / 1e6:.0f} MB gz)' if args.gzip else ''} | {row['events']:,} | "
        f"{row['seconds']} s | {row['mb_per_s']} MB/s | {row['peak_rss_mb']} MB |"
    )
    if not args.keep and not args.reuse:
        os.remove(path)


if __name__ == "__main__":
    main()
