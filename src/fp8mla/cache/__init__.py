"""The MLA KV cache: paged pool, allocator and the quantizing write path."""

from fp8mla.cache.allocator import PageAllocator, PoolExhaustedError
from fp8mla.cache.pool import MLAKVCache

__all__ = ["MLAKVCache", "PageAllocator", "PoolExhaustedError"]
