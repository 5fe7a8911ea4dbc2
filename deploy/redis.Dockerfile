# Redis from Debian's redis-server package, for hosts that cannot pull the `redis:7` image.
# `make deploy-check` builds it on the same base as hookbus and sets REDIS_IMAGE to it:
#
#   docker build -f deploy/redis.Dockerfile --build-arg BASE_IMAGE=hookbus-base:bookworm -t hookbus-redis:7 deploy
#
# It behaves as the official image does for compose: `redis-server` and `redis-cli` on PATH,
# data in /data, running as the unprivileged `redis` user.
ARG BASE_IMAGE=debian:bookworm-slim
FROM ${BASE_IMAGE}
RUN apt-get update \
    && apt-get install -y --no-install-recommends redis-server \
    && rm -rf /var/lib/apt/lists/* \
    && mkdir -p /data \
    && chown redis:redis /data
USER redis
WORKDIR /data
VOLUME /data
EXPOSE 6379
CMD ["redis-server", "--dir", "/data"]
