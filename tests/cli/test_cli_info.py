"""``fp8mla info`` on this machine."""

from __future__ import annotations

import json

from fp8mla.cli import main

from conftest import HAS_CUDA, INTERPRETED


def test_info_reports_versions_and_mode(capsys):
    assert main(["info", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    import torch
    import triton

    assert info["torch"] == torch.__version__ and info["triton"] == triton.__version__
    if HAS_CUDA:
        assert info["compute_capability"] and info["sm_count"] > 0
        assert info["triton_mode"] == ("interpreted" if INTERPRETED else "compiled")
    else:
        assert info["device"] == "cpu" and info["triton_mode"] == "interpreted"


def test_info_text(capsys):
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert "fp8mla" in out and "triton_mode" in out
