# One image for every Dispo service; compose.yaml picks the service with the command.
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml setup.py README.md LICENSE ./
COPY libs libs
COPY sdk sdk
COPY tools tools
COPY services services
# The package alone: no `local` extra (embedded PostgreSQL and NATS), compose runs those.
RUN pip install --no-cache-dir . \
    && useradd --system dispo && mkdir -p /var/lib/dispo/pool && chown -R dispo /var/lib/dispo
USER dispo
