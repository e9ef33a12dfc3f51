# Flink with PyFlink for docker-compose: the same Flink the native stack runs (the distribution
# inside the apache-flink wheel), the same config (stack/config/flink/config.yaml merged by
# infersight.stack.flink_config), the same jars (stack/pom.xml) and the infersight jobs.
FROM python:3.11-slim-bookworm
RUN apt-get update \
 && apt-get install -y --no-install-recommends openjdk-17-jdk-headless maven procps \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /opt/infersight
COPY pyproject.toml requirements.lock README.md ./
COPY infersight ./infersight
COPY schemas ./schemas
COPY instrumentation ./instrumentation
COPY collectors ./collectors
COPY flink_jobs ./flink_jobs
COPY simulator ./simulator
COPY dashboards ./dashboards
COPY stack ./stack
RUN pip install --no-cache-dir -c requirements.lock ".[pipeline]" \
 && INFERSIGHT_CACHE=/opt/infersight/cache infersight setup --only jars \
 && PYFLINK=$(python -c "import pyflink, os; print(os.path.dirname(pyflink.__file__))") \
 && cp "$PYFLINK"/opt/flink-python-*.jar "$PYFLINK"/lib/
# ^ flink-python (pemja) on the cluster's classpath: every thread-mode job after the first needs it
#   there (see infersight.stack.components.StackLayout.flink_lib_dir).
ENV INFERSIGHT_CACHE=/opt/infersight/cache
ENTRYPOINT ["infersight", "flink-node"]
CMD ["jobmanager"]
