"""Running joynexus: the local Kafka broker, topic provisioning, settings, logging, errors and the CLI."""

from infra import reproducible

reproducible.ensure()  # before any tensor math in this process or its children
