"""Creating and inspecting the outbox's own topics.

Creation is idempotent: topics that exist with the right partition count are
left alone. Half and op must have the same partition count (half partition p is
paired with op partition p), so a mismatch is an error that says which topic
differs and how to fix it, never something papered over.

The outbox topics stamp records with the broker's clock (``LogAppendTime``):
the checker measures a half's age from its record timestamp, and a producer's
clock is not to be trusted with that. An existing topic stamped with
``CreateTime`` still works (ages then follow the producers' clocks), with a
warning that says how to change it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic
from tenacity import (
    Retrying,
    retry,
    retry_if_exception_type,
    stop_after_attempt,
    stop_after_delay,
    wait_exponential,
    wait_fixed,
)

from outbox.access import raise_if_configs_refused, raise_if_not_described
from outbox.errors import (
    ConfigurationError,
    KafkaUnavailableError,
    TopicAdminError,
    TopicMismatchError,
)
from outbox.protocol import TopicNames, validate_topic_name

log = logging.getLogger(__name__)

DAY_MS = 24 * 60 * 60 * 1000

# Halves must outlive the checker's retention horizon (72 h, RocketMQ's
# fileReservedTime) with room for an outage; ops must outlive their halves.
HALF_RETENTION_MS = 7 * DAY_MS
OP_RETENTION_MS = 7 * DAY_MS
# Discarded halves wait for a person to look at them.
DISCARD_RETENTION_MS = 30 * DAY_MS
# Check requests go stale within minutes; the checker asks again.
CHECK_RETENTION_MS = 1 * DAY_MS

TIMESTAMP_TYPE = "message.timestamp.type"
LOG_APPEND_TIME = "LogAppendTime"

MIN_INSYNC_REPLICAS = "min.insync.replicas"

SHOWN_CONFIGS = ("retention.ms", "cleanup.policy", MIN_INSYNC_REPLICAS, TIMESTAMP_TYPE)

MAX_DEFAULT_REPLICATION = 3


def default_replication_factor(brokers: int) -> int:
    """Three replicas where the cluster has three brokers, fewer only where it has fewer.

    Not the broker's ``default.replication.factor``: Kafka ships it at 1, and
    a half on one replica is lost with its broker's disk.
    """
    return max(1, min(MAX_DEFAULT_REPLICATION, brokers))


def min_insync_replicas(replication_factor: int) -> int:
    """2 of 3: an acknowledged half survives one broker's loss, and one broker may be down.

    With fewer than three replicas, 2 would stop every write while one broker
    restarts, so the outbox takes 1 there (and says so when the cluster could
    do better).
    """
    return 2 if replication_factor >= MAX_DEFAULT_REPLICATION else 1


@dataclass(frozen=True)
class TopicSpec:
    """A topic to create; no ``replication_factor`` means the cluster's default for the outbox.

    That default is worked out from the brokers the cluster has when the topic
    is created (:func:`default_replication_factor`), and ``min.insync.replicas``
    follows it unless ``config`` sets it.
    """

    name: str
    partitions: int
    replication_factor: int | None = None
    config: dict[str, str] = field(default_factory=dict)
    real: bool = False
    """A user's topic the relay publishes to: one that exists is kept whatever its partitions."""

    def for_cluster(self, brokers: int) -> TopicSpec:
        """This spec with its replication resolved for a cluster of ``brokers``."""
        replication = self.replication_factor or default_replication_factor(brokers)
        config = {MIN_INSYNC_REPLICAS: str(min_insync_replicas(replication)), **self.config}
        return replace(self, replication_factor=replication, config=config)


@dataclass(frozen=True)
class TopicState:
    """A topic as the cluster reports it; ``partitions`` is 0 when it is absent."""

    name: str
    partitions: int = 0
    replication_factor: int = 0
    config: dict[str, str] = field(default_factory=dict)
    brokers: int = 0
    """Brokers in the cluster when the state was read."""

    @property
    def exists(self) -> bool:
        return self.partitions > 0


def plan_topics(
    topics: TopicNames,
    partitions: int,
    replication_factor: int | None = None,
    producer_groups: tuple[str, ...] = (),
    real_topics: tuple[str, ...] = (),
) -> list[TopicSpec]:
    """The topics an outbox deployment needs, with their configs.

    Without a ``replication_factor`` each topic gets the cluster's default when
    it is created (see :class:`TopicSpec`). ``real_topics`` are the users' own
    topics, created with the broker's default configs so a first message has
    somewhere to go on a cluster that does not create topics on demand.
    """
    for name in real_topics:
        validate_topic_name(name, "real topic")
        if topics.is_internal(name):
            raise ConfigurationError(f"real topic {name!r} is one of the outbox's own topics")
    if partitions < 1:
        raise ConfigurationError(f"--partitions must be at least 1, got {partitions}")
    if replication_factor is not None and replication_factor < 1:
        raise ConfigurationError(
            f"--replication-factor must be at least 1, got {replication_factor}"
        )

    def spec(name: str, retention_ms: int) -> TopicSpec:
        config = {
            "cleanup.policy": "delete",
            "retention.ms": str(retention_ms),
            TIMESTAMP_TYPE: LOG_APPEND_TIME,
        }
        return TopicSpec(name, partitions, replication_factor, config)

    specs = [
        spec(topics.half, HALF_RETENTION_MS),
        spec(topics.op, OP_RETENTION_MS),
        spec(topics.discard, DISCARD_RETENTION_MS),
    ]
    specs += [spec(topics.check(group), CHECK_RETENTION_MS) for group in producer_groups]
    specs += [TopicSpec(name, partitions, replication_factor, real=True) for name in real_topics]
    return specs


_transient = retry(
    retry=retry_if_exception_type(KafkaUnavailableError),
    stop=stop_after_attempt(2),
    wait=wait_exponential(multiplier=0.5, max=4),
    reraise=True,
)


@_transient
def _look_up_one(admin: AdminClient, name: str, timeout: float) -> Any:
    """Metadata of one topic; :class:`NotAuthorizedError` if it may not be described."""
    try:
        topic = admin.list_topics(name, timeout=timeout).topics.get(name)
    except KafkaException as exc:
        raise KafkaUnavailableError(f"cannot look up topic {name!r}: {exc}") from None
    raise_if_not_described(name, topic)
    return topic


@_transient
def read_topic_states(
    admin: AdminClient, names: list[str], timeout: float = 10.0
) -> dict[str, TopicState]:
    """Partition counts, replication and a few configs of the named topics."""
    try:
        metadata = admin.list_topics(timeout=timeout)
    except KafkaException as exc:
        raise KafkaUnavailableError(f"cannot reach Kafka within {timeout:g}s: {exc}") from None
    states: dict[str, TopicState] = {}
    present = []
    brokers = len(metadata.brokers)
    for name in names:
        topic = metadata.topics.get(name)
        if topic is None:
            # A listing leaves out topics the principal may not DESCRIBE: ask for this one.
            topic = _look_up_one(admin, name, timeout)
        if topic is None or (
            topic.error is not None and topic.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART
        ):
            states[name] = TopicState(name, brokers=brokers)
            continue
        if not topic.partitions:
            # Just created, leaders not elected yet: worth asking again.
            raise KafkaUnavailableError(f"topic {name} is not ready: {topic.error}")
        replicas = {len(p.replicas) for p in topic.partitions.values()}
        states[name] = TopicState(
            name, len(topic.partitions), max(replicas, default=0), brokers=brokers
        )
        present.append(name)
    for name, shown in shown_configs(admin, present, timeout).items():
        old = states[name]
        states[name] = TopicState(old.name, old.partitions, old.replication_factor, shown, brokers)
    return states


def shown_configs(
    admin: AdminClient, names: list[str], timeout: float
) -> dict[str, dict[str, str]]:
    """The :data:`SHOWN_CONFIGS` of existing topics.

    On a cluster, a topic just created can be in one broker's metadata while the
    broker asked for its configs does not know it yet: that is "not ready"
    (asked again), not an error.
    """
    if not names:
        return {}
    resources = [ConfigResource(ConfigResource.Type.TOPIC, name) for name in names]
    shown: dict[str, dict[str, str]] = {}
    for resource, future in admin.describe_configs(resources).items():
        try:
            entries = future.result(timeout=timeout)
        except KafkaException as exc:
            raise_if_configs_refused(resource.name, exc)
            error = exc.args[0]
            if isinstance(error, KafkaError) and error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                raise KafkaUnavailableError(
                    f"topic {resource.name} is not ready: a broker does not know it yet"
                ) from None
            raise
        shown[resource.name] = {k: entries[k].value for k in SHOWN_CONFIGS if k in entries}
    return shown


def _check_partition_counts(specs: list[TopicSpec], states: dict[str, TopicState]) -> None:
    wrong = [
        (spec, states[spec.name])
        for spec in specs
        if not spec.real
        and states[spec.name].exists
        and states[spec.name].partitions != spec.partitions
    ]
    if not wrong:
        return
    lines = [
        f"topic {spec.name} has {state.partitions} partitions, {spec.partitions} requested"
        for spec, state in wrong
    ]
    existing = {state.partitions for _, state in wrong}
    hint = (
        f"re-run with --partitions {existing.pop()} to keep the existing topics, "
        if len(existing) == 1
        else ""
    )
    raise TopicMismatchError(
        "; ".join(lines)
        + ". Half and op topics must have the same partition count: "
        + hint
        + "or use a new --prefix, or delete the outbox topics once no half is pending "
        "(adding partitions would move keys to other half partitions)."
    )


def _warn_about_timestamp_types(specs: list[TopicSpec], states: dict[str, TopicState]) -> None:
    """An existing topic stamped otherwise than asked is accepted, with how to change it."""
    for spec in specs:
        state = states[spec.name]
        wanted = spec.config.get(TIMESTAMP_TYPE)
        actual = state.config.get(TIMESTAMP_TYPE)
        if not state.exists or wanted is None or actual is None or actual == wanted:
            continue
        log.warning(
            "topic %s has %s=%s, not %s: record timestamps (and the checker's ages of halves)"
            " follow the producers' clocks. Fix: kafka-configs --bootstrap-server <host:port>"
            " --alter --entity-type topics --entity-name %s --add-config %s=%s"
            " (new topics from 'outbox topics create' get it)",
            spec.name,
            TIMESTAMP_TYPE,
            actual,
            wanted,
            spec.name,
            TIMESTAMP_TYPE,
            wanted,
        )


def _warn_about_replication(specs: list[TopicSpec], states: dict[str, TopicState]) -> None:
    """Replication short of what the cluster allows is accepted, with why and how to change it.

    An existing topic keeps its replicas: Kafka changes them only by reassignment.
    """
    for spec in specs:
        state = states[spec.name]
        wanted = spec.replication_factor or 0
        if state.exists and state.replication_factor != wanted:
            log.warning(
                "topic %s has %d replica(s) per partition, not %d%s. Kafka does not change this"
                " in place: move it with kafka-reassign-partitions --bootstrap-server <host:port>"
                " --reassignment-json-file <plan> --execute, or use a new --prefix",
                spec.name,
                state.replication_factor,
                wanted,
                ": a broker's loss can lose what it acknowledged"
                if state.replication_factor < wanted
                else "",
            )
        elif not state.exists and wanted < MAX_DEFAULT_REPLICATION <= state.brokers:
            log.warning(
                "topic %s is created with %d replica(s) on a cluster of %d brokers: a broker's"
                " loss can lose what it acknowledged (leave out --replication-factor for %d)",
                spec.name,
                wanted,
                state.brokers,
                MAX_DEFAULT_REPLICATION,
            )


def _check_replication_fits(missing: list[TopicSpec], brokers: int) -> None:
    """Kafka's own refusal names one topic at a time; name them all, and the fix."""
    too_many = [s for s in missing if (s.replication_factor or 0) > brokers]
    if too_many:
        wanted = max(s.replication_factor or 0 for s in too_many)
        raise TopicAdminError(
            f"replication factor {wanted} needs at least {wanted} brokers, but the cluster has"
            f" {brokers} (topics {', '.join(s.name for s in too_many)}); pass"
            f" --replication-factor {max(1, brokers)} or leave it out for the cluster's default"
        )


def ensure_topics(
    admin: AdminClient, specs: list[TopicSpec], timeout: float = 30.0
) -> dict[str, bool]:
    """Create the missing topics; map each name to whether it was created now."""
    states = read_topic_states(admin, [s.name for s in specs], timeout=timeout)
    brokers = max((state.brokers for state in states.values()), default=0)
    specs = [spec.for_cluster(brokers) for spec in specs]
    _check_partition_counts(specs, states)
    _warn_about_timestamp_types(specs, states)
    _warn_about_replication(specs, states)
    missing = [s for s in specs if not states[s.name].exists]
    _check_replication_fits(missing, brokers)
    created = {s.name: False for s in specs}
    if not missing:
        return created
    futures = admin.create_topics(
        [NewTopic(s.name, s.partitions, s.replication_factor, config=s.config) for s in missing],
        operation_timeout=timeout,
        request_timeout=timeout,
    )
    for name, future in futures.items():
        try:
            future.result()
            created[name] = True
        except KafkaException as exc:
            error = exc.args[0]
            if isinstance(error, KafkaError) and error.code() == KafkaError.TOPIC_ALREADY_EXISTS:
                continue  # a concurrent creator won the race; the re-check below covers it
            raise TopicAdminError(f"could not create topic {name}: {error}") from None
    _check_partition_counts(specs, _wait_until_visible(admin, [s.name for s in specs], timeout))
    return created


def _wait_until_visible(
    admin: AdminClient, names: list[str], timeout: float
) -> dict[str, TopicState]:
    """Topic states once every named topic shows in metadata.

    A topic just created (by us or a concurrent creator) can be missing from
    metadata for some milliseconds; checking it then would miss a mismatch.
    """
    for attempt in Retrying(
        retry=retry_if_exception_type((_NotVisibleYet, KafkaUnavailableError)),
        stop=stop_after_delay(timeout),
        wait=wait_fixed(0.1),
        reraise=True,
    ):
        with attempt:
            states = read_topic_states(admin, names, timeout=timeout)
            absent = [name for name, state in states.items() if not state.exists]
            if absent:
                raise _NotVisibleYet(f"created topics not visible yet: {', '.join(absent)}")
    return states


class _NotVisibleYet(TopicAdminError):
    pass
