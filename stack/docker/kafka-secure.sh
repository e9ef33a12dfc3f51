#!/usr/bin/env bash
# Kafka for docker-compose.tls.yml: the apache/kafka image with its client listeners on SASL_SSL (TLS + SCRAM)
# and the SCRAM user created when the storage is formatted, as the native stack does
# (infersight.stack.security.TransportSecurity.broker_overrides). It writes server.properties itself (the
# project's stack/config/kafka/server.properties plus the lines below) instead of the image's KAFKA_* rendering,
# which asks for JKS keystores with passwords where Kafka's PEM keystore takes none.
# Environment: CLUSTER_ID, INFERSIGHT_KAFKA_SASL_USER, INFERSIGHT_KAFKA_SASL_PASSWORD,
# INFERSIGHT_KAFKA_SASL_MECHANISM (SCRAM-SHA-512 or SCRAM-SHA-256); PEM files in /etc/infersight/tls
# (server.pem, server-key.pem: unencrypted PKCS#8, readable by this container's user; ca.pem).
set -euo pipefail
: "${CLUSTER_ID:?}" "${INFERSIGHT_KAFKA_SASL_USER:?}" "${INFERSIGHT_KAFKA_SASL_PASSWORD:?}"
mechanism="${INFERSIGHT_KAFKA_SASL_MECHANISM:-SCRAM-SHA-512}"
tls=/etc/infersight/tls
work=/tmp/infersight-kafka
umask 077
mkdir -p "$work"
cat "$tls/server-key.pem" "$tls/server.pem" > "$work/keystore.pem"
jaas="org.apache.kafka.common.security.scram.ScramLoginModule required username=\"$INFERSIGHT_KAFKA_SASL_USER\" password=\"$INFERSIGHT_KAFKA_SASL_PASSWORD\";"
lower=$(echo "$mechanism" | tr '[:upper:]' '[:lower:]')
{
  cat /mnt/shared/config/server.properties
  cat <<EOF

# docker-compose.tls.yml: every client listener is SASL_SSL; the controller listens on the container's loopback only
log.dirs=/var/lib/kafka/data
listeners=INTERNAL://:19092,EXTERNAL://:9092,CONTROLLER://127.0.0.1:9093
advertised.listeners=INTERNAL://kafka:19092,EXTERNAL://127.0.0.1:9092
listener.security.protocol.map=CONTROLLER:PLAINTEXT,INTERNAL:SASL_SSL,EXTERNAL:SASL_SSL
inter.broker.listener.name=INTERNAL
controller.quorum.voters=1@127.0.0.1:9093
sasl.enabled.mechanisms=$mechanism
sasl.mechanism.inter.broker.protocol=$mechanism
listener.name.internal.$lower.sasl.jaas.config=$jaas
listener.name.external.$lower.sasl.jaas.config=$jaas
ssl.keystore.type=PEM
ssl.keystore.location=$work/keystore.pem
ssl.truststore.type=PEM
ssl.truststore.location=$tls/ca.pem
ssl.client.auth=none
EOF
} > "$work/server.properties"
# The health check's client (kafka-broker-api-versions.sh --command-config).
cat > "$work/client.properties" <<EOF
security.protocol=SASL_SSL
sasl.mechanism=$mechanism
sasl.jaas.config=$jaas
ssl.truststore.type=PEM
ssl.truststore.location=$tls/ca.pem
EOF
if [ ! -f /var/lib/kafka/data/meta.properties ]; then
  # Transactions V1, as the native stack (stack/components.py): Flink's Kafka connector 5.0 needs it.
  /opt/kafka/bin/kafka-storage.sh format --cluster-id="$CLUSTER_ID" -c "$work/server.properties" \
    --feature transaction.version=1 \
    --add-scram "$mechanism=[name=$INFERSIGHT_KAFKA_SASL_USER,password=$INFERSIGHT_KAFKA_SASL_PASSWORD]"
fi
exec /opt/kafka/bin/kafka-server-start.sh "$work/server.properties"
