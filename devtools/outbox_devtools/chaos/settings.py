"""The chaos run's settings: each field is a flag of ``outbox chaos`` and an env variable."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from outbox.durations import Seconds
from outbox_devtools.kafka import KafkaRuntimeError, check_node_count


class ChaosSettings(BaseSettings):
    """How big the run is and how many faults of each kind the controller injects."""

    model_config = SettingsConfigDict(env_prefix="OUTBOX_CHAOS_", extra="forbid")

    seed: int = Field(1, description="seed of the fault schedule and of the orders")
    transactions: int = Field(
        10_000, ge=100, description="transactions to send before the faults stop"
    )
    producers: int = Field(
        4, ge=2, description="producer processes; live ones answer the check-backs of killed ones"
    )
    threads: int = Field(4, ge=1, description="sending threads per producer process")
    checkers: int = Field(2, ge=1, description="checker replicas")
    producer_kills: int = Field(6, ge=0, description="SIGKILLs of a producer process")
    checker_kills: int = Field(2, ge=0, description="SIGKILLs of a checker replica")
    broker_restarts: int = Field(
        2, ge=0, description="broker outages (alternately a clean stop and a SIGKILL)"
    )
    checker_outages: int = Field(
        1,
        ge=0,
        description="SIGKILLs of every checker replica at once, down 10-20 s (publication pauses)",
    )
    answering_producer_kills: int = Field(
        1,
        ge=0,
        description="SIGKILLs of a producer caught answering a check-back"
        " (recorded as 'no check seen' if none arrives in time)",
    )
    broker_freezes: int = Field(
        1, ge=0, description="SIGSTOPs of the broker for 10-20 s, then SIGCONT (nothing restarts)"
    )
    brokers: int = Field(
        1,
        description="Kafka nodes: 1, or 3-5 for a cluster (three copies, min.insync.replicas=2)"
        " where each broker stop, kill and freeze strikes one seeded node and the three"
        " cluster faults below are added",
    )
    rolling_restarts: int = Field(
        1,
        ge=0,
        description="with --brokers 3+: restarts of every node in turn, each once the"
        " in-sync replicas are complete again",
    )
    half_leader_kills: int = Field(
        1,
        ge=0,
        description="with --brokers 3+: SIGKILLs of the node leading a half partition, down 1-6 s",
    )
    coordinator_kills: int = Field(
        1,
        ge=0,
        description="with --brokers 3+: SIGKILLs of the node coordinating a checker replica's"
        " relay transactions, down 1-6 s",
    )
    mid_chunk_kills: int = Field(
        1,
        ge=0,
        description="SIGKILLs of a checker replica inside a round chunk's Kafka transaction"
        " (put-back copies stored, check requests not yet written)",
    )
    discard_cycles: int = Field(
        1,
        ge=0,
        description="orders of a producer group nobody answers for: discarded at check_max,"
        " resumed (discarded again), resumed with a producer answering (producers mode only)",
    )
    checker_freezes: int = Field(
        1, ge=0, description="SIGSTOPs of a checker replica for 10-20 s, then SIGCONT"
    )
    network_partitions: bool = Field(
        False,
        description="run the brokers, checker replicas and producers in network namespaces of"
        " their own (needs root and iproute2; refused with one line otherwise) and add the cuts"
        " below: links dropped silently while both sides keep running, then healed",
    )
    checker_cuts: int = Field(
        1,
        ge=0,
        description="with --network-partitions: a checker replica cut from every broker for"
        " 10-25 s while it runs (its partitions move past its session)",
    )
    producer_cuts: int = Field(
        1,
        ge=0,
        description="with --network-partitions: a producer cut from every broker mid-send, 5-15 s",
    )
    node_cuts: int = Field(
        1,
        ge=0,
        description="with --network-partitions and --brokers 3+: one node cut from the other"
        " nodes (a minority; clients still reach it), 10-20 s",
    )
    half_leader_cuts: int = Field(
        1,
        ge=0,
        description="with --network-partitions and --brokers 3+: the node leading a half"
        " partition cut from its followers, 10-20 s",
    )
    park_when_unavailable: bool = Field(
        False,
        description="producers park a send whose half Kafka does not take in time in the"
        " transaction log (ProducerSettings.park_when_unavailable), the checker replicas drain"
        " them (so they run with --resolve-from-db), and the Kafka outages below are added",
    )
    kafka_outages: int = Field(
        1,
        ge=0,
        description="with --park-when-unavailable: the broker (with --brokers 3+, a majority of"
        " the nodes) killed for 20-30 s while orders continue",
    )
    drain_freezes: int = Field(
        1,
        ge=0,
        description="with --park-when-unavailable, one per Kafka outage at most: SIGSTOPs of the"
        " checker replica caught inside a parked drain's Kafka transaction, 8-16 s (past its"
        " session, so its partition moves while the transaction is open)",
    )
    rollback_share: float = Field(
        0.15, ge=0, le=1, description="orders a business rule refuses (local rollback)"
    )
    unknown_share: float = Field(
        0.02,
        ge=0,
        le=1,
        description="committed orders whose listener answers UNKNOW (resolved by check-back)",
    )
    reused_key_share: float = Field(
        0.02,
        ge=0,
        le=1,
        description="orders first sent as an orphaned attempt (a half whose local transaction"
        " never ran, as after a crash), then again with the same transaction id",
    )
    slow_commit_share: float = Field(
        0.005,
        ge=0,
        le=1,
        description="orders whose database COMMIT blocks past the listener's grace (a deferred"
        " trigger), so a check-back races it",
    )
    resolve_from_db: bool = Field(
        False,
        description="checker replicas answer from the transaction log (--resolve-from-db)"
        " instead of asking the producers",
    )
    partitions: int = Field(4, ge=1, description="partitions of the outbox and real topics")
    settle_seconds: Seconds = Field(
        240.0, gt=0, description="how long the checker and sink may take to settle after faults"
    )
    database: Literal["postgresql", "mariadb"] = Field(
        "postgresql",
        description="the producers' database, started for the run: postgresql, or mariadb"
        " (MySQL's protocol; no COMMIT blocks there, so no slow commit is drawn)",
    )
    sink_format: Literal["parquet", "delta"] = Field(
        "parquet", description="the sink's table: parquet (window dedup) or delta (MERGE dedup)"
    )
    work_dir: str | None = Field(
        None, description="where logs, the table and checkpoints go (default: a temp dir)"
    )

    @model_validator(mode="after")
    def _parking_needs_the_log(self) -> ChaosSettings:
        """Parked sends wait in the transaction log, which only a checker reading it drains."""
        if self.park_when_unavailable:
            self.resolve_from_db = True
        return self

    @field_validator("brokers")
    @classmethod
    def _node_count(cls, brokers: int) -> int:
        try:
            check_node_count(brokers)
        except KafkaRuntimeError as exc:
            raise ValueError(str(exc)) from None
        return brokers
