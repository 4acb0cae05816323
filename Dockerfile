# Two images from one file, each a target (`make image` builds both; see docs/operations.md):
#
#   checker  the sidecar: `outbox checker` (also `outbox topics`, `status`, `discard`, `db`),
#            no JRE and no pyspark, which only the sink needs;
#   sink     `outbox sink`: the same library with pyspark and Debian's JRE 17.
#
# The base names its Debian release: a bare `3.11-slim` moved to Debian 13 (trixie),
# which has no openjdk-17 package, and the build stopped at apt-get. Each package
# installed below is checked against this release's index by tests/compose. BASE may
# name another build of the same release: where no image registry answers, `make image`
# builds Debian bookworm's own python3.11 with debootstrap (outbox_devtools/images.py).
ARG BASE=python:3.11-slim-bookworm

# -- build stages: venvs and the wheel; nothing of them but /opt/outbox reaches an image --

FROM ${BASE} AS deps
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
# Only what names the dependencies: a change to the code keeps this layer, and the
# next, which downloads them, cached.
COPY pyproject.toml image/requirements.py ./
# The ca-bundle secret is for a network whose TLS goes through a proxy with its own
# authority (`make image` passes the host's bundle); without it pip trusts its own.
# The venv lives where the final images keep it: its scripts name their interpreter.
RUN --mount=type=secret,id=ca-bundle \
    if [ -s /run/secrets/ca-bundle ]; then export PIP_CERT=/run/secrets/ca-bundle; fi \
    && python3 requirements.py pyproject.toml postgres > /tmp/checker.txt \
    && python3 -m venv /opt/outbox \
    && /opt/outbox/bin/pip install -r /tmp/checker.txt

# The sink's venv adds pyspark (and py4j) to the checker's.
FROM deps AS sink-deps
RUN --mount=type=secret,id=ca-bundle \
    if [ -s /run/secrets/ca-bundle ]; then export PIP_CERT=/run/secrets/ca-bundle; fi \
    && python3 requirements.py pyproject.toml postgres spark > /tmp/sink.txt \
    && /opt/outbox/bin/pip install -r /tmp/sink.txt

# The project's wheel, built from what .dockerignore lets through.
FROM deps AS wheel
COPY . .
RUN --mount=type=secret,id=ca-bundle \
    if [ -s /run/secrets/ca-bundle ]; then export PIP_CERT=/run/secrets/ca-bundle; fi \
    && /opt/outbox/bin/pip wheel --no-deps --wheel-dir /wheels .

# The project on top, then pip and setuptools out: the images install nothing at run time.
FROM deps AS checker-venv
COPY --from=wheel /wheels /wheels
RUN /opt/outbox/bin/pip install --no-deps /wheels/*.whl \
    && /opt/outbox/bin/python -m pip uninstall --yes --quiet pip setuptools

FROM sink-deps AS sink-venv
COPY --from=wheel /wheels /wheels
RUN /opt/outbox/bin/pip install --no-deps /wheels/*.whl \
    && /opt/outbox/bin/python -m pip uninstall --yes --quiet pip setuptools

# -- the images ---------------------------------------------------------------------

FROM ${BASE} AS runtime
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PATH=/opt/outbox/bin:$PATH
# tini is PID 1: it hands SIGTERM to `outbox` (whose handler finishes the round or the
# batch and exits 0) and reaps what the sink's JVM leaves, which a Python PID 1 would not.
# A fixed, unprivileged uid: nothing here needs root, and a fixed uid keeps
# bind-mounted files predictable.
RUN apt-get update \
    && apt-get install -y --no-install-recommends tini \
    && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin \
    && useradd --system --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin outbox
COPY image/healthcheck.py /usr/local/bin/outbox-healthcheck
WORKDIR /app

FROM runtime AS checker
COPY --from=checker-venv /opt/outbox /opt/outbox
# Probes and metrics beyond loopback: a kubelet, the engine's HEALTHCHECK and Prometheus
# reach the container's address, not its loopback.
ENV OUTBOX_HTTP_ADDRESS=0.0.0.0:9464
EXPOSE 9464
# /healthz is 503 once rounds stall; the probe follows OUTBOX_HTTP_ADDRESS.
HEALTHCHECK --interval=10s --timeout=5s --start-period=30s --retries=5 CMD ["outbox-healthcheck"]
ARG VERSION=0.1.0
ARG SOURCE=unknown
ARG REVISION=unknown
# What the image was built from, in a file too; and the step that makes the labels follow
# a new revision: buildah's layer cache keys a RUN on the arguments it sees, a LABEL not.
RUN printf 'version=%s\nsource=%s\nrevision=%s\n' "$VERSION" "$SOURCE" "$REVISION" \
    > /etc/kafka-outbox-image
LABEL org.opencontainers.image.title="kafka-outbox-checker" \
      org.opencontainers.image.description="The kafka-outbox checker sidecar: check-backs and the relay" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.source="${SOURCE}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.licenses="Apache-2.0"
USER outbox
ENTRYPOINT ["tini", "--", "outbox"]
CMD ["checker"]

FROM runtime AS sink
# Java runs Spark for the sink (pyspark's JVM); Debian's JRE 17.
RUN apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jre-headless \
    && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin \
    && mkdir -p /var/lib/outbox-sink && chown outbox:outbox /var/lib/outbox-sink
COPY --from=sink-venv /opt/outbox /opt/outbox
# No HEALTHCHECK: the sink serves no HTTP endpoint; a failed query ends the process.
ARG VERSION=0.1.0
ARG SOURCE=unknown
ARG REVISION=unknown
RUN printf 'version=%s\nsource=%s\nrevision=%s\n' "$VERSION" "$SOURCE" "$REVISION" \
    > /etc/kafka-outbox-image
LABEL org.opencontainers.image.title="kafka-outbox-sink" \
      org.opencontainers.image.description="The kafka-outbox Spark sink: committed events to a table" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.source="${SOURCE}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.licenses="Apache-2.0"
USER outbox
ENTRYPOINT ["tini", "--", "outbox"]
CMD ["sink", "--help"]
