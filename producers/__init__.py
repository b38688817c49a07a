"""Everything that publishes events: the producer wrapper (``producer``), heartbeats
(``heartbeat``), offline datasets and their feeder (``dataset/``), and the tenant client
(``client/``) that submits and follows jobs.

Names are imported lazily, so ``producers.dataset`` (reading/writing datasets) does not
pull in aiokafka.
"""

from infra.lazy import lazy_getattr

_EXPORTS = {"EventProducer": "producers.producer"}

__all__ = sorted(_EXPORTS)

__getattr__ = lazy_getattr("producers", _EXPORTS)
