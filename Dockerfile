# syntax=docker/dockerfile:1
#
# The Materializer image: `materializer run` (the Spark driver, and its executors in
# driver.mode kubernetes) and `query-service serve`, as the Helm chart in helm/ runs them.
#
#   make image                          # podman, or IMAGE_TOOL=docker; see docs/image.md
#   docker build -t materializer:0.1.0 .
#
# BASE_IMAGE is the one choice: the Python image from a registry (the default), or a
# Debian bookworm base with python3 and python3-venv made from Debian's own packages where
# no container registry is reachable (`make image BASE=debian` builds one with mmdebstrap).
# Either way Python is 3.11 and the build needs Debian's package mirror, PyPI and Maven
# Central; nothing is downloaded when a container starts. Behind a proxy that re-signs TLS,
# pass its certificate authorities as the build secret `ca-certificates` (`make image` passes
# the host's trust store); they are trusted by the build stage only.
# The tag should match the chart's appVersion (helm/materializer/Chart.yaml), or set
# image.tag in the chart's values.

# Fully qualified, so podman needs no short-name alias for it.
ARG BASE_IMAGE=docker.io/library/python:3.11-slim-bookworm

# --- build: the JVM jars into jvm/lib, the package and its dependencies into /opt/venv ------
FROM ${BASE_IMAGE} AS build
ENV DEBIAN_FRONTEND=noninteractive
# Java's packages link their manual pages, whose folder a base without documentation lacks.
RUN mkdir -p /usr/share/man/man1 \
    && apt-get update \
    && apt-get install -y --no-install-recommends \
        ca-certificates openjdk-17-jdk-headless maven make \
    && rm -rf /var/lib/apt/lists/*
# The secret's certificates (one PEM bundle) join the system's and Java's trust stores.
RUN --mount=type=secret,id=ca-certificates,required=false \
    if [ -s /run/secrets/ca-certificates ]; then \
        awk '/-----BEGIN CERTIFICATE-----/ { n++ } n { print > ("/usr/local/share/ca-certificates/build-" n ".crt") }' \
            /run/secrets/ca-certificates \
        && update-ca-certificates >/dev/null; \
    fi
ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src

# The jars first: they change far less often than the code, so this layer stays cached.
COPY Makefile ./
COPY jvm/pom.xml jvm/settings.xml jvm/
COPY jvm/spark/pom.xml jvm/spark/
COPY jvm/kafka/pom.xml jvm/kafka/
COPY jvm/registry/pom.xml jvm/registry/
COPY jvm/debezium/pom.xml jvm/debezium/
COPY jvm/s3/pom.xml jvm/s3/
COPY jvm/s3proxy/pom.xml jvm/s3proxy/
COPY jvm/live jvm/live
COPY jvm/localfs jvm/localfs
# The S3 server (jvm/s3proxy) and the Debezium capture (jvm/debezium, only its POM is
# copied, for the reactor) serve the tests only; the schema registry (jvm/registry) the
# tests and `materializer demo --schema-registry` in a checkout.
RUN --mount=type=cache,target=/root/.m2 make jars JVM_MODULES=spark,kafka,s3,live,localfs

# Then the dependencies, from pyproject.toml alone, so a change of code reuses this layer.
# grpcio-tools (pinned like the dev extra) compiles .proto schemas that a schema registry
# serves as source, for protobuf maps with schema_registry_url.
COPY pyproject.toml README.md ./
RUN --mount=type=cache,target=/root/.cache/pip \
    python3 -m venv /opt/venv \
    && /opt/venv/bin/pip install --upgrade pip \
    && python3 -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]))' \
        > /tmp/requirements.txt \
    && /opt/venv/bin/pip install -r /tmp/requirements.txt "grpcio-tools==1.85.1"
COPY materializer/ materializer/
COPY query_service/ query_service/
RUN /opt/venv/bin/pip install --no-cache-dir --no-deps .

# --- runtime: Python 3.11, a Java 17 JRE, /opt/venv, the jars beside it ---------------------
FROM ${BASE_IMAGE} AS runtime
ENV DEBIAN_FRONTEND=noninteractive
# tini is process 1: it passes signals to the command and reaps the processes Spark leaves.
# redis-server serves `materializer demo` and the run that trains the class data archive.
RUN mkdir -p /usr/share/man/man1 \
    && apt-get update \
    && apt-get install -y --no-install-recommends \
        ca-certificates openjdk-17-jre-headless procps redis-server tini \
    && rm -rf /var/lib/apt/lists/* /usr/share/doc /usr/share/man

RUN groupadd --gid 10001 materializer \
    && useradd --uid 10001 --gid 10001 --home-dir /home/materializer --create-home \
        --shell /usr/sbin/nologin materializer

ENV VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    MATERIALIZER_JARS_DIR=/opt/materializer/jvm/lib \
    SPARK_HOME=/opt/venv/lib/python3.11/site-packages/pyspark
COPY --from=build /opt/venv /opt/venv
# An installed package finds the resolved jars through MATERIALIZER_JARS_DIR (see
# materializer/jvm.py): spark/ and s3/ for the session, kafka/ for the demo's broker.
COPY --from=build /src/jvm/lib /opt/materializer/jvm/lib

# The driver's class data archive, trained by a run of its own broker and Redis, so a
# container's first `materializer run` starts with Spark's classes already loaded. A build
# step's host name may resolve to no address, so that run's Spark binds to the loopback.
RUN SPARK_LOCAL_IP=127.0.0.1 materializer jvm-archive \
    && rm -rf /tmp/* /root/.cache

USER 10001:10001
WORKDIR /home/materializer
ENTRYPOINT ["tini", "--"]
# The chart runs `materializer run -c ...` and `query-service serve -c ...` as arguments.
CMD ["materializer", "--help"]
