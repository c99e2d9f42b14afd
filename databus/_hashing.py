"""The one stable 64-bit hash of key bytes used everywhere a key must become a number.

The event header's partition key (for keys that are not a single integer) and the
``hash`` filter both use it, and the bootstrap store keeps it in a column so that a
filter can be pushed down to SQL. It must never change: consumers partition by it.
"""

from __future__ import annotations

import hashlib

_MASK63 = (1 << 63) - 1


def stable_key_hash(key: bytes) -> int:
    """A non-negative 63-bit hash of ``key`` (BLAKE2b, 8 bytes, top bit cleared).

    Non-negative so that ``hash % n`` is the same in Python and in SQL, where ``%``
    of a negative number differs between engines.
    """
    digest = hashlib.blake2b(key, digest_size=8).digest()
    return int.from_bytes(digest, "big") & _MASK63
