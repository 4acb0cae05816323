"""The names and formats the checker's programs agree on, each written once.

The rounds, the relay and the operator commands find each other's state in Kafka by
these: ``outbox status`` reads the committed offsets of the rounds' group and of the
relay's (:func:`relay_group`) and decodes the rounds' checkpoints
(:func:`decode_checkpoint`), which the rounds write (:func:`encode_checkpoint`). Every
consumer group and transactional id the checker's programs use is made up here, so the
grants of :func:`outbox.acls.checker_acls` (by prefix: ``<group>``, ``<group>.``,
:data:`outbox.acls.CHECKER_READER_GROUP_PREFIX`) can be checked against one list.
"""

from __future__ import annotations

import uuid

from outbox.acls import CHECKER_READER_GROUP_PREFIX
from outbox.protocol import TopicNames

# ------------------------------------------------------------------ consumer groups


def default_checker_group(topic_prefix: str) -> str:
    """The rounds' consumer group when none is set (``checker_group``): ``<prefix>.checker``."""
    return f"{topic_prefix}.checker"


def relay_group(checker_group: str) -> str:
    """The relay's consumer group, beside the rounds' group of the same replicas."""
    return f"{checker_group}.relay"


def reader_group() -> str:
    """A group id of its own for one reader at explicit offsets: nothing is stored under
    it, but librdkafka looks up its coordinator (DESCRIBE, granted by prefix)."""
    return f"{CHECKER_READER_GROUP_PREFIX}{uuid.uuid4().hex}"


def resume_history_group(topics: TopicNames) -> str:
    """The group id of ``outbox discard resume``'s op history reader, which never joins it."""
    return f"{resume_transactional_id(topics)}.history"


def status_group(checker_group: str) -> str:
    """The group id of ``outbox status``'s watermark reader, which never joins it."""
    return f"outbox-status-{checker_group}"


# ------------------------------------------------------------------ transactional ids


def round_transactional_id(checker_group: str, instance: str) -> str:
    """A replica's round writer ``transactional.id``: the same across its restarts (with a
    stable instance id), so a new incarnation fences the old one's open transaction."""
    return f"{checker_group}.{instance}"


def relay_transactional_id(checker_group: str, instance: str) -> str:
    """A replica's relay ``transactional.id``: the same across its restarts, so a new
    incarnation fences the old one's open transaction (and names its coordinator)."""
    return f"{relay_group(checker_group)}.{instance}"


def resume_transactional_id(topics: TopicNames) -> str:
    """One transactional id per deployment, so concurrent resumes fence each other."""
    return f"{topics.prefix}.discard-resume"


# ------------------------------------------------------------------ the half checkpoint

_OP_KEY = "op="


def encode_checkpoint(op_offset: int) -> str:
    """Commit metadata of a half checkpoint (the rounds' group offset on half partition p):
    the op checkpoint of op partition p rides along."""
    return f"{_OP_KEY}{op_offset}"


def decode_checkpoint(metadata: str | None) -> int | None:
    """The op checkpoint in a half checkpoint's commit metadata; ``None`` when it holds none."""
    if metadata and metadata.startswith(_OP_KEY) and metadata[len(_OP_KEY) :].isdigit():
        return int(metadata[len(_OP_KEY) :])
    return None
