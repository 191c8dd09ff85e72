"""Stub of sglang.srt.runtime_context: a single-rank parallel layout."""

from types import SimpleNamespace


def get_parallel():
    return SimpleNamespace(pp_rank=0, attn_tp_rank=0, attn_cp_rank=0)
