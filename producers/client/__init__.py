"""The tenant side: job specs (``spec.py``) and the client that submits and follows them (``sdk.py``)."""

from infra.lazy import lazy_getattr

__all__ = ["Client", "JobHandle", "JobSpec", "JobSpecInvalid"]

__getattr__ = lazy_getattr(__name__, {"Client": "producers.client.sdk", "JobHandle": "producers.client.sdk",
                                      "JobSpec": "producers.client.spec",
                                      "JobSpecInvalid": "producers.client.spec"})
