"""`create_engine(config)`: a plain Engine for TP=1, a TPEngine (rank 0 + workers) otherwise."""

from granikv.engine.tp import create_engine

__all__ = ["create_engine"]
