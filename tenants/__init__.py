"""Tenant-private state: action modules, adapters, optimizer slots, checkpoints, the policy store.

No Kafka here.
"""
