# One image for every Dispo service; compose.yaml picks the service with the command.
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY protos protos
COPY libs libs
COPY services services
RUN pip install --no-cache-dir -e . \
    && useradd --system dispo && mkdir -p /var/lib/dispo/pool && chown -R dispo /var/lib/dispo
USER dispo
