"""Prefix caching: the pool that shares cached prefix blocks between sequences
(`PrefixPool`) and the read-only mirror of a live engine's prefix cache (`MirrorPool`)."""
