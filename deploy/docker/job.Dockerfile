# The Flink jobs' image for the chart's FlinkDeployments (deploy/helm/infersight-global): the official Flink
# image of the version the apache-flink wheel carries, Python 3.11 (uv's standalone build: the base image's
# Ubuntu ships another Python), the locked wheels, the jobs' jars in /opt/flink/usrlib, and flink-python in
# lib/ (thread-mode jobs after the first need it on the cluster's classpath, as in stack/docker/flink.Dockerfile),
# and the OpenTelemetry metric reporter plugin the native stack's Flink uses (stack/flink_config.py).
# Build from the repository root: docker build -f deploy/docker/job.Dockerfile -t <registry>/flink-jobs:<tag> .
# Versions here are checked against requirements.lock, bin/infersight and stack/pom.xml by tests/unit/test_deploy_images.py.
FROM ghcr.io/astral-sh/uv:0.13.8 AS uv

FROM flink:2.2.1-scala_2.12-java17
COPY --from=uv /uv /usr/local/bin/uv
USER root
RUN apt-get update \
 && apt-get install -y --no-install-recommends maven openjdk-17-jdk-headless \
 && rm -rf /var/lib/apt/lists/*
ENV UV_PYTHON_INSTALL_DIR=/opt/python VIRTUAL_ENV=/opt/venv PATH=/opt/venv/bin:$PATH
WORKDIR /opt/infersight
COPY pyproject.toml requirements.lock README.md ./
COPY requirements ./requirements
COPY infersight ./infersight
COPY schemas ./schemas
COPY instrumentation ./instrumentation
COPY collectors ./collectors
COPY flink_jobs ./flink_jobs
COPY simulator ./simulator
COPY dashboards ./dashboards
COPY stack ./stack
RUN uv python install 3.11 \
 && uv venv /opt/venv --python 3.11 \
 && uv pip install -p /opt/venv/bin/python -c requirements.lock --override requirements/overrides.txt ".[pipeline]" \
 && ln -sf /opt/venv/bin/python /usr/local/bin/python3 \
 && INFERSIGHT_CACHE=/opt/infersight/cache infersight setup --only jars \
 && mkdir -p /opt/flink/usrlib \
 && cp /opt/infersight/cache/jars/flink/*.jar /opt/flink/usrlib/ \
 && rm -rf /opt/infersight/cache/m2 \
 && cp /opt/flink/opt/flink-python-*.jar /opt/flink/lib/ \
 && mkdir -p /opt/flink/plugins/metrics-otel \
 && cp /opt/flink/opt/flink-metrics-otel-*.jar /opt/flink/plugins/metrics-otel/ \
 && chown -R flink:flink /opt/flink/usrlib
USER flink
