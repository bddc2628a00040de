"""Benchmarking and reproduction harness for GraniKV (imports granikv, never the reverse)."""
