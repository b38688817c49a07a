"""Tenant-private state: action modules, adapters, optimizer slots, checkpoints and the policy store (no Kafka)."""
