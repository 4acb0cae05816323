"""Topic naming: one prefix, four kinds of internal topic.

The prefix lets several systems share one cluster. Half and op topics always
have the same partition count, because half partition p is paired with op
partition p (RocketMQ's ``getOpQueue``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property

from outbox.protocol.errors import InvalidNameError

DEFAULT_PREFIX = "outbox"

# Kafka's own rule (org.apache.kafka.common.internals.Topic).
_LEGAL_TOPIC_CHARS = re.compile(r"^[A-Za-z0-9._-]+$")
_MAX_TOPIC_LENGTH = 249
# The longest suffix a prefix gets ("." + "discard"); check topics add the group.
_LONGEST_FIXED_SUFFIX = len(".discard")


def validate_topic_name(name: str, what: str = "topic") -> str:
    """Raise :class:`InvalidNameError` unless Kafka would accept ``name`` as a topic."""
    if not isinstance(name, str) or not name:
        raise InvalidNameError(f"{what} must be a non-empty string, got {name!r}")
    if len(name) > _MAX_TOPIC_LENGTH:
        raise InvalidNameError(f"{what} {name!r} is longer than Kafka's {_MAX_TOPIC_LENGTH} chars")
    if name in {".", ".."}:
        raise InvalidNameError(f"{what} cannot be {name!r}")
    if not _LEGAL_TOPIC_CHARS.match(name):
        raise InvalidNameError(
            f"{what} {name!r} has characters Kafka does not allow"
            " (use letters, digits, '.', '_', '-')"
        )
    return name


def validate_producer_group(group: str) -> str:
    """A producer group names a check topic, so it follows topic-name rules."""
    return validate_topic_name(group, "producer group")


@dataclass(frozen=True)
class TopicNames:
    """The internal topics of one outbox deployment, derived from its prefix.

    The names are derived once (``cached_property``): the producer asks for
    them on every send.
    """

    prefix: str = DEFAULT_PREFIX

    def __post_init__(self) -> None:
        validate_topic_name(self.prefix, "topic prefix")
        if len(self.prefix) + _LONGEST_FIXED_SUFFIX > _MAX_TOPIC_LENGTH:
            raise InvalidNameError(f"topic prefix {self.prefix!r} is too long for its suffixes")

    @cached_property
    def half(self) -> str:
        """Where half records wait for their outcome (RMQ_SYS_TRANS_HALF_TOPIC)."""
        return f"{self.prefix}.half"

    @cached_property
    def op(self) -> str:
        """Where outcomes are recorded (RMQ_SYS_TRANS_OP_HALF_TOPIC)."""
        return f"{self.prefix}.op"

    @cached_property
    def discard(self) -> str:
        """Where the checker puts halves it gave up on (TRANS_CHECK_MAX_TIME_TOPIC)."""
        return f"{self.prefix}.discard"

    @cached_property
    def check_prefix(self) -> str:
        return f"{self.prefix}.check."

    def check(self, producer_group: str) -> str:
        """The check-request topic of one producer group (CHECK_TRANSACTION_STATE).

        Remembered per group (every send's size check names it), after validation.
        """
        known = self._check_topics.get(producer_group)
        if known is None:
            validate_producer_group(producer_group)
            known = validate_topic_name(f"{self.check_prefix}{producer_group}", "check topic")
            self._check_topics[producer_group] = known
        return known

    @cached_property
    def _check_topics(self) -> dict[str, str]:
        return {}

    @cached_property
    def fixed(self) -> tuple[str, str, str]:
        """The topics ``outbox topics create`` makes: half, op, discard."""
        return (self.half, self.op, self.discard)

    def is_internal(self, topic: str) -> bool:
        """True for a topic the outbox owns, which user messages may not target."""
        return topic in self.fixed or topic.startswith(self.check_prefix)
