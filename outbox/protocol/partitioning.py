"""Which half partition a transaction lives in, and its paired op partition.

The half partition is chosen from the message key exactly as Kafka's default
partitioner would (murmur2), falling back to the transaction id, so all
transactions for one key share a half partition and are checked in order by
one checker replica.
"""

from __future__ import annotations

import struct

_M = 0x5BD1E995
_MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's ``Utils.murmur2`` (seed 0x9747b28c), as a signed 32-bit int."""
    length = len(data)
    h = (0x9747B28C ^ length) & _MASK
    whole = length - length % 4
    for k in struct.unpack_from(f"<{whole // 4}I", data):  # the 4-byte words, little-endian
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = (h * _M) & _MASK
        h ^= k
    rest = length % 4
    if rest == 3:
        h ^= data[whole + 2] << 16
    if rest >= 2:
        h ^= data[whole + 1] << 8
    if rest >= 1:
        h ^= data[whole]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def half_partition_for(key: bytes | None, transaction_id: str, partitions: int) -> int:
    """The half partition of a transaction: by key, else by transaction id."""
    if partitions < 1:
        raise ValueError(f"partition count must be at least 1, got {partitions}")
    basis = key if key else transaction_id.encode("utf-8")
    return (murmur2(basis) & 0x7FFFFFFF) % partitions


def op_partition_for_half(half_partition: int) -> int:
    """Op partition p records the outcomes of half partition p (``getOpQueue``)."""
    return half_partition
