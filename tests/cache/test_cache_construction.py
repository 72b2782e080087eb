"""``MLAKVCache`` checks its arguments when it is built, not deep inside torch or at plan()."""

from __future__ import annotations

import pytest
import torch

from fp8mla.cache import MLAKVCache
from fp8mla.cache.pool import MAX_PAGE_SIZE


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_slots": 1e5}, "expected num_slots an integer, got float 100000.0"),
        ({"num_slots": "64"}, "expected num_slots an integer, got str"),
        ({"num_slots": True}, "expected num_slots an integer, got bool"),
        ({"num_slots": 256, "page_size": 256}, r"expected page_size in \[1, 128\]"),
        ({"num_slots": 256, "page_size": 2.0}, "expected page_size an integer"),
        ({"num_slots": 256, "page_size": 0}, r"expected page_size in \[1, 128\]"),
        ({"num_slots": 2**33}, "expected at most 2,147,483,647 pages"),
        ({"num_slots": 64, "dtype": "fp8"}, "expected dtype a torch.dtype, got str"),
        ({"num_slots": 64, "ckv_scale": "1"}, "expected ckv_scale a number, got str"),
        ({"num_slots": 64, "backend": 3}, "expected backend a str, got int"),
        ({"num_slots": 64, "head_dim_ckv": 512.0}, "expected head_dim_ckv an integer"),
    ],
)
def test_bad_arguments_are_refused_at_construction(kwargs, message):
    with pytest.raises(ValueError, match=message):
        MLAKVCache(**kwargs)


def test_integer_like_sizes_are_accepted():
    np = pytest.importorskip("numpy")
    cache = MLAKVCache(np.int64(64), page_size=torch.tensor(16))
    assert (cache.num_slots, cache.page_size, cache.num_pages) == (64, 16, 4)
    assert type(cache.num_slots) is int


def test_page_size_limit_is_the_wrappers():
    from fp8mla.attention.wrapper import MAX_PAGE_SIZE as WRAPPER_LIMIT

    assert MAX_PAGE_SIZE == WRAPPER_LIMIT
    MLAKVCache(MAX_PAGE_SIZE, page_size=MAX_PAGE_SIZE)
