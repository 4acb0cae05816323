import pytest

from outbox.protocol import InvalidNameError, TopicNames, validate_producer_group


def test_default_prefix_names_every_internal_topic():
    topics = TopicNames()
    assert (topics.half, topics.op, topics.discard) == (
        "outbox.half",
        "outbox.op",
        "outbox.discard",
    )
    assert topics.check("orders") == "outbox.check.orders"
    assert topics.fixed == ("outbox.half", "outbox.op", "outbox.discard")


def test_prefix_changes_every_name():
    topics = TopicNames("shop_a")
    assert topics.half == "shop_a.half"
    assert topics.check("g-1") == "shop_a.check.g-1"


@pytest.mark.parametrize(
    "topic,internal",
    [
        ("outbox.half", True),
        ("outbox.op", True),
        ("outbox.discard", True),
        ("outbox.check.any", True),
        ("orders", False),
        ("outbox.halfway", False),
        ("other.half", False),
    ],
)
def test_is_internal(topic, internal):
    assert TopicNames().is_internal(topic) is internal


@pytest.mark.parametrize("prefix", ["", "has space", "a/b", ".", "..", "x" * 245, "é"])
def test_bad_prefix_is_rejected_with_its_name(prefix):
    with pytest.raises(InvalidNameError, match="topic prefix"):
        TopicNames(prefix)


@pytest.mark.parametrize("group", ["", "with space", "semi;colon", "x" * 250])
def test_bad_producer_group_is_rejected(group):
    with pytest.raises(InvalidNameError, match="producer group"):
        validate_producer_group(group)
    with pytest.raises(InvalidNameError):
        TopicNames().check(group)


def test_group_that_makes_check_topic_too_long_is_rejected():
    with pytest.raises(InvalidNameError, match="check topic"):
        TopicNames().check("g" * 240)
