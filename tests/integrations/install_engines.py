"""Install the pinned engine packages for tests/integrations into a target folder.

    python tests/integrations/install_engines.py --target .venv/engines
    python tests/integrations/install_engines.py --target .venv/engines-vllm-0.34 \
        --requirements tests/integrations/requirements-engines-vllm-0.34.txt

Everything in the requirements file (default requirements-engines.txt) goes in with
``pip install --no-deps --target``, apart from fp8mla's environment (whose CPU torch the
engines must not replace); a copy of the file goes beside it as ``requirements.txt``, which
tells the tests the folder's engine pins. When pip fails and the package registry cannot be
reached, the folder gets an ``UNREACHABLE`` file saying so and the script exits 0: the
integration tests then skip with that one line. Any other failure fails the build.
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REQUIREMENTS = HERE / "requirements-engines.txt"
STAMP = ".installed"
UNREACHABLE = "UNREACHABLE"
ENGINES = ("sglang", "vllm")
PINS = "requirements.txt"  # the copy in the target: its engine pins, read by the tests


def _pip(*args: str, timeout: int) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "pip", "--disable-pip-version-check", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def registry_reachable() -> bool:
    """Whether pip can list a pinned engine's releases (the registry answers)."""
    try:
        probe = _pip("index", "versions", "sglang", "--retries", "0", "--timeout", "15", timeout=60)
    except subprocess.TimeoutExpired:
        return False
    return probe.returncode == 0


def engine_pins(requirements: Path) -> dict[str, str]:
    """The engines a requirements file pins (``sglang``, ``vllm``), with their versions."""
    pins = {}
    for line in requirements.read_text().splitlines():
        name, _, version = line.strip().partition("==")
        if name in ENGINES:
            pins[name] = version
    return pins


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", required=True, type=Path)
    ap.add_argument("--requirements", type=Path, default=REQUIREMENTS)
    args = ap.parse_args()
    target: Path = args.target
    requirements: Path = args.requirements
    digest = hashlib.sha256(requirements.read_bytes()).hexdigest()
    if (target / STAMP).is_file() and (target / STAMP).read_text().strip() == digest:
        return 0
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    print(f"fp8mla: installing the pinned engine packages into {target} (no dependencies)")
    res = _pip(
        "install", "-q", "--no-deps", "--no-compile", "--target", str(target),
        "-r", str(requirements), timeout=1800,
    )  # fmt: skip
    shutil.copyfile(requirements, target / PINS)
    if res.returncode == 0:
        (target / STAMP).write_text(digest + "\n")
        return 0
    if not registry_reachable():
        pins = " / ".join(f"{n}=={v}" for n, v in engine_pins(requirements).items())
        msg = f"package registry unreachable: {pins} not installed"
        (target / UNREACHABLE).write_text(msg + "\n")
        print(f"fp8mla: {msg}; the engine integration tests will skip")
        return 0
    sys.stderr.write(res.stdout[-4000:] + res.stderr[-4000:])
    return res.returncode


if __name__ == "__main__":
    raise SystemExit(main())
