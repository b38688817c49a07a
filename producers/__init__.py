"""Everything that publishes events: the producer wrapper and, later, the tenant SDK and feeders."""

from producers.producer import EventProducer

__all__ = ["EventProducer"]
