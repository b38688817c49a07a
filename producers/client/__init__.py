"""The tenant side: the client that submits and follows jobs (``sdk.py``); the job spec it sends is
``schemas/jobspec.py``, re-exported here for convenience."""

from infra.lazy import lazy_getattr

__all__ = ["Client", "JobHandle", "JobSpec", "JobSpecInvalid"]

__getattr__ = lazy_getattr(__name__, {"Client": "producers.client.sdk", "JobHandle": "producers.client.sdk",
                                      "JobSpec": "schemas.jobspec",
                                      "JobSpecInvalid": "schemas.jobspec"})
