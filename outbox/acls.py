"""The least privileges each component needs, in one place: printed, granted and tested.

A security team grants ACLs per principal. What the producer, the checker and
the sink touch follows from the topic names (:class:`~outbox.protocol.TopicNames`),
the consumer groups and the transactional ids the code makes up, so the list is
derived from them here rather than written down beside the code, where it would
drift. ``outbox acls print`` shows it; the security tests grant exactly this
list to one SCRAM user per component and run that component as it.

Idempotent producers need only WRITE on their topics since Kafka 3.0 (KIP-679);
no component needs a cluster-level ACL.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    ResourcePatternType,
    ResourceType,
)

from outbox.protocol import TopicNames, validate_topic_name

Resource = Literal["TOPIC", "GROUP", "TRANSACTIONAL_ID"]
PatternType = Literal["LITERAL", "PREFIXED"]
Operation = Literal["READ", "WRITE", "CREATE", "DESCRIBE", "DESCRIBE_CONFIGS"]
Component = Literal["producer", "checker", "sink"]
COMPONENTS: tuple[Component, ...] = ("producer", "checker", "sink")

CHECKER_READER_GROUP_PREFIX = "outbox-checker-reader-"
"""Group ids of the checker's offset-addressed readers: no offsets are stored under
them, but librdkafka looks up their coordinator, which needs DESCRIBE."""


@dataclass(frozen=True)
class Acl:
    """One ALLOW rule for one principal: ``operation`` on a resource, and why it is needed."""

    resource_type: Resource
    name: str
    pattern: PatternType
    operation: Operation
    why: str

    @property
    def resource(self) -> str:
        """How the rule's resource reads in a sentence: ``topic 'outbox.half'``."""
        kind = self.resource_type.lower().replace("_", " ")
        prefixed = " (prefix)" if self.pattern == "PREFIXED" else ""
        return f"{kind} {self.name!r}{prefixed}"


def _acls(
    resource_type: Resource,
    name: str,
    operations: Iterable[Operation],
    why: str,
    pattern: PatternType = "LITERAL",
) -> list[Acl]:
    return [Acl(resource_type, name, pattern, operation, why) for operation in operations]


def producer_acls(topics: TopicNames, producer_group: str, real_topics: Sequence[str]) -> list[Acl]:
    """A :class:`~outbox.TransactionProducer` of ``producer_group`` sending to ``real_topics``."""
    check = topics.check(producer_group)
    return [
        *_acls(
            "TOPIC",
            topics.half,
            ("WRITE", "DESCRIBE", "DESCRIBE_CONFIGS"),
            "write halves; check partitions and size limit",
        ),
        *_acls(
            "TOPIC",
            topics.op,
            ("WRITE", "DESCRIBE", "DESCRIBE_CONFIGS"),
            "write decisions; check partitions",
        ),
        *_acls(
            "TOPIC",
            check,
            ("READ", "DESCRIBE", "DESCRIBE_CONFIGS", "CREATE"),
            "read check-backs of its group; CREATE: make it if `outbox topics create` did not",
        ),
        *_acls("GROUP", check, ("READ",), "consumer group of the check-backs"),
        *_acls(
            "TOPIC",
            topics.discard,
            ("DESCRIBE", "DESCRIBE_CONFIGS"),
            "size limit: a half must fit where it may end up",
        ),
        *(
            acl
            for topic in real_topics
            for acl in _acls(
                "TOPIC",
                topic,
                ("DESCRIBE", "DESCRIBE_CONFIGS"),
                "a message's topic must exist; its size limit (the relay writes it)",
            )
        ),
    ]


def checker_acls(
    topics: TopicNames, real_topics: Sequence[str], consumer_group: str | None = None
) -> list[Acl]:
    """A checker replica with its relay, publishing to ``real_topics``."""
    group = consumer_group or f"{topics.prefix}.checker"
    return [
        *_acls(
            "TOPIC",
            topics.half,
            ("READ", "WRITE", "DESCRIBE", "DESCRIBE_CONFIGS"),
            "check rounds read halves and put unresolved ones back",
        ),
        *_acls(
            "TOPIC",
            topics.op,
            ("READ", "DESCRIBE", "DESCRIBE_CONFIGS"),
            "rounds and relay read decisions",
        ),
        *_acls(
            "TOPIC",
            topics.check_prefix,
            ("WRITE", "CREATE", "DESCRIBE", "DESCRIBE_CONFIGS"),
            "ask producer groups; make a group's check topic",
            "PREFIXED",
        ),
        *_acls(
            "TOPIC",
            topics.discard,
            ("WRITE", "DESCRIBE", "DESCRIBE_CONFIGS"),
            "keep halves given up on",
        ),
        *(
            acl
            for topic in real_topics
            for acl in _acls(
                "TOPIC",
                topic,
                ("WRITE", "DESCRIBE", "DESCRIBE_CONFIGS"),
                "relay publishes committed halves",
            )
        ),
        *_acls(
            "GROUP",
            group,
            ("READ",),
            "consumer groups of the rounds and of the relay (<group>.relay)",
            "PREFIXED",
        ),
        *_acls(
            "GROUP",
            CHECKER_READER_GROUP_PREFIX,
            ("DESCRIBE",),
            "readers at explicit offsets (no offsets stored)",
            "PREFIXED",
        ),
        *_acls(
            "TRANSACTIONAL_ID",
            f"{group}.",
            ("WRITE", "DESCRIBE"),
            "Kafka transactions of rounds (<group>.<replica>) and relay (<group>.relay.<replica>)",
            "PREFIXED",
        ),
    ]


def sink_acls(real_topics: Sequence[str]) -> list[Acl]:
    """The Spark sink reading ``real_topics``.

    No group: Spark's Kafka source assigns partitions itself and keeps offsets
    in its checkpoint, so its consumers never reach a group coordinator. Its
    group ids still start with the sink's ``group_id_prefix``, which is what a
    prefixed group ACL names should ``spark.sql.streaming.kafka.useDeprecatedOffsetFetching``
    be turned on (its driver then subscribes).
    """
    return [
        acl
        for topic in real_topics
        for acl in _acls("TOPIC", topic, ("READ", "DESCRIBE"), "read committed events")
    ]


def component_acls(
    component: Component,
    topics: TopicNames,
    *,
    producer_group: str,
    real_topics: Sequence[str],
    checker_group: str | None = None,
) -> list[Acl]:
    """The ACLs of one component, by name."""
    for topic in real_topics:
        validate_topic_name(topic, "real topic")
    if component == "producer":
        return producer_acls(topics, producer_group, real_topics)
    if component == "checker":
        return checker_acls(topics, real_topics, checker_group)
    return sink_acls(real_topics)


def _by_resource(rows: Sequence[tuple[str, Acl]]) -> dict[tuple[str, str, str, str], list[Acl]]:
    """Rows of one principal on one resource pattern together, in first-seen order."""
    grouped: dict[tuple[str, str, str, str], list[Acl]] = {}
    for principal, acl in rows:
        key = (principal, acl.resource_type, acl.name, acl.pattern)
        grouped.setdefault(key, []).append(acl)
    return grouped


def acl_table(rows: Sequence[tuple[str, Acl]]) -> str:
    """``(principal, acl)`` rows as an aligned text table, one line per resource pattern."""
    header = ("principal", "resource", "name", "pattern", "operations", "why")
    cells = [
        (principal, kind, name, pattern, ",".join(a.operation for a in acls), acls[0].why)
        for (principal, kind, name, pattern), acls in _by_resource(rows).items()
    ]
    widths = [max(len(row[i]) for row in (header, *cells)) for i in range(len(header) - 1)]
    lines = []
    for row in (header, *cells):
        padded = [cell.ljust(width) for cell, width in zip(row, widths, strict=False)]
        lines.append("  ".join([*padded, row[-1]]).rstrip())
    return "\n".join(lines)


def _pascal(name: str) -> str:
    """``DESCRIBE_CONFIGS`` as kafka-acls.sh spells it: ``DescribeConfigs``."""
    return "".join(word.capitalize() for word in name.split("_"))


def acl_bindings(principal: str, acls: Iterable[Acl]) -> list[AclBinding]:
    """The rules as confluent-kafka bindings, for ``AdminClient.create_acls``."""
    return [
        AclBinding(
            ResourceType[acl.resource_type],
            acl.name,
            ResourcePatternType[acl.pattern],
            principal,
            "*",
            AclOperation[acl.operation],
            AclPermissionType.ALLOW,
        )
        for acl in acls
    ]


_CLI_RESOURCE = {"TOPIC": "--topic", "GROUP": "--group", "TRANSACTIONAL_ID": "--transactional-id"}


def kafka_acls_commands(rows: Sequence[tuple[str, Acl]], bootstrap: str) -> list[str]:
    """The same rows as ``kafka-acls.sh`` commands, one per principal, resource and pattern."""
    commands = []
    for (principal, resource_type, name, pattern), acls in _by_resource(rows).items():
        resource = f"{_CLI_RESOURCE[resource_type]} {name}"
        ops = " ".join(f"--operation {_pascal(acl.operation)}" for acl in acls)
        prefix = " --resource-pattern-type prefixed" if pattern == "PREFIXED" else ""
        commands.append(
            f"kafka-acls.sh --bootstrap-server {bootstrap} --command-config admin.properties "
            f"--add --allow-principal {principal} {resource}{prefix} {ops}"
        )
    return commands
