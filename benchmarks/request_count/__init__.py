"""Kafka requests per process kind, counted by ``sitecustomize.py`` in this folder (see there)."""
