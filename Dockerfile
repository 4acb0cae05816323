# One image for every Python service in docker-compose.yml (checker, sink, demo):
# they are sub-commands of the same `outbox` entry point, so they share a build.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# A fixed, unprivileged uid: nothing here needs root, and a fixed uid keeps
# bind-mounted files predictable.
RUN useradd --system --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin outbox

WORKDIR /app
COPY . .
# The postgres extra brings psycopg 3, the driver the postgresql+psycopg URLs name.
RUN pip install ".[postgres]"

USER outbox

ENTRYPOINT ["outbox"]
CMD ["--help"]
