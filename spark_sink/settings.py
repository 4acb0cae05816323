"""The sink job's settings: one typed object, every field an ``OUTBOX_SINK_*`` variable.

The Kafka address, the outbox topic prefix and the security block
(:mod:`outbox.security`) are shared with every other component, so
``OUTBOX_BOOTSTRAP_SERVERS``, ``OUTBOX_TOPIC_PREFIX``, ``OUTBOX_SASL_USERNAME``
and the rest work here too (the ``OUTBOX_SINK_`` names win when both are set).
The same object drives ``outbox sink`` and a ``spark-submit`` of :mod:`spark_sink.job`.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal, Self

from pydantic import AliasChoices, Field, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from outbox.config import normalize_bootstrap_servers
from outbox.durations import Seconds
from outbox.protocol import DEFAULT_PREFIX, TopicNames, validate_topic_name
from outbox.security import shared_security


def spark_interval(seconds: float) -> str:
    """Seconds as an interval string Spark parses (whole milliseconds)."""
    return f"{round(seconds * 1000)} milliseconds"


class _SinkFields(BaseSettings):
    """The sink's own fields; :class:`SinkSettings` adds the security block after them."""

    model_config = SettingsConfigDict(
        env_prefix="OUTBOX_SINK_", extra="forbid", populate_by_name=True
    )

    bootstrap_servers: str = Field(
        # Environment names only: populate_by_name lets code pass bootstrap_servers=.
        validation_alias=AliasChoices("OUTBOX_SINK_BOOTSTRAP_SERVERS", "OUTBOX_BOOTSTRAP_SERVERS"),
        description="Kafka bootstrap servers, host:port[,host:port]",
    )
    topics: Annotated[tuple[str, ...], NoDecode] = Field(
        (), description="real topics to read, comma-separated (or pattern)"
    )
    pattern: str | None = Field(None, description="Java regex of real topics to read (or topics)")
    output: str = Field(description="path (or URI) of the table")
    checkpoint: str = Field(description="path (or URI) of the query's checkpoint")
    format: str = Field(
        "parquet", description="table format: parquet, delta (Delta Lake), or a Spark file source"
    )
    once: bool = Field(False, description="read what is there now (available-now trigger), stop")
    trigger: Seconds = Field(
        10.0, ge=0, description="time between micro-batches in continuous mode"
    )
    starting_offsets: str = Field(
        "earliest", description="where a new checkpoint starts: earliest, latest or Spark's JSON"
    )
    fail_on_data_loss: bool = Field(
        True, description="fail when offsets are gone (retention, deleted topic) instead of skip"
    )
    dedup: Literal["auto", "window", "merge", "off"] = Field(
        "auto",
        description="de-duplication by transaction id: window (state), merge (against the "
        "Delta table, no time bound) or off; auto is merge for delta, else window",
    )
    dedup_window: Seconds = Field(
        3600.0,
        gt=0,
        description="how long (ingestion time) a transaction id is remembered",
    )
    dedup_lookback: Seconds = Field(
        7 * 86400.0,
        gt=0,
        description="merge: how far before a batch's earliest date the MERGE looks for a copy",
    )
    max_offsets_per_trigger: int | None = Field(
        None, ge=1, description="cap on records per micro-batch (all available when unset)"
    )
    master: str | None = Field(
        None, description="Spark master URL; default local[*] (or spark-submit's)"
    )
    shuffle_partitions: int = Field(
        8, ge=1, description="state partitions of the de-duplication; fixed by the checkpoint"
    )
    state_store: Literal["rocksdb", "memory"] = Field(
        "rocksdb", description="state store of the de-duplication: rocksdb (on disk) or memory"
    )
    topic_prefix: str = Field(
        DEFAULT_PREFIX,
        validation_alias=AliasChoices("OUTBOX_SINK_TOPIC_PREFIX", "OUTBOX_TOPIC_PREFIX"),
        description="prefix of the outbox's own topics, which are never read as events",
    )
    kafka_options: dict[str, str] = Field(
        default_factory=dict,
        repr=False,
        description="extra Java Kafka client properties (JSON object); they win over the"
        " security settings",
    )
    group_id_prefix: str = Field(
        "outbox-sink",
        description="prefix of the Kafka consumer group ids the Spark source makes up"
        " (its groupIdPrefix), for a prefixed group ACL",
    )
    spark_conf: dict[str, str] = Field(
        default_factory=dict, description="extra Spark configuration (JSON object)"
    )
    kafka_timeout_seconds: Seconds = Field(
        30.0, gt=0, description="how long the start-up check waits for the brokers"
    )
    app_name: str = Field("outbox-sink", description="Spark application name")

    @field_validator("bootstrap_servers")
    @classmethod
    def _bootstrap_has_hosts(cls, value: str) -> str:
        return normalize_bootstrap_servers(value)

    @field_validator("topics", mode="before")
    @classmethod
    def _split_topics(cls, value: Any) -> Any:
        if value is None:
            return ()
        if isinstance(value, str):
            value = value.split(",")
        return tuple(t.strip() for t in value if t and t.strip())

    @field_validator("topics")
    @classmethod
    def _topics_are_names(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for topic in value:
            validate_topic_name(topic)
        return tuple(dict.fromkeys(value))

    @field_validator("pattern", "master")
    @classmethod
    def _blank_is_none(cls, value: str | None) -> str | None:
        return value if value and value.strip() else None

    @field_validator("pattern")
    @classmethod
    def _pattern_compiles(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                re.compile(value)
            except re.error as exc:
                raise ValueError(f"pattern {value!r} is not a regular expression: {exc}") from None
        return value

    @field_validator(
        "output", "checkpoint", "format", "starting_offsets", "app_name", "group_id_prefix"
    )
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must not be empty")
        return value.strip()

    @field_validator("format")
    @classmethod
    def _format_lower(cls, value: str) -> str:
        return value.lower()

    @field_validator("topic_prefix")
    @classmethod
    def _prefix_is_a_topic_name(cls, value: str) -> str:
        return validate_topic_name(value, "topic prefix")

    @model_validator(mode="after")
    def _one_source_and_distinct_paths(self) -> Self:
        if bool(self.topics) == bool(self.pattern):
            raise ValueError("give exactly one of topics (--topics T1,T2) and pattern (--pattern)")
        internal = [t for t in self.topics if TopicNames(self.topic_prefix).is_internal(t)]
        if internal:
            raise ValueError(
                f"{', '.join(internal)}: outbox protocol topics hold halves and ops, not "
                "committed events; read the real topics the events were sent to"
            )
        if self.output.rstrip("/") == self.checkpoint.rstrip("/"):
            raise ValueError("output and checkpoint must be different paths")
        if self.dedup == "merge" and not self.is_delta:
            raise ValueError(
                f"dedup merge needs format delta (MERGE is a Delta Lake operation), not "
                f"{self.format}; use dedup window for {self.format}"
            )
        return self

    @property
    def is_delta(self) -> bool:
        return self.format == "delta"

    @property
    def dedup_mode(self) -> Literal["window", "merge", "off"]:
        """The de-duplication that runs: ``auto`` is the safe one the format allows."""
        if self.dedup == "auto":
            return "merge" if self.is_delta else "window"
        return self.dedup

    @property
    def trigger_interval(self) -> str:
        return spark_interval(self.trigger)

    @property
    def dedup_delay(self) -> str:
        return spark_interval(self.dedup_window)


class SinkSettings(shared_security("OUTBOX_SINK_"), _SinkFields):  # type: ignore[misc]
    """Everything ``outbox sink`` can be told; see the README's "Spark sink" section."""

    model_config = SettingsConfigDict(
        env_prefix="OUTBOX_SINK_", extra="forbid", populate_by_name=True
    )

    def java_kafka_properties(self) -> dict[str, str]:
        """The Java client's properties: the security block, then ``kafka_options`` (which win)."""
        return {**self.java(), **self.kafka_options}
