"""Attention backends over the shared KV slot space: paged, cascade and granikv (+ dispatcher)."""
