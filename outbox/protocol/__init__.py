"""The outbox wire protocol, defined once and imported by every component.

Topic naming (:mod:`.topics`), header names (:mod:`.headers`), the record kinds
and their codecs (:mod:`.records`), partition pairing (:mod:`.partitioning`), and
the times producer and checker agree on (:mod:`.timing`).
"""

from outbox.protocol.errors import InvalidNameError, MalformedRecordError, ProtocolError
from outbox.protocol.headers import RESERVED_HEADER_PREFIX, Header, is_reserved
from outbox.protocol.partitioning import half_partition_for, murmur2, op_partition_for_half
from outbox.protocol.records import (
    CheckRequest,
    Decision,
    DiscardReason,
    DiscardRecord,
    HalfRecord,
    KafkaMessage,
    OpRecord,
    OutgoingRecord,
    RawRecord,
    RealRecord,
    RecordKind,
    Resolution,
    half_stored_ms,
    new_transaction_id,
    real_record_of_half,
    validate_transaction_id,
)
from outbox.protocol.timing import TRANSACTION_TIMEOUT_SECONDS
from outbox.protocol.topics import (
    DEFAULT_PREFIX,
    TopicNames,
    validate_producer_group,
    validate_topic_name,
)

__all__ = [
    "DEFAULT_PREFIX",
    "RESERVED_HEADER_PREFIX",
    "TRANSACTION_TIMEOUT_SECONDS",
    "CheckRequest",
    "Decision",
    "DiscardReason",
    "DiscardRecord",
    "HalfRecord",
    "Header",
    "InvalidNameError",
    "KafkaMessage",
    "MalformedRecordError",
    "OpRecord",
    "OutgoingRecord",
    "ProtocolError",
    "RawRecord",
    "RealRecord",
    "RecordKind",
    "Resolution",
    "TopicNames",
    "half_partition_for",
    "half_stored_ms",
    "is_reserved",
    "murmur2",
    "new_transaction_id",
    "op_partition_for_half",
    "real_record_of_half",
    "validate_producer_group",
    "validate_topic_name",
    "validate_transaction_id",
]
