# syntax=docker/dockerfile:1
#
# The Materializer image: `materializer run` (the Spark driver, and its executors in
# driver.mode kubernetes) and `query-service serve`, as the Helm chart in helm/ runs them.
#
#   docker build -t materializer:0.1.0 .
#
# What the build needs: a Docker engine with BuildKit (the default since Docker 23) and
# network access to Debian's package mirrors, PyPI and Maven Central (the JVM jars are
# resolved by `make jars` from jvm/pom.xml). Nothing is downloaded when a container starts.
# The tag should match the chart's appVersion (helm/materializer/Chart.yaml), or set
# image.tag in the chart's values.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# --- build: resolve the JVM jars into jvm/lib and build the wheel --------------------------
FROM ${PYTHON_IMAGE} AS build
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        openjdk-17-jdk-headless maven make \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src

# The jars first: they change far less often than the code, so this layer stays cached.
COPY Makefile ./
COPY jvm/pom.xml jvm/settings.xml jvm/
COPY jvm/spark/pom.xml jvm/spark/
COPY jvm/kafka/pom.xml jvm/kafka/
COPY jvm/registry/pom.xml jvm/registry/
COPY jvm/s3/pom.xml jvm/s3/
COPY jvm/s3proxy/pom.xml jvm/s3proxy/
# The S3 server (jvm/s3proxy) serves the tests only; the schema registry (jvm/registry)
# the tests and `materializer demo --schema-registry` in a checkout.
RUN make jars JVM_MODULES=spark,kafka,s3

COPY pyproject.toml README.md ./
COPY materializer/ materializer/
COPY query_service/ query_service/
RUN python -m pip wheel --no-cache-dir --no-deps --wheel-dir /dist .

# --- runtime: Python 3.11, a Java 17 JRE, the package in /opt/venv, the jars beside it -----
FROM ${PYTHON_IMAGE} AS runtime
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        openjdk-17-jre-headless procps \
    && rm -rf /var/lib/apt/lists/*

RUN groupadd --gid 10001 materializer \
    && useradd --uid 10001 --gid 10001 --home-dir /home/materializer --create-home \
        --shell /usr/sbin/nologin materializer

ENV VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
COPY --from=build /dist/*.whl /tmp/wheels/
# grpcio-tools (pinned like the dev extra) compiles .proto schemas that a schema registry
# serves as source, for protobuf maps with schema_registry_url.
RUN python -m venv /opt/venv \
    && pip install --no-cache-dir /tmp/wheels/*.whl "grpcio-tools==1.85.1" \
    && rm -rf /tmp/wheels

# An installed package finds the resolved jars through MATERIALIZER_JARS_DIR (see
# materializer/jvm.py): spark/ for the session, kafka/ for the embedded broker of the demo.
COPY --from=build /src/jvm/lib /opt/materializer/jvm/lib
ENV MATERIALIZER_JARS_DIR=/opt/materializer/jvm/lib \
    SPARK_HOME=/opt/venv/lib/python3.11/site-packages/pyspark

USER 10001:10001
WORKDIR /home/materializer
# The chart runs `materializer run -c ...` and `query-service serve -c ...` as commands.
ENTRYPOINT ["materializer"]
CMD ["--help"]
