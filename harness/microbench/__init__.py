"""Kernel and storage microbenchmarks."""
