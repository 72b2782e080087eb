"""SGLang 0.5.23 loads fp8mla through its official plugin entry point and picks it by name."""

from __future__ import annotations

import argparse
import importlib.metadata as md
from types import SimpleNamespace

import pytest

pytest.importorskip("sglang", reason="sglang not installed (run make test)")


@pytest.fixture(scope="module")
def plugins_loaded():
    from sglang.srt.plugins import load_plugins

    load_plugins()  # what sglang serve / Engine / every scheduler process does


def test_entry_point_declared():
    eps = md.entry_points(group="sglang.srt.plugins")
    assert "fp8mla" in eps.names
    assert eps["fp8mla"].value == "fp8mla.integrations.sglang:register"


def test_plugin_registers_backend_lists_and_handler(plugins_loaded):
    from sglang.srt.arg_groups.choices import ATTENTION_BACKEND_CHOICES
    from sglang.srt.arg_groups.overrides import POST_PROCESS_PASSES
    from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS
    from sglang.srt.models.deepseek_common.attention_backend_handler import (
        AttentionBackendRegistry,
    )
    from sglang.srt.models.deepseek_common.attention_forward_methods.forward_methods import (
        AttnForwardMethod,
    )
    from sglang.srt.models.deepseek_common.utils import FORWARD_ABSORB_CORE_ATTENTION_BACKENDS

    from fp8mla.integrations.sglang import check_server_args, create_backend, register

    assert ATTENTION_BACKENDS["fp8mla"] is create_backend
    assert ATTENTION_BACKEND_CHOICES.count("fp8mla") == 1
    assert "fp8mla" in FORWARD_ABSORB_CORE_ATTENTION_BACKENDS
    assert check_server_args in POST_PROCESS_PASSES
    handler = AttentionBackendRegistry.get_handler("fp8mla")
    assert handler(SimpleNamespace(), SimpleNamespace()) is AttnForwardMethod.MLA
    register()  # idempotent: processes may load plugins more than once
    assert ATTENTION_BACKEND_CHOICES.count("fp8mla") == 1
    assert FORWARD_ABSORB_CORE_ATTENTION_BACKENDS.count("fp8mla") == 1


@pytest.mark.parametrize(
    "flags",
    [
        ["--attention-backend", "fp8mla"],
        ["--decode-attention-backend", "fp8mla", "--prefill-attention-backend", "fp8mla"],
    ],
)
def test_cli_flag_parses(plugins_loaded, flags):
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    args = parser.parse_args(["--model-path", "unused", "--kv-cache-dtype", "fp8_e4m3", *flags])
    chosen = {args.attention_backend, args.decode_attention_backend, args.prefill_attention_backend}
    assert "fp8mla" in chosen


def _view(**kw):
    base = dict(
        attention_backend="fp8mla",
        prefill_attention_backend=None,
        decode_attention_backend=None,
        kv_cache_dtype="fp8_e4m3",
        dtype="auto",
        page_size=64,
        dcp_size=1,
        speculative_algorithm=None,
        speculative_eagle_topk=None,
        speculative_draft_attention_backend=None,
    )
    return SimpleNamespace(**{**base, **kw})


def test_server_args_accepted():
    from fp8mla.integrations.sglang import check_server_args

    assert check_server_args(_view()) == {}
    assert check_server_args(_view(page_size=1, kv_cache_dtype="auto", dtype="bfloat16")) == {}
    ok_spec = _view(speculative_algorithm="EAGLE", speculative_eagle_topk=1,
                    speculative_draft_attention_backend="triton")  # fmt: skip
    assert check_server_args(ok_spec) == {}
    # another backend: not fp8mla's business
    assert check_server_args(_view(attention_backend="triton", kv_cache_dtype="fp4_e2m1")) == {}


@pytest.mark.parametrize(
    "bad, option",
    [
        (dict(kv_cache_dtype="fp4_e2m1"), "--kv-cache-dtype"),
        (dict(dtype="float32"), "--dtype"),
        (dict(page_size=256), "--page-size"),
        (dict(dcp_size=2), "--dcp-size"),
        (
            dict(
                speculative_algorithm="EAGLE",
                speculative_eagle_topk=4,
                speculative_draft_attention_backend="triton",
            ),
            "--speculative-eagle-topk",
        ),  # fmt: skip
        (
            dict(speculative_algorithm="EAGLE", speculative_eagle_topk=1),
            "--speculative-draft-attention-backend",
        ),  # fmt: skip
        (
            dict(
                attention_backend="triton",
                decode_attention_backend="fp8mla",
                kv_cache_dtype="fp4_e2m1",
            ),
            "--kv-cache-dtype",
        ),  # fmt: skip
    ],
)
def test_server_args_refused_in_one_line(bad, option):
    from fp8mla.integrations import IntegrationConfigError
    from fp8mla.integrations.sglang import check_server_args

    with pytest.raises(IntegrationConfigError) as err:
        check_server_args(_view(**bad))
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith("fp8mla (sglang): ") and option in msg
