"""Page allocator: hands out page ids of a fixed pool, all-or-nothing."""

from __future__ import annotations


class PoolExhaustedError(RuntimeError):
    """Raised when an allocation needs more free pages than the pool has; nothing changed."""


class PageAllocator:
    """Free-list allocator over page ids ``0 .. num_pages-1``.

    ``alloc(n)`` returns ``n`` distinct free pages or raises :class:`PoolExhaustedError`
    leaving the state unchanged; ``free`` rejects pages that are not currently allocated.
    """

    def __init__(self, num_pages: int) -> None:
        if num_pages < 1:
            raise ValueError(f"expected num_pages >= 1, got {num_pages}")
        self.num_pages = num_pages
        # Pop from the end: hand out low page ids first.
        self._free: list[int] = list(range(num_pages - 1, -1, -1))
        self._used: set[int] = set()

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return len(self._used)

    def alloc(self, n: int) -> list[int]:
        if n < 0:
            raise ValueError(f"expected a page count >= 0, got {n}")
        if n > len(self._free):
            raise PoolExhaustedError(
                f"pool exhausted: {n} pages requested, {len(self._free)} of {self.num_pages} free"
            )
        pages = [self._free.pop() for _ in range(n)]
        self._used.update(pages)
        return pages

    def free(self, pages: list[int]) -> None:
        seen: set[int] = set()
        for p in pages:
            if p not in self._used or p in seen:
                raise ValueError(f"expected an allocated page, got page {p} (not allocated)")
            seen.add(p)
        self._used.difference_update(pages)
        self._free.extend(reversed(pages))

    def is_used(self, page: int) -> bool:
        return page in self._used
