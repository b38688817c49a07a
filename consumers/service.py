"""What the roles of one process share: the backbone (resident, or only described), its device
gate, its feature cache, the policy store, the tensor store and the job book.

A device host (inference + backbone-train) and the evaluator run forwards, so they load the
backbone; the master and the optimizer hosts only need its id, width and device
(``BackboneInfo``), so a process that hosts only them never loads the weights: on a GPU that
would be a second copy of the backbone per process. The feature cache (``backbone/feature_cache.py``)
belongs to the resident backbone: in a device host, inference puts the features it computed
when acting and backbone-train reuses them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from backbone.gate import DeviceGate
from backbone.info import BackboneInfo, describe, set_torch_threads
from infra import reproducible
from infra.jobbook import JobBook
from infra.logging import get_logger
from infra.settings import Settings
from infra.tensor_store import TensorStore
from tenants.policy_store import PolicyStore

if TYPE_CHECKING:
    from backbone.feature_cache import FeatureCache
    from backbone.model import Backbone

__all__ = ["Service", "describe_backbone", "load_backbone"]

log = get_logger("consumers.service")


def load_backbone(settings: Settings) -> Backbone:
    """The backbone ``settings.backbone`` names: a local HF checkpoint dir or a preset."""
    from backbone.model import Backbone  # transformers and its image stack: only where forwards run

    set_torch_threads(settings.torch_threads)
    if why := reproducible.check():
        log.warning("grouped forwards may differ from alone", reason=why)
    path = Path(settings.backbone).expanduser()
    if path.is_dir():
        return Backbone.load(path, settings.device, settings.dtype)
    return Backbone.from_preset(settings.backbone, settings.model_dir, settings.device, settings.dtype)


def describe_backbone(settings: Settings) -> BackboneInfo:
    set_torch_threads(settings.torch_threads)
    return describe(settings.backbone, settings.model_dir, settings.device)


@dataclass
class Service:
    settings: Settings
    info: BackboneInfo
    store: PolicyStore
    book: JobBook
    tensors: TensorStore
    resident: Backbone | None = None
    gate: DeviceGate = field(default_factory=DeviceGate)
    features: FeatureCache | None = None  # with the resident backbone only

    @property
    def backbone(self) -> Backbone:
        if self.resident is None:
            raise RuntimeError("this process did not load the backbone (Service.open(load=False))")
        return self.resident

    @classmethod
    async def open(cls, settings: Settings, backbone: Backbone | None = None, *,
                   load: bool = True) -> Service:
        book = JobBook(settings, settle_s=settings.read_model_settle_ms / 1000)
        await book.start()
        tensors = TensorStore(settings.tensor_dir, settings.tensor_inline_max_bytes)
        if backbone is None and load:
            backbone = load_backbone(settings)
        info = backbone.info if backbone is not None else describe_backbone(settings)
        budget = settings.train_forward_budget_ms
        starve = settings.train_max_wait_ms
        gate = DeviceGate(train_budget_s=None if budget is None else budget / 1000.0,
                          train_max_wait_s=None if starve is None else starve / 1000.0)
        features = None
        if backbone is not None:
            from backbone.feature_cache import FeatureCache

            features = FeatureCache(backbone.backbone_id, int(settings.train_feature_cache_mb * 2**20),
                                    per_tenant=settings.feature_cache_scope == "tenant")
        return cls(settings, info, PolicyStore(settings.policy_dir), book, tensors, backbone, gate, features)

    async def close(self) -> None:
        await self.book.stop()
