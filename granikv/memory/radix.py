"""RadixCache: radix tree over token ids whose nodes know which pool their KV lives in.

Each node holds the slots of its tokens and a pool identity (paper §3.4): `hot` (a slab and the
offset of the node's first token inside it), `cold`, or `paged`. Matching, insertion, splitting,
reference counting and LRU eviction are the usual RadixAttention ones; the pool identity adds two
rules: a split inside a slab leaves both halves pointing into the same slab with the right offsets,
and evicting a HOT node only drops the slab's node reference, so the slab's range is released
when no node points into it any more (and no request holds it).

With `page_size` P > 1 (the paged systems) every node key is a whole number of pages: matches are
rounded down to a page multiple and children are keyed by their first page.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from granikv.memory.hot import HotPool, Slab

HOT, COLD, PAGED = "hot", "cold", "paged"


@dataclass(frozen=True)
class Segment:
    """Positions `[start, end)` of a sequence live in pool `kind` (for `hot`: slab, offset of start)."""

    start: int
    end: int
    kind: str
    slab: Slab | None = None
    offset: int = 0


class Node:
    __slots__ = ("id", "key", "slots", "kind", "slab", "offset", "parent", "children", "lock_ref",
                 "last_access", "promoting")

    def __init__(self, id: int, key: np.ndarray, slots: np.ndarray, kind: str, slab: Slab | None,
                 offset: int, parent: Node | None):
        self.id = id
        self.key = key
        self.slots = slots
        self.kind = kind
        self.slab = slab
        self.offset = offset
        self.parent = parent
        self.children: dict = {}
        self.lock_ref = 0
        self.last_access = 0
        self.promoting = False

    def __len__(self) -> int:
        return len(self.key)

    def __repr__(self) -> str:
        where = f"slab{self.slab.id}+{self.offset}" if self.slab is not None else self.kind
        return f"Node({self.id}, len={len(self.key)}, {where}, lock={self.lock_ref})"


@dataclass
class Match:
    node: Node  # deepest matched node (the root when nothing matched)
    parts: list[np.ndarray]  # slots of the matched nodes, in order
    length: int

    @property
    def slots(self) -> np.ndarray:
        """int32 slots of the matched tokens in order (concatenated on each access)."""
        return np.concatenate(self.parts) if self.parts else np.empty(0, dtype=np.int32)


class RadixCache:
    """Prefix cache. `free(kind, slots)` returns slots of evicted COLD/PAGED nodes to their pool
    and says how many slots that freed; HOT nodes go through `hot`'s node references."""

    def __init__(self, free: Callable[[str, np.ndarray], int], hot: HotPool | None = None,
                 page_size: int = 1):
        self.page_size = page_size
        self._free = free
        self.hot = hot
        self._ids = itertools.count(1)
        self._clock = itertools.count(1)
        empty = np.empty(0, dtype=np.int32)
        self.root = Node(0, empty, empty, COLD, None, 0, None)
        self.root.lock_ref = 1  # the root is never evicted
        self._scratch = np.empty(4096, dtype=bool)

    # ---- helpers -------------------------------------------------------------------------------
    def _child_key(self, key: np.ndarray):
        """Children are keyed by their first token (P = 1) or the raw bytes of their first page
        (int32 tokens; bytes hash and compare faster than a tuple of P ints)."""
        return key.item(0) if self.page_size == 1 else key[: self.page_size].tobytes()

    def _key_at(self, tokens: np.ndarray, pos: int):
        """Child key of the sequence starting at `pos` (`_child_key(tokens[pos:])`, no slice)."""
        P = self.page_size
        return tokens.item(pos) if P == 1 else tokens[pos : pos + P].tobytes()

    def _common(self, a: np.ndarray, b: np.ndarray) -> int:
        """Length of the common prefix of a and b (rounded down to pages)."""
        return self._common_at(a, b, 0) if len(b) else 0

    def _common_at(self, key: np.ndarray, tokens: np.ndarray, pos: int) -> int:
        """Length of the common prefix of `key` and `tokens[pos:]` (rounded down to pages; pos <
        len(tokens)). Compares into a reused scratch buffer: allocating a fresh 16K-element
        temporary costs more than the compare."""
        m = min(len(key), len(tokens) - pos)
        if m <= 0:
            return 0
        if len(self._scratch) < m:
            self._scratch = np.empty(max(m, 2 * len(self._scratch)), dtype=bool)
        ne = self._scratch[:m]
        np.not_equal(key[:m], tokens[pos : pos + m], out=ne)
        i = int(ne.argmax())  # argmax of bools stops at the first True: the first mismatch
        n = i if ne[i] else m
        return n - n % self.page_size

    def nodes(self) -> Iterator[Node]:
        """Every node but the root."""
        stack = list(self.root.children.values())
        while stack:
            n = stack.pop()
            yield n
            stack.extend(n.children.values())

    def position(self, node: Node) -> int:
        """Sequence position of the node's first token."""
        pos, n = 0, node.parent
        while n is not None:
            pos += len(n)
            n = n.parent
        return pos

    def path(self, node: Node) -> list[Node]:
        """Nodes root..node, root excluded."""
        out = []
        while node is not self.root:
            out.append(node)
            node = node.parent
        return out[::-1]

    @property
    def cached_slots(self) -> int:
        return sum(len(n) for n in self.nodes())

    # ---- match / insert ------------------------------------------------------------------------
    def match_prefix(self, tokens: np.ndarray) -> Match:
        """Longest cached prefix of `tokens` (page-aligned with P > 1), splitting a node so the
        match ends on a node boundary (the caller locks that node)."""
        tokens = np.asarray(tokens, dtype=np.int32)
        node, pos, parts = self.root, 0, []
        now = next(self._clock)
        end = len(tokens) - self.page_size  # a child needs a whole first page
        hot = self.hot
        while pos <= end:
            child = node.children.get(self._key_at(tokens, pos))
            if child is None:
                break
            n = self._common_at(child.key, tokens, pos)
            if n == 0:
                break
            if n < len(child):
                child = self._split(child, n)
            child.last_access = now
            if child.slab is not None and hot is not None:
                hot.touch(child.slab)
            parts.append(child.slots)
            node, pos = child, pos + n
        return Match(node, parts, pos)

    def insert(self, tokens: np.ndarray, slots: np.ndarray, segments: list[Segment],
               start: Node | None = None, start_pos: int = 0) -> tuple[int, Node]:
        """Cache `tokens` whose KV sits in `slots`; returns (length already cached, last node).

        Positions already cached keep the tree's slots (the caller frees its duplicates); new
        nodes are cut at segment boundaries, so each node lives in exactly one pool.
        `start`/`start_pos`: a locked node known to hold tokens[:start_pos] (the request's own
        matched path), so its 16K-token prefix is not compared again.
        """
        tokens = np.asarray(tokens, dtype=np.int32)
        slots = np.asarray(slots, dtype=np.int32)
        if len(tokens) != len(slots):
            raise ValueError("tokens and slots differ in length")
        if len(tokens) % self.page_size:
            raise ValueError("insert length must be a multiple of the page size")
        return self._insert(tokens, slots, segments, start, start_pos)

    def _insert(self, tokens: np.ndarray, slots: np.ndarray, segments: list[Segment],
                start: Node | None, start_pos: int) -> tuple[int, Node]:
        """`insert` of int32 arrays already checked (equal lengths, whole pages)."""
        node, pos = (self.root, 0) if start is None else (start, start_pos)
        now = next(self._clock)
        T = len(tokens)
        key_at_pos = None  # child key of tokens[pos:] when the walk stopped for want of a child
        while pos < T:
            k = self._key_at(tokens, pos)
            child = node.children.get(k)
            if child is None:
                key_at_pos = k
                break
            n = self._common_at(child.key, tokens, pos)
            if n == 0:
                break
            if n < len(child):
                child = self._split(child, n)
            child.last_access = now
            node, pos = child, pos + n
        dup = pos
        for seg in segments:
            a, b = max(seg.start, pos), min(seg.end, T)
            if a >= b:
                continue
            if a != pos:
                raise ValueError("segments must cover the inserted positions without gaps")
            hot = seg.kind == HOT
            key = tokens[a:b].copy()
            new = Node(next(self._ids), key, slots[a:b].copy(), seg.kind, seg.slab,
                       seg.offset + (a - seg.start) if hot else 0, node)
            new.last_access = now
            if hot:
                self.hot.add_node_ref(seg.slab)
            node.children[key_at_pos if key_at_pos is not None else self._key_at(key, 0)] = new
            key_at_pos = None
            node, pos = new, b
        if pos != T:
            raise ValueError("segments must cover the inserted positions")
        return dup, node

    def _split(self, child: Node, n: int) -> Node:
        """Cut `child` after n tokens; the new upper node takes its place, `child` keeps the rest
        (so references to `child` held by requests stay the deepest node of their path)."""
        up = Node(next(self._ids), child.key[:n], child.slots[:n], child.kind, child.slab, child.offset,
                  child.parent)
        up.lock_ref = child.lock_ref
        up.last_access = child.last_access
        up.promoting = child.promoting
        child.parent.children[self._child_key(up.key)] = up
        child.key, child.slots = child.key[n:], child.slots[n:]
        if child.kind == HOT:
            child.offset += n
            self.hot.add_node_ref(child.slab)
            if up.lock_ref > 0:
                self.hot.acquire(child.slab)
        child.parent = up
        up.children[self._child_key(child.key)] = child
        return up

    def node_ending_at(self, node: Node, end: int) -> Node:
        """The node on root..node whose last token is at position end-1, splitting one if needed."""
        for x in self.path(node):
            start = self.position(x)
            if start + len(x) == end:
                return x
            if start < end < start + len(x):
                return self._split(x, end - start)
        raise ValueError(f"position {end} is not on the path to {node}")

    # ---- locking -------------------------------------------------------------------------------
    def lock(self, node: Node, above: Node | None = None) -> None:
        """Protect root..node from eviction (one reference per live reader). With `above` (an
        ancestor of node, or node itself): only the nodes below `above` get the reference, i.e.
        `lock(node); unlock(above)` for a reader that holds root..above already."""
        stop = self.root if above is None else above
        while node is not stop:
            if node is self.root:
                raise ValueError(f"{above} is not on the path to the locked node")
            if node.lock_ref == 0 and node.kind == HOT:
                self.hot.acquire(node.slab)
            node.lock_ref += 1
            node = node.parent

    def unlock(self, node: Node) -> None:
        while node is not self.root:
            if node.lock_ref <= 0:
                raise ValueError(f"unlocking unlocked {node}")
            node.lock_ref -= 1
            if node.lock_ref == 0 and node.kind == HOT:
                self.hot.release(node.slab)
            node = node.parent

    # ---- eviction ------------------------------------------------------------------------------
    def _remove(self, node: Node) -> int:
        assert not node.children and node.lock_ref == 0 and node is not self.root
        del node.parent.children[self._child_key(node.key)]
        node.parent = None
        if node.kind == HOT:
            return self.hot.drop_node_ref(node.slab)
        return self._free(node.kind, node.slots)

    def evict(self, n: int) -> int:
        """Evict least-recently-used unlocked leaves until `n` slots are freed (or nothing is
        evictable); returns the slots freed."""
        if n <= 0:
            return 0
        heap = [(x.last_access, x.id, x) for x in self.nodes() if not x.children and x.lock_ref == 0]
        heapq.heapify(heap)
        freed = 0
        while heap and freed < n:
            _, _, x = heapq.heappop(heap)
            parent = x.parent
            freed += self._remove(x)
            if parent is not self.root and not parent.children and parent.lock_ref == 0:
                heapq.heappush(heap, (parent.last_access, parent.id, parent))
        return freed

    def evictable_slots(self) -> int:
        return sum(len(x) for x in self.nodes() if x.lock_ref == 0)

    def evict_slab(self, slab: Slab) -> int:
        """Drop every node pointing into `slab` and the subtrees below them (a cached slab evicted
        by the HotPool's LRU); all of them must be unlocked."""
        freed = 0
        tops = [x for x in self.nodes() if x.slab is slab and (x.parent.slab is not slab)]
        for top in tops:
            if top.parent is None:
                continue
            sub = [top]
            i = 0
            while i < len(sub):
                sub.extend(sub[i].children.values())
                i += 1
            if any(x.lock_ref for x in sub):
                raise RuntimeError(f"evicting slab {slab.id} whose nodes are locked")
            for x in reversed(sub):  # children before parents
                freed += self._remove(x)
        return freed

    # ---- promotion -----------------------------------------------------------------------------
    def repoint_to_slab(self, node: Node, slab: Slab) -> list[tuple[int, np.ndarray]]:
        """Re-point the path root..node (all COLD) into `slab`, whose offset i holds position i.
        Returns (position, old slots) per node: the caller frees them once nobody reads them."""
        path = self.path(node)
        if sum(len(x) for x in path) != slab.length or any(x.kind != COLD for x in path):
            raise ValueError("promotion path must be all COLD and as long as the slab")
        old, pos = [], 0
        for x in path:
            old.append((pos, x.slots))
            x.slots = np.arange(slab.base + pos, slab.base + pos + len(x), dtype=np.int32)
            x.kind, x.slab, x.offset = HOT, slab, pos
            self.hot.add_node_ref(slab)
            if x.lock_ref > 0:
                self.hot.acquire(slab)
            x.promoting = False
            pos += len(x)
        return old
