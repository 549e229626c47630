"""Which prompt prefixes the prefix cache holds, and in which of its blocks (the keys and values themselves are the
model's: ``model.PrefixBlocks``).

A prompt is cut into blocks of ``block_size`` tokens; a block is cached under its tokens and the entry of the block
before it, so an entry stands for the whole prefix up to its end, as in vLLM's automatic prefix caching. Keys are
compared whole (no hash stands for them), and every entry has an id never given again, so a block whose parent was
evicted, or replaced, can never be matched after another prefix: a hit is always the same tokens at the same
positions, and its keys and values are those a prefill would compute. The number of blocks is fixed; when all
are taken, the least recently used entry is evicted (a parent is touched after its children, so leaves go first).
"""
from __future__ import annotations

import itertools
from collections import OrderedDict
from dataclasses import dataclass

PREFIX_BLOCK_SIZE = 16  # positions of a prefix-cache block: prompts are matched and kept a block at a time


@dataclass(frozen=True)
class _Entry:
    uid: int
    block: int


class PrefixCache:
    def __init__(self, blocks: int, block_size: int):
        if blocks < 1 or block_size < 1:
            raise ValueError(f"a prefix cache needs at least one block of at least one token, not {blocks} of "
                             f"{block_size}")
        self.blocks, self.block_size = blocks, block_size
        self._entries: OrderedDict[tuple[int, tuple[int, ...]], _Entry] = OrderedDict()  # LRU first
        self._free = list(range(blocks - 1, -1, -1))
        self._uids = itertools.count(1)  # 0 is the empty prefix, every chain's root

    def __len__(self) -> int:
        return len(self._entries)

    def _chain(self, ids: list[int], whole_blocks: int):
        """(key, entry or None) of each whole block in turn, while entries exist."""
        parent, b = 0, self.block_size
        for i in range(whole_blocks):
            key = (parent, tuple(ids[i * b:(i + 1) * b]))
            entry = self._entries.get(key)
            yield key, entry
            if entry is None:
                return
            parent = entry.uid

    def match(self, ids: list[int]) -> list[int]:
        """Blocks holding the longest cached prefix of ``ids`` in whole blocks, leaving at least its last token to
        compute (its logits give the first new token); the entries become the most recently used."""
        found = [(key, entry) for key, entry in self._chain(ids, (len(ids) - 1) // self.block_size)
                 if entry is not None]
        for key, _ in reversed(found):  # the parent last: the most recent, evicted after its children
            self._entries.move_to_end(key)
        return [entry.block for _, entry in found]

    def add(self, ids: list[int]) -> list[tuple[int, int]]:
        """Enter every whole block of ``ids`` (at most as many as the cache holds): (the block's index in ``ids``,
        the cache block to copy it into) for each not cached yet. Those evicted to make room are forgotten here;
        the caller copies the new blocks' keys and values before the next match."""
        stores: list[tuple[int, int]] = []
        parent, b = 0, self.block_size
        chain = []
        for i in range(min(len(ids) // b, self.blocks)):
            key = (parent, tuple(ids[i * b:(i + 1) * b]))
            entry = self._entries.get(key)
            if entry is None:
                # Fewer than `blocks` of this chain are entered, so when the cache is full the least recently
                # used entry is another prefix's.
                entry = _Entry(next(self._uids), self._free.pop() if self._free else self._evict())
                self._entries[key] = entry
                stores.append((i, entry.block))
            self._entries.move_to_end(key)
            chain.append(key)
            parent = entry.uid
        for key in reversed(chain):
            self._entries.move_to_end(key)
        return stores

    def _evict(self) -> int:
        _, entry = self._entries.popitem(last=False)
        return entry.block
