"""The name, index and argument rules that decide what counts as a KV pool and a cast."""

from __future__ import annotations

import ast

import pytest

from fp8mla.scan import patterns as pat


def expr(source: str) -> ast.expr:
    return ast.parse(source, mode="eval").body


@pytest.mark.parametrize(
    "name",
    [
        "k_buffer", "v_buffer", "kv_buffer", "key_buffer", "value_buffer", "k_buf", "kv_buffers",
        "kv_cache", "key_cache", "value_cache", "kv_caches", "kv_c_and_k_pe_cache", "_kv_cache",
        "token_to_kv_pool", "kv_pool", "pool", "mem_pool", "KV_POOL",
    ],
)  # fmt: skip
def test_kv_buffer_names(name: str) -> None:
    assert pat.is_buffer_name(name)


@pytest.mark.parametrize(
    "name",
    [
        "kv_cache_dtype", "kv_pool_size", "req_to_token_pool", "thread_pool", "max_pool",
        "cos_sin_cache", "logits_buffer", "workspace_buffer", "cache", "buffer", "k",
        "kv_indices", "cache_k", "latent_cache", "hidden_states", "token_to_kv_pool_size",
        "kv_cache_spec", "kv_pool_allocator",
    ],
)  # fmt: skip
def test_names_that_are_not_kv_buffers(name: str) -> None:
    assert not pat.is_buffer_name(name)


@pytest.mark.parametrize(
    ("name", "is_getter"),
    [
        ("get_key_buffer", True),
        ("get_value_buffer", True),
        ("get_kv_buffer", True),
        ("get_mla_kv_buffer", True),
        ("get_kv_cache_buffer", True),
        ("get_global_dp_buffer", False),
        ("get_label_buffer", False),
        ("get_key", False),
        ("set_kv_buffer", False),
    ],
)
def test_buffer_getters(name: str, is_getter: bool) -> None:
    assert pat.is_buffer_getter(name) is is_getter


@pytest.mark.parametrize(
    "index",
    [
        ":, :, :512", ":, :, 512:", "..., :512", ":, :, : layer.v_head_dim", "0", "-1",
        "layer_id", "layer.layer_id", "layer_id - self.start_layer", "ctx.virtual_engine",
        "None, :", "::2",
    ],
)  # fmt: skip
def test_basic_indexing_keeps_the_whole_pool(index: str) -> None:
    assert pat.is_basic_index(expr(f"buf[{index}]").slice)


@pytest.mark.parametrize(
    "index",
    ["loc", "indices", "forward_batch.out_cache_loc", ":, kv_indices", "[0, 3, 5]", "mask",
     "idx[1:]", "True", "i"],
)  # fmt: skip
def test_advanced_indexing_gathers(index: str) -> None:
    assert not pat.is_basic_index(expr(f"buf[{index}]").slice)


def test_loop_counters_known_to_be_ints_index_one_layer() -> None:
    assert pat.is_basic_index(expr("buf[i]").slice, frozenset({"i"}))
    assert pat.is_basic_index(expr("buf[i + 1]").slice, frozenset({"i"}))


@pytest.mark.parametrize(
    ("source", "kind"),
    [
        ("torch.bfloat16", "dtype"),
        ("torch.float8_e4m3fn", "dtype"),
        ("q.dtype", "dtype"),
        ("self.data_type", "dtype"),
        ("model_dtype", "dtype"),
        ("bfloat16", "dtype"),
        ("get_dtype()", "dtype"),
        ("'cuda'", "device"),
        ("q.device", "device"),
        ("self.device", "device"),
        ("torch.device('cuda', 0)", "device"),
        ("torch.cuda.current_device()", "device"),
        ("local_rank", "device"),
        ("q", "tensor"),
        ("self.reference", "tensor"),
        ("True", "other"),
        ("3", "other"),
    ],
)
def test_to_argument_kinds(source: str, kind: str) -> None:
    assert pat.arg_kind(expr(source)) == kind
