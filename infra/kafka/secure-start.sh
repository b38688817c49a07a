#!/usr/bin/env bash
# The secure profile of infra/docker-compose.yml: the same configuration `joynexus broker up
# --secure` writes (infra/broker.py), for the apache/kafka image. SASL_PLAINTEXT + SCRAM-SHA-512
# for clients and between brokers, SASL/PLAIN on the controller listener (KRaft controllers
# cannot check SCRAM: the credentials live in the metadata log they serve), StandardAuthorizer,
# the admin as the only super user. The admin's SCRAM credential is written into the storage at
# format time (--add-scram): nobody could create it later. The passwords come from the
# environment (JOYNEXUS_ADMIN_PASSWORD) and are never echoed.
set -euo pipefail
: "${JOYNEXUS_ADMIN_PASSWORD:?set JOYNEXUS_ADMIN_PASSWORD}"
ADMIN="${JOYNEXUS_ADMIN_USERNAME:-admin}"
KAFKA_HOME="${KAFKA_HOME:-/opt/kafka}"
DATA="${KAFKA_DATA:-/var/lib/kafka/data}"
CONF="${KAFKA_SECURE_CONFIG:-/tmp/joynexus-secure/server.properties}"
HOST_PORT="${KAFKA_HOST_PORT:-9092}"
HOST_NAME="${KAFKA_ADVERTISED_HOST:-localhost}"
SELF="${KAFKA_SELF_HOST:-kafka-secure}"   # this container's name on the compose network
DOCKER_PORT="${KAFKA_DOCKER_PORT:-29092}"
CONTROLLER_PORT="${KAFKA_CONTROLLER_PORT:-9093}"
mkdir -p "$(dirname "$CONF")"
umask 077  # the file holds the admin password
SCRAM=org.apache.kafka.common.security.scram.ScramLoginModule
PLAIN=org.apache.kafka.common.security.plain.PlainLoginModule
cat > "$CONF" <<PROPS
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@${SELF}:${CONTROLLER_PORT}
listeners=HOST://:${HOST_PORT},DOCKER://:${DOCKER_PORT},CONTROLLER://:${CONTROLLER_PORT}
advertised.listeners=HOST://${HOST_NAME}:${HOST_PORT},DOCKER://${SELF}:${DOCKER_PORT}
listener.security.protocol.map=HOST:SASL_PLAINTEXT,DOCKER:SASL_PLAINTEXT,CONTROLLER:SASL_PLAINTEXT
inter.broker.listener.name=DOCKER
controller.listener.names=CONTROLLER
sasl.enabled.mechanisms=SCRAM-SHA-512
sasl.mechanism.inter.broker.protocol=SCRAM-SHA-512
listener.name.docker.scram-sha-512.sasl.jaas.config=${SCRAM} required username="${ADMIN}" password="${JOYNEXUS_ADMIN_PASSWORD}";
listener.name.host.scram-sha-512.sasl.jaas.config=${SCRAM} required;
sasl.mechanism.controller.protocol=PLAIN
listener.name.controller.sasl.enabled.mechanisms=PLAIN
listener.name.controller.plain.sasl.jaas.config=${PLAIN} required username="${ADMIN}" password="${JOYNEXUS_ADMIN_PASSWORD}" user_${ADMIN}="${JOYNEXUS_ADMIN_PASSWORD}";
authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer
super.users=User:${ADMIN}
allow.everyone.if.no.acl.found=false
log.dirs=${DATA}
num.partitions=3
offsets.topic.replication.factor=1
offsets.topic.num.partitions=10
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=10
group.initial.rebalance.delay.ms=0
auto.create.topics.enable=false
message.max.bytes=8388608
PROPS
if [ ! -f "${DATA}/meta.properties" ]; then
  # once, inside the container: the only place the cleartext is an argument
  "${KAFKA_HOME}/bin/kafka-storage.sh" format --ignore-formatted -t "${CLUSTER_ID:?set CLUSTER_ID}" \
    -c "$CONF" --add-scram "SCRAM-SHA-512=[name=${ADMIN},password=${JOYNEXUS_ADMIN_PASSWORD}]" > /dev/null
fi
exec "${KAFKA_HOME}/bin/kafka-server-start.sh" "$CONF"
