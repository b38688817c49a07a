"""What the roles of one process share: the resident backbone, its device gate, the policy store
and the job book. ``joynexus up`` builds one and hands it to every role; ``joynexus run ROLE``
builds one for its single role."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from backbone.gate import DeviceGate
from backbone.model import Backbone, set_torch_threads
from infra.jobbook import JobBook
from infra.settings import Settings
from infra.tensor_store import TensorStore
from tenants.policy_store import PolicyStore

__all__ = ["Service", "load_backbone"]


def load_backbone(settings: Settings) -> Backbone:
    """The backbone ``settings.backbone`` names: a local HF checkpoint dir or a preset."""
    set_torch_threads(settings.torch_threads)
    path = Path(settings.backbone).expanduser()
    if path.is_dir():
        return Backbone.load(path, settings.device, settings.dtype)
    return Backbone.from_preset(settings.backbone, settings.model_dir, settings.device, settings.dtype)


@dataclass
class Service:
    settings: Settings
    backbone: Backbone
    store: PolicyStore
    book: JobBook
    tensors: TensorStore
    gate: DeviceGate = field(default_factory=DeviceGate)

    @classmethod
    async def open(cls, settings: Settings, backbone: Backbone | None = None) -> Service:
        book = JobBook(settings)
        await book.start()
        tensors = TensorStore(settings.tensor_dir, settings.tensor_inline_max_bytes)
        backbone = backbone or load_backbone(settings)
        return cls(settings, backbone, PolicyStore(settings.policy_dir), book, tensors)

    async def close(self) -> None:
        await self.book.stop()
