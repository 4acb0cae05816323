"""The checker's settings: one typed object, every field a flag and an ``OUTBOX_*`` variable.

Defaults are RocketMQ 5.x's (``BrokerConfig``, ``TransactionalMessageServiceImpl``),
written here only: the rounds' :class:`~outbox_checker.rules.RoundRules` and the relay's
:class:`~outbox_checker.relay.RelaySettings` are built from these settings
(``from_settings``, by :func:`built_from_settings`), and their own defaults are
:data:`CHECKER_DEFAULTS`' (:func:`from_setting`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import field, fields
from typing import Any, TypeVar

from pydantic import Field, field_validator

from outbox.config import KafkaSettings
from outbox.durations import Hours, Milliseconds, Seconds
from outbox.protocol import TRANSACTION_TIMEOUT_SECONDS
from outbox_checker.names import default_checker_group

FAILOVER_CLIENT_PROPERTIES: dict[str, int] = {"api.version.request.timeout.ms": 3_000}
"""librdkafka properties every client of the checker starts from; pass-through
``kafka_properties`` override them. A connection's first request (ApiVersion) to a node
that accepts it and then never answers (a frozen or partitioned node: the kernel still
completes the TCP handshake) held a fresh relay producer 10 s (librdkafka's default)
before it asked for the transaction coordinator again; a healthy broker answers it in
milliseconds."""


class CheckerSettings(KafkaSettings):
    """Everything the checker sidecar can be tuned with."""

    transaction_timeout_seconds: Seconds = Field(
        TRANSACTION_TIMEOUT_SECONDS,
        gt=0,
        description="no check before a half is this old (transactionTimeOut), nor before its"
        " producer's own transaction timeout, which the half carries",
    )
    check_max: int = Field(
        15, ge=1, description="checks sent before a half is discarded (transactionCheckMax)"
    )
    check_interval_seconds: Seconds = Field(
        30.0,
        gt=0,
        description="pause between check rounds, and so between two checks of one half"
        " (transactionCheckInterval); a half never asked about is asked once it is due, in an"
        " early round",
    )
    max_process_seconds: Seconds = Field(
        60.0, gt=0, description="time budget per half partition per round (MAX_PROCESS_TIME_LIMIT)"
    )
    op_read_batch: int = Field(32, ge=1, description="op records read per fill (OP_MSG_PULL_NUMS)")
    max_ops_per_round: int = Field(
        20_000,
        ge=1,
        description="most op records a round holds ahead of its walk, per half partition (ops"
        " for halves not reached yet); past it a half whose op was not found is asked about"
        " (a second answer is harmless). Ops the walk consumes do not count: a backlog of"
        " decided halves is skipped whole",
    )
    retention_hours: Hours = Field(
        72.0, gt=0, description="older halves are discarded unchecked (fileReservedTime)"
    )
    ended_cache_size: int = Field(
        200_000, ge=1000, description="recently ended transaction ids kept to skip ended copies"
    )
    op_history_margin_seconds: Seconds = Field(
        300.0,
        ge=0,
        description="how far before the oldest pending half op history is re-read after a restart",
    )
    checker_group: str | None = Field(
        None, description="consumer group of the checker replicas; default '<prefix>.checker'"
    )
    instance_id: str | None = Field(
        None,
        description="stable id of this replica, unique among the running ones (compose: the"
        " service name and replica index), for its Kafka transactional.ids and static group"
        " membership: a restarted replica then fences its predecessor and takes its partitions"
        " back at once; default: the pod name under Kubernetes (HOSTNAME, stable for a"
        " StatefulSet), else a random id per process",
    )
    session_timeout_ms: Milliseconds = Field(
        6_000,
        ge=1_000,
        description="Kafka session.timeout.ms of the relay's and the rounds' consumers: a"
        " killed replica's partitions move to the others after this long (the broker's"
        " group.min.session.timeout.ms, 6000 by default, is the floor it accepts)",
    )
    kafka_transaction_timeout_ms: Milliseconds = Field(
        30_000, ge=1000, description="Kafka transaction.timeout.ms of the round writer"
    )
    resolve_from_db: str | None = Field(
        None,
        description="SQLAlchemy URL of the producers' transaction log: answer checks from it"
        " (so transactions resolve with no producer running); asks the producers when it"
        " cannot tell",
    )
    db_table: str = Field("outbox_transaction_log", description="transaction-log table name")
    db_schema: str | None = Field(None, description="transaction-log table schema")
    db_grace_seconds: Seconds = Field(
        60.0,
        gt=0,
        description="no log row and older than this: ROLLBACK (as the SQL listener's rule)",
    )
    drain_interval_seconds: Seconds = Field(
        1.0,
        gt=0,
        description="with resolve_from_db: how often to look for parked sends"
        " (park_when_unavailable) in the transaction log and publish them",
    )
    relay: bool = Field(
        True,
        description="re-publish committed halves to their real topics, exactly once (the"
        " relay, RocketMQ's EndTransactionProcessor); with no replica relaying, decisions"
        " wait on the op topic",
    )
    relay_batch: int = Field(
        5000, ge=1, description="most decisions the relay reads into one Kafka transaction"
    )
    relay_memory: int = Field(
        200_000,
        ge=1000,
        description="half identities per op partition the relay keeps to recognise a second"
        " decision at once; older ones are looked up in the op history",
    )
    relay_transaction_timeout_ms: Milliseconds = Field(
        10_000, ge=1000, description="Kafka transaction.timeout.ms of the relay's producer"
    )
    start_timeout_seconds: Seconds = Field(
        60.0,
        gt=0,
        description="how long to wait at start for the cluster to answer (a replica started"
        " during a broker restart waits it out) before exiting with an error",
    )
    unreachable_report_seconds: Seconds = Field(
        30.0,
        ge=1,
        description="while waiting at start for a cluster that does not answer, say so (naming"
        " the bootstrap servers and what a connection to each met) this often; the first time"
        " after 5s at most",
    )
    health_stall_seconds: Seconds = Field(
        120.0,
        gt=0,
        description="/healthz and /readyz answer 503 once no round has completed this long"
        " after it was due (plus max_process_seconds per owned partition), or the relay has"
        " been wedged as long",
    )
    http_address: str = Field(
        "127.0.0.1:9464", description="host:port of /healthz, /readyz and /metrics ('' turns off)"
    )

    @field_validator("http_address")
    @classmethod
    def _host_port(cls, value: str) -> str:
        if value and (":" not in value or not value.rsplit(":", 1)[1].isdigit()):
            raise ValueError(f"expected host:port or '', got {value!r}")
        return value

    def client_config(self, **overrides: Any) -> dict[str, Any]:
        """A librdkafka configuration: :data:`FAILOVER_CLIENT_PROPERTIES` under bootstrap,
        security, pass-through properties and ``overrides``."""
        return super().client_config(
            **{**FAILOVER_CLIENT_PROPERTIES, **self.kafka_properties, **overrides}
        )

    @property
    def stable_instance_id(self) -> str | None:
        """The replica's id if it survives a restart: set, or given by the platform."""
        return self.instance_id or platform_instance_id(os.environ)

    @property
    def group_id(self) -> str:
        return self.checker_group or default_checker_group(self.topic_prefix)

    @property
    def transaction_timeout_ms(self) -> int:
        return int(self.transaction_timeout_seconds * 1000)

    @property
    def retention_ms(self) -> int:
        return int(self.retention_hours * 3600 * 1000)

    @property
    def max_process_ms(self) -> int:
        return int(self.max_process_seconds * 1000)


CHECKER_DEFAULTS = CheckerSettings.model_construct()
"""Every field at its default, read from no environment: the defaults of the objects
built from the settings (:class:`~outbox_checker.rules.RoundRules`,
:class:`~outbox_checker.relay.RelaySettings`), for tests and benchmarks that build them alone."""

_SETTING = "outbox_checker.setting"
"""The key of a dataclass field's metadata naming the setting it takes."""

Built = TypeVar("Built")


def from_setting(name: str) -> Any:
    """A dataclass field that takes the setting ``name`` (:func:`built_from_settings`), with
    that setting's default (:data:`CHECKER_DEFAULTS`) as its own."""
    return field(default=getattr(CHECKER_DEFAULTS, name), metadata={_SETTING: name})


def built_from_settings(cls: type[Built], settings: CheckerSettings) -> Built:
    """An instance of the dataclass ``cls`` whose :func:`from_setting` fields take their
    settings' values from ``settings``; its other fields keep their defaults."""
    taken = {
        spec.name: getattr(settings, spec.metadata[_SETTING])
        for spec in fields(cls)
        if _SETTING in spec.metadata
    }
    return cls(**taken)


def platform_instance_id(environ: Mapping[str, str]) -> str | None:
    """The name the platform gives this replica again after a restart, if it gives one.

    Under Kubernetes (``KUBERNETES_SERVICE_HOST`` is set in every pod) ``HOSTNAME``
    is the pod's name: a StatefulSet's ``checker-0`` comes back as ``checker-0``,
    and two pods of one namespace never share one. Elsewhere a host name says
    nothing of the kind (two replicas on one host share it), so there is none.
    """
    if environ.get("KUBERNETES_SERVICE_HOST"):
        return environ.get("HOSTNAME") or None
    return None
