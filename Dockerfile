# One image for every Python service in docker-compose.yml: the checker and the
# sink are sub-commands of the same `outbox` entry point, and the demo runs
# examples/order_service.py from the source tree copied to /app, so they share a build.
# The base names its Debian release: a bare `3.11-slim` moved to Debian 13 (trixie),
# which has no openjdk-17 package, and the build stopped at apt-get. Each package
# installed below is checked against this release's index by tests/compose.
FROM python:3.11-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# Java runs Spark for the sink service (pyspark's JVM); Debian's JRE 17.
RUN apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jre-headless \
    && rm -rf /var/lib/apt/lists/*

# A fixed, unprivileged uid: nothing here needs root, and a fixed uid keeps
# bind-mounted files predictable. The sink's volume is its to write.
RUN useradd --system --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin outbox \
    && mkdir -p /var/lib/outbox-sink && chown outbox:outbox /var/lib/outbox-sink

WORKDIR /app
# Everything .dockerignore lets through: the package sources and examples/.
COPY . .
# The postgres extra brings psycopg 3, the driver the postgresql+psycopg URLs name;
# the spark extra brings pyspark for `outbox sink`.
RUN pip install ".[postgres,spark]"

USER outbox

ENTRYPOINT ["outbox"]
CMD ["--help"]
