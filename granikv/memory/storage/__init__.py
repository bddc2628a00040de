"""The storage facades: what the scheduler asks for KV slots, one class per storage policy.

`base` holds the machinery every storage shares (slot table, admit / grow / finish, the radix
cache's locks); `paged` (the `paged` and `cascade` systems) and `granikv` choose the pools and
where shared prefixes go; `audit` holds the invariant checks every storage shares, which each
storage's `audit()` extends with its own. Which storage a system uses is `granikv.systems`'s
business, not this package's.
"""
