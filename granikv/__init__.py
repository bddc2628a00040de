"""GraniKV: asymmetric-granularity KV-cache paging for long shared prefixes.

The engine package. It imports nothing from `harness` (the dependency runs the other way):
`engine -> attention -> kernels`, `engine -> memory`; `kernels` import nothing of the project.
"""

__version__ = "0.1.0"
