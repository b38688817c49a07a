"""Running joynexus: the local Kafka broker, topic provisioning, settings, logging, errors and the CLI."""
