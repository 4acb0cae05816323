"""Why Kafka refused us, in one line: a wrong password, an untrusted certificate, a missing ACL.

librdkafka reports a failed login or TLS handshake only to its error callback
and its log; the request that was waiting just times out with "Broker
transport failure", which reads like a broker that is down. :func:`connect`
waits for the cluster's first answer while listening to that callback, and
turns the callback's error into one that names the user, the mechanism or the
CA file to check. Refusals by the authoriser (``*_AUTHORIZATION_FAILED``)
become :class:`~outbox.errors.NotAuthorizedError`, naming the operation, the
resource and the principal, and where to find the ACLs each component needs.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Mapping
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient

from outbox.errors import ConnectionSecurityError, KafkaUnavailableError, NotAuthorizedError
from outbox.security import SecurityRules

log = logging.getLogger(__name__)

AUTHORIZATION_FAILURES: dict[int, str] = {
    KafkaError.TOPIC_AUTHORIZATION_FAILED: "topic",
    KafkaError.GROUP_AUTHORIZATION_FAILED: "group",
    KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED: "transactional id",
    KafkaError.CLUSTER_AUTHORIZATION_FAILED: "cluster",
}

_CONNECT_POLL_SECONDS = 0.5
_HANG_UPS_TO_BLAME_PROTOCOL = 3
_AFTER_STATE = re.compile(r"\s*\(after \d+ms in state \w+\)\s*$")
_BROKER_NAME = re.compile(r"^\S+://\S+/(?:\d+|bootstrap): ")


def is_authorization_failure(error: KafkaError) -> bool:
    return error.code() in AUTHORIZATION_FAILURES


def raise_if_not_described(name: str, topic: Any, principal: str | None = None) -> None:
    """``topic`` (metadata asked for by name) refused to this principal: a listing would
    have left it out, and "does not exist" would send its user the wrong way."""
    if topic is not None and topic.error is not None and is_authorization_failure(topic.error):
        raise NotAuthorizedError("DESCRIBE", f"topic {name!r}", principal)


def raise_if_configs_refused(name: str, exc: KafkaException, principal: str | None = None) -> None:
    """``exc`` (from describing the configs of topic ``name``) is the authoriser's refusal:
    guessing a default in its place would judge records by a limit the topic may not have."""
    if is_authorization_failure(exc.args[0]):
        raise NotAuthorizedError("DESCRIBE_CONFIGS", f"topic {name!r}", principal) from None


def raise_if_group_refused(admin: AdminClient, group: str, timeout: float) -> None:
    """Refuse a start whose principal may not use consumer group ``group``, naming READ.

    Joining the group, which needs READ, happens later in a consumer's
    background thread; describing the group is one request that needs
    DESCRIBE, which READ implies. So a principal with no ACL on the group is
    refused here, and one granted DESCRIBE alone learns it from the consumer's
    error. Anything but a refusal (a slow coordinator) is left to the consumer,
    which waits for it anyway.

    Not the group's committed offsets through the admin API: librdkafka's
    ``ListConsumerGroupOffsets`` dereferences a consumer group the admin client
    does not have when the answer is NOT_COORDINATOR (a broker still loading its
    group coordinator, as every new cluster does at first), and the service's
    process died of SIGSEGV (librdkafka issue 5040).
    """
    future = admin.describe_consumer_groups([group], request_timeout=timeout)[group]
    try:
        future.result(timeout)
    except KafkaException as exc:
        if exc.args[0].code() == KafkaError.GROUP_AUTHORIZATION_FAILED:
            raise NotAuthorizedError("READ", f"group {group!r}") from None
        log.debug("cannot describe group %s at start: %s", group, exc)
    except TimeoutError:  # no answer at all: a coordinator still being elected
        log.debug("no answer describing group %s at start within %gs", group, timeout)


def principal_of(client_config: Mapping[str, Any]) -> str | None:
    """``User:NAME`` a SASL client of ``client_config`` logs in as; None without SASL."""
    protocol = str(client_config.get("security.protocol", "")).lower()
    user = client_config.get("sasl.username")
    return f"User:{user}" if protocol.startswith("sasl_") and user else None


def refused_write(topic: str, error: KafkaError, client_config: Mapping[str, Any]) -> str:
    """Why a record for ``topic`` was not stored, in words; the ACL when that is why."""
    if is_authorization_failure(error):
        return str(NotAuthorizedError("WRITE", f"topic {topic!r}", principal_of(client_config)))
    return str(error)


def _detail(error: KafkaError) -> str:
    """librdkafka's text without the broker address and connection state it prepends and appends."""
    return _AFTER_STATE.sub("", _BROKER_NAME.sub("", error.str()))


def authentication_failed(security: SecurityRules, bootstrap: str) -> str:
    """The broker refused the user name and password (never shown)."""
    return (
        f"authentication failed for user {security.sasl_username!r} with mechanism "
        f"{security.sasl_mechanism} at {bootstrap}: check sasl_username and "
        "sasl_password (OUTBOX_SASL_USERNAME, OUTBOX_SASL_PASSWORD)"
    )


def untrusted_certificate(security: SecurityRules, bootstrap: str) -> str:
    """The client does not trust the certificate the broker showed."""
    ca = security.ssl_ca_file
    trusted = f"the CA file {str(ca)!r}" if ca else "the system's CAs (no ssl_ca_file)"
    return (
        f"TLS handshake with {bootstrap} failed: the broker's certificate is not "
        f"trusted by {trusted}; check the CA file (ssl_ca_file, OUTBOX_SSL_CA_FILE)"
    )


def connection_problem(
    error: KafkaError, security: SecurityRules, bootstrap: str
) -> ConnectionSecurityError | None:
    """The clear error for a failed login or TLS handshake; None for any other error."""
    detail = _detail(error)
    if error.code() == KafkaError._AUTHENTICATION:
        if "SASL" in detail or security.sasl_username:
            return ConnectionSecurityError(authentication_failed(security, bootstrap))
        return ConnectionSecurityError(f"authentication at {bootstrap} failed: {detail}")
    if error.code() in (KafkaError._SSL, KafkaError._AUTHENTICATION) or "SSL" in detail:
        if "certificate verify failed" in detail:
            return ConnectionSecurityError(untrusted_certificate(security, bootstrap))
        if error.code() == KafkaError._SSL:
            return ConnectionSecurityError(f"TLS handshake with {bootstrap} failed: {detail}")
    if "security.protocol" in detail:
        return wrong_protocol(security, bootstrap)
    return None


def wrong_protocol(security: SecurityRules, bootstrap: str) -> ConnectionSecurityError:
    """librdkafka's guess (the broker hung up on the first request) as advice."""
    return ConnectionSecurityError(
        f"{bootstrap} closed the connection at the handshake: its listener does not speak"
        f" security protocol {security.security_protocol} (check security_protocol,"
        " OUTBOX_SECURITY_PROTOCOL)"
    )


class _ErrorRecorder(logging.Handler):
    """The probe client's ``error_cb`` and log: what it reports while a request waits.

    A plaintext client at a TLS listener gets no error event at all, only a log
    line that the broker hung up on the version request; hence the log too.
    Kept here, never printed: the error raised from them says it more clearly.
    """

    def __init__(self) -> None:
        super().__init__()
        self.errors: list[KafkaError] = []
        self.lines: list[str] = []
        self.logger = logging.Logger("outbox.kafka.probe")
        self.logger.addHandler(self)

    def __call__(self, error: KafkaError) -> None:
        self.errors.append(error)

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())

    def hung_up_at_handshake(self) -> bool:
        """The broker closed the connection at the first request, again and again: it
        expects TLS (or no TLS) where the client spoke otherwise. Once could be a restart."""
        hang_ups = [
            line
            for line in self.lines
            if "security.protocol" in line
            or ("closed by peer" in line and "state APIVERSION_QUERY" in line)
        ]
        return len(hang_ups) >= _HANG_UPS_TO_BLAME_PROTOCOL


def connect(
    client_config: Mapping[str, Any],
    security: SecurityRules,
    bootstrap: str,
    timeout: float,
) -> AdminClient:
    """An AdminClient of a cluster that answered a first metadata request within ``timeout``.

    A failed login or handshake ends the wait at once with the error that
    names its cause; an unreachable cluster, after ``timeout``, with
    :class:`~outbox.errors.KafkaUnavailableError`.
    """
    recorder = _ErrorRecorder()
    probe = AdminClient({**client_config, "error_cb": recorder, "logger": recorder.logger})
    deadline = time.monotonic() + timeout
    while True:
        wait = max(0.1, min(_CONNECT_POLL_SECONDS, deadline - time.monotonic()))
        try:
            probe.list_topics(timeout=wait)
            return AdminClient(dict(client_config))
        except KafkaException as exc:
            last = exc.args[0]
        probe.poll(0)  # serves the error callback
        for error in recorder.errors:
            problem = connection_problem(error, security, bootstrap)
            if problem is not None:
                raise problem
        if recorder.hung_up_at_handshake():
            raise wrong_protocol(security, bootstrap)
        if time.monotonic() >= deadline:
            raise KafkaUnavailableError(
                f"cannot reach Kafka at {bootstrap} within {timeout:g}s: {last}"
            )
