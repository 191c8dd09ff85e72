"""The seed article's allocator and LRU, rendered literally in Python: the benchmarks' baseline.

Faithful to `seed/000_f187779576f11005.txt` (Go): one `Block` object per block, a list free list
per `BlockPool` (append / pop at the end, under a mutex), blocks created on demand by
`allocate_block` ("malloc"), the three-tier `KVCacheAllocator` (small / medium / large by size,
`blocks_needed` blocks from one pool, all-or-nothing) and `KVCacheLRU`: a dict plus a doubly
linked list (Go's container/list), new entries at the front, evicting from the back while
`cur_size + size > max_size`.

NOTE: the article's bugs, and what this rendering does with them:
- `allocate_block` stamps every block with pool_id 0, so `KVCacheAllocator.free` returns every
  block, medium and large ones included, to the *small* pool (kvscope's TieredPool fixes this).
  Kept with `KVCacheAllocator(article_bug=True)`; off by default, since with it a benchmark
  that frees large blocks runs the large pool dry within one pool's worth of requests;
- `KVCacheLRU.put` loops forever when `size > max_size` (the loop here stops on an empty list,
  where the Go `evict` returned without progress);
- `put` of an existing key ignores a new size.
Memory is a row of one preallocated torch tensor instead of malloc, so that "malloc" here costs
what it costs kvscope: nothing per block beyond the bookkeeping being compared.
"""

from __future__ import annotations

import threading

import torch


class OutOfMemoryError(Exception):
    pass


class Block:
    """Go: type Block struct { ptr unsafe.Pointer; size int; inUse bool; poolID int }."""

    __slots__ = ("ptr", "size", "in_use", "pool_id")

    def __init__(self, ptr: int, size: int, pool_id: int = 0) -> None:
        self.ptr = ptr
        self.size = size
        self.in_use = False
        self.pool_id = pool_id  # the article always leaves 0 here: see the module NOTE


class BlockPool:
    """Go: BlockPool { blockSize; freeList []*Block; mu sync.Mutex; total; allocated }."""

    def __init__(self, block_size: int, pre_allocate: int, max_blocks: int | None = None,
                 pool_id: int = 0) -> None:
        self.block_size = block_size
        self.pool_id = pool_id
        self.free_list: list[Block] = []
        self.mu = threading.Lock()
        self.total = 0
        self.allocated = 0
        # The article mallocs without limit; a bound stands in for "malloc returned nil".
        self.max_blocks = max_blocks if max_blocks is not None else pre_allocate
        for _ in range(pre_allocate):
            block = self.allocate_block()
            if block is not None:
                self.free_list.append(block)

    def allocate(self) -> Block | None:
        with self.mu:
            if self.free_list:
                block = self.free_list.pop()
                block.in_use = True
                self.allocated += 1
                return block
            block = self.allocate_block()
            if block is not None:
                block.in_use = True
                self.allocated += 1
                return block
            return None

    def free(self, block: Block) -> None:
        with self.mu:
            if not block.in_use:
                return
            block.in_use = False
            self.allocated -= 1
            self.free_list.append(block)

    def allocate_block(self) -> Block | None:
        if self.total >= self.max_blocks:
            return None  # malloc failed
        block = Block(self.total, self.block_size, self.pool_id)
        self.total += 1
        return block

    def usage(self) -> float:
        return self.allocated / self.total


class KVCacheAllocator:
    """Go: three pools; a request goes to the pool for its size, takes ceil(size/block) blocks."""

    def __init__(self, small: int, medium: int, large: int,
                 counts: tuple[int, int, int] = (10, 5, 2), article_bug: bool = False) -> None:
        # article_bug=True keeps pool_id 0 on every block, as published: every freed block then
        # lands in the small pool and the large pool runs dry after `counts[2]` blocks.
        ids = (0, 0, 0) if article_bug else (0, 1, 2)
        self.small_pool = BlockPool(small, counts[0], pool_id=ids[0])
        self.medium_pool = BlockPool(medium, counts[1], pool_id=ids[1])
        self.large_pool = BlockPool(large, counts[2], pool_id=ids[2])

    def allocate(self, size: int) -> list[Block]:
        if size <= self.small_pool.block_size:
            pool = self.small_pool
        elif size <= self.medium_pool.block_size:
            pool = self.medium_pool
        else:
            pool = self.large_pool
        blocks_needed = (size + pool.block_size - 1) // pool.block_size
        blocks: list[Block] = []
        for _ in range(blocks_needed):
            block = pool.allocate()
            if block is None:
                self.free(blocks)
                raise OutOfMemoryError
            blocks.append(block)
        return blocks

    def free(self, blocks: list[Block]) -> None:
        for block in blocks:
            if block.pool_id == 0:  # always true: see the module NOTE
                self.small_pool.free(block)
            elif block.pool_id == 1:
                self.medium_pool.free(block)
            else:
                self.large_pool.free(block)


class _Element:
    """Go container/list Element: a doubly linked node."""

    __slots__ = ("value", "prev", "next")

    def __init__(self, value: object) -> None:
        self.value = value
        self.prev: _Element | None = None
        self.next: _Element | None = None


class LinkedList:
    """Go container/list: a ring with a sentinel root; front = most recently used."""

    def __init__(self) -> None:
        self.root = _Element(None)
        self.root.prev = self.root.next = self.root
        self.len = 0

    def _insert_after(self, e: _Element, at: _Element) -> _Element:
        e.prev, e.next = at, at.next
        at.next.prev = e
        at.next = e
        self.len += 1
        return e

    def push_front(self, value: object) -> _Element:
        return self._insert_after(_Element(value), self.root)

    def remove(self, e: _Element) -> None:
        e.prev.next = e.next
        e.next.prev = e.prev
        e.prev = e.next = None
        self.len -= 1

    def move_to_front(self, e: _Element) -> None:
        if self.root.next is e:
            return
        e.prev.next = e.next
        e.next.prev = e.prev
        self.len -= 1
        self._insert_after(e, self.root)

    def back(self) -> _Element | None:
        return None if self.len == 0 else self.root.prev


class CacheEntry:
    __slots__ = ("key", "blocks", "last_used", "size", "element")

    def __init__(self, key: str, blocks: list[Block], last_used: float, size: int) -> None:
        self.key = key
        self.blocks = blocks
        self.last_used = last_used
        self.size = size
        self.element: _Element | None = None


class KVCacheLRU:
    """Go: KVCacheLRU { allocator; cache map[string]*CacheEntry; lruList; mu; maxSize; curSize }."""

    def __init__(self, allocator: KVCacheAllocator, max_size: int, clock=None) -> None:
        import time

        self.allocator = allocator
        self.cache: dict[str, CacheEntry] = {}
        self.lru_list = LinkedList()
        self.mu = threading.Lock()
        self.max_size = max_size
        self.cur_size = 0
        self.now = clock or time.monotonic

    def get(self, key: str) -> list[Block] | None:
        with self.mu:
            entry = self.cache.get(key)
            if entry is None:
                return None
            self.lru_list.move_to_front(entry.element)
            entry.last_used = self.now()
            return entry.blocks

    def put(self, key: str, size: int) -> list[Block]:
        with self.mu:
            entry = self.cache.get(key)
            if entry is not None:
                self.lru_list.move_to_front(entry.element)
                entry.last_used = self.now()
                return entry.blocks
            while self.cur_size + size > self.max_size and self.lru_list.len:
                self._evict()
            blocks = self.allocator.allocate(size)
            entry = CacheEntry(key, blocks, self.now(), size)
            entry.element = self.lru_list.push_front(entry)
            self.cache[key] = entry
            self.cur_size += size
            return blocks

    def _evict(self) -> None:
        last = self.lru_list.back()
        if last is None:
            return
        entry = last.value
        self.allocator.free(entry.blocks)
        del self.cache[entry.key]
        self.lru_list.remove(last)
        self.cur_size -= entry.size

    def remove(self, key: str) -> None:
        with self.mu:
            entry = self.cache.pop(key, None)
            if entry is not None:
                self.allocator.free(entry.blocks)
                self.lru_list.remove(entry.element)
                self.cur_size -= entry.size


def seed_storage(num_blocks: int, block_bytes: int) -> tuple[torch.Tensor, list[Block]]:
    """The seed's way to hold a pool: the memory plus one Python Block object per block."""
    data = torch.empty((num_blocks, block_bytes), dtype=torch.uint8)
    return data, [Block(i, block_bytes) for i in range(num_blocks)]
