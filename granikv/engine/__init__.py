"""The engine: requests, scheduler, model runner and the in-process Engine API."""
