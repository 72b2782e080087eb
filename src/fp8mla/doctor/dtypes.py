"""Dtype names as traces spell them (``c10::BFloat16``, ``float``, ScalarType codes), normalized
to torch's names (``bfloat16``), with their sizes in bytes."""

from __future__ import annotations

import re

# c10::ScalarType enum values, as ``Concrete Inputs`` shows a ``dtype`` argument.
_SCALAR_TYPE_CODES = {
    0: "uint8",
    1: "int8",
    2: "int16",
    3: "int32",
    4: "int64",
    5: "float16",
    6: "float32",
    7: "float64",
    11: "bool",
    15: "bfloat16",
    23: "float8_e5m2",
    24: "float8_e4m3fn",
    25: "float8_e5m2fnuz",
    26: "float8_e4m3fnuz",
}

_ALIASES = {
    "float": "float32",
    "double": "float64",
    "half": "float16",
    "c10::half": "float16",
    "__half": "float16",
    "c10::bfloat16": "bfloat16",
    "__nv_bfloat16": "bfloat16",
    "__hip_bfloat16": "bfloat16",
    "c10::float8_e4m3fn": "float8_e4m3fn",
    "c10::float8_e5m2": "float8_e5m2",
    "c10::float8_e4m3fnuz": "float8_e4m3fnuz",
    "c10::float8_e5m2fnuz": "float8_e5m2fnuz",
    "__nv_fp8_e4m3": "float8_e4m3fn",
    "__nv_fp8_e5m2": "float8_e5m2",
    "long int": "int64",
    "long": "int64",
    "int64_t": "int64",
    "int": "int32",
    "short int": "int16",
    "short": "int16",
    "signed char": "int8",
    "unsigned char": "uint8",
    "bool": "bool",
    "c10::complex<float>": "complex64",
    "c10::complex<double>": "complex128",
}

SIZES = {
    "float64": 8,
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "float8_e4m3fnuz": 1,
    "float8_e5m2fnuz": 1,
    "int64": 8,
    "int32": 4,
    "int16": 2,
    "int8": 1,
    "uint8": 1,
    "bool": 1,
    "complex64": 8,
    "complex128": 16,
}

# The scalar type a direct_copy_kernel_cuda lambda takes is the destination dtype.
_KERNEL_LAMBDA = re.compile(r"copy_kernel_cuda.*?\{lambda\(([^)]+)\)#\d+\}")


def normalize(name: object) -> str | None:
    """``c10::BFloat16`` → ``bfloat16``; unknown or non-tensor types (``Scalar``) → None."""
    if not isinstance(name, str) or not name:
        return None
    key = name.strip().lower()
    if key in _ALIASES:
        return _ALIASES[key]
    if key in SIZES:
        return key
    return None


def from_code(text: object) -> str | None:
    """A ScalarType code as ``Concrete Inputs`` writes it (``"15"``) → ``bfloat16``."""
    if isinstance(text, str) and text.isdigit():
        return _SCALAR_TYPE_CODES.get(int(text))
    return None


def kernel_destination(kernel_name: str) -> str | None:
    """The destination dtype of an ATen copy kernel, from its template name, or None."""
    m = _KERNEL_LAMBDA.search(kernel_name)
    return normalize(m.group(1)) if m else None


def size(dtype: str | None) -> int | None:
    """Bytes per element of a normalized dtype name, or None."""
    return SIZES.get(dtype) if dtype else None
