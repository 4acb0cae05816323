import pytest

from outbox.protocol import half_partition_for, murmur2, op_partition_for_half


@pytest.mark.parametrize(
    "data,expected",
    [
        # Vectors from Kafka's UtilsTest#testMurmur2.
        (b"21", -973932308),
        (b"foobar", -790332482),
        (b"a-little-bit-long-string", -985981536),
        (b"a-little-bit-longer-string", -1486304829),
        (b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
        (b"abc", 479470107),
    ],
)
def test_murmur2_matches_kafka(data, expected):
    assert murmur2(data) == expected


def test_same_key_same_half_partition_whatever_the_transaction():
    assert {half_partition_for(b"order-7", f"tx{i}", 8) for i in range(50)} == {
        half_partition_for(b"order-7", "other", 8)
    }


def test_keyless_transactions_spread_by_transaction_id():
    partitions = {half_partition_for(None, f"tx{i}", 8) for i in range(200)}
    assert partitions == set(range(8))


def test_partition_is_in_range_and_op_partition_pairs():
    for i in range(100):
        p = half_partition_for(f"k{i}".encode(), "t", 3)
        assert 0 <= p < 3
        assert op_partition_for_half(p) == p


def test_zero_partitions_is_an_error():
    with pytest.raises(ValueError, match="at least 1"):
        half_partition_for(b"k", "t", 0)
