"""The pool core: a pool's tensor, block map and event log, the `Pool` base class, the
strategies that place allocations in it (paged, tiered, contiguous), and `PoolSpec`."""
