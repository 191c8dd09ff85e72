"""The keyed KV cache over a pool (`KVCache`) and its eviction policies."""
