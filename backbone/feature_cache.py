"""Features by content: a frozen backbone's output for an input, computed once and reused.

The backbone is frozen, so a row's feature is a pure function of (backbone id,
prepared input): the same image and instruction tokens give the same hidden
states, whatever else shares the forward (``backbone/grouped.py``). PPO sends
the same observations again in every epoch and SFT the same demonstrations in
every dataset epoch; with this cache each distinct input is forwarded once
while it stays cached. In a device host, inference puts the features it
computed when acting into the same cache (``Service.features``), so RL
training finds the rollout's observations already there.

Keys are sha256 digests of the backbone id and of the RAW request's forward
inputs: every camera image (dtype, shape, bytes) and the instruction. Preparing
a request (resize, normalise, patchify, tokenise, pad: ``Backbone.prepare``) is
a deterministic function of these and of the backbone the id names, so equal
raw inputs give equal prepared inputs and the same bits; and a hit needs no
preparing at all (on the CPU device host, preparing took about four times the
CPU of the forwards it fed, 2026-12-01, py-spy). Proprio and task id are not
forward inputs and come from the request each time. With
``per_tenant`` the tenant is part of the key too: a tenant's hits come from its
own inputs only, so no tenant can tell from its step times what another sent,
and a tenant costs the device what it would cost alone (the service's default,
``feature_cache_scope``; without it identical inputs of different tenants share
one entry). Entries
are evicted least recently used beyond ``max_bytes`` (a stored entry is a copy
of its row, so the bound counts what is held). A hit returns the bits the
forward computed for that row, which are the bits any forward of the same
bucket computes for it, alone or in any group (``backbone/grouped.py``;
tested across the inference and training paths), so a process that restarts
with an empty cache computes the same features again.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict

import numpy as np
import torch

from backbone.feature import VLAFeature
from backbone.inputs import InvalidRequest, Prepared, VLARequest, proprio_tensor

__all__ = ["FeatureCache", "for_request"]


def for_request(feature: VLAFeature, p: Prepared) -> VLAFeature:
    """``feature``'s backbone outputs with ``p``'s own proprio and task id (not forward inputs)."""
    return VLAFeature(feature.sequence, feature.attention_mask, feature.pooled, p.proprio.unsqueeze(0),
                      torch.tensor([p.task_id]))


class FeatureCache:
    def __init__(self, backbone_id: str, max_bytes: int, per_tenant: bool = False):
        self.backbone_id = backbone_id
        self.per_tenant = per_tenant
        self.max_bytes = max_bytes
        self._entries: OrderedDict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = OrderedDict()
        self.bytes = 0
        self.hits = 0
        self.misses = 0

    def key(self, request: VLARequest) -> str:
        """The digest of ``request``'s forward inputs (InvalidRequest if its images are not arrays)."""
        digest = hashlib.sha256(self.backbone_id.encode())
        images = request.images if isinstance(request.images, (list, tuple)) else [request.images]
        for image in images:
            if not isinstance(image, np.ndarray):
                raise InvalidRequest(f"an image is a {type(image).__name__}, not an array")
            digest.update(f"image:{image.dtype.str}{image.shape}".encode())
            digest.update(np.ascontiguousarray(image).tobytes())
        digest.update(b"text:" + str(request.instruction).encode())
        if self.per_tenant:
            digest.update(b"tenant:" + request.tenant.encode())
        return digest.hexdigest()

    def get(self, key: str, request: VLARequest) -> VLAFeature | None:
        """The cached feature of ``key`` with ``request``'s own proprio and task id, or None."""
        entry = self._entries.get(key)
        if entry is None:
            self.misses += 1
            return None
        self._entries.move_to_end(key)
        self.hits += 1
        sequence, mask, pooled = entry
        return VLAFeature(sequence, mask, pooled, proprio_tensor(request.proprio).unsqueeze(0),
                          torch.tensor([int(request.task_id)]))

    def put(self, key: str, feature: VLAFeature) -> None:
        if key in self._entries or self.max_bytes <= 0:
            return
        # a row of a group's output is a view that keeps the whole group's tensor alive: copy it
        entry = (feature.sequence.clone(), feature.attention_mask.clone(), feature.pooled.clone())
        size = sum(t.numel() * t.element_size() for t in entry)
        if size > self.max_bytes:
            return
        self._entries[key] = entry
        self.bytes += size
        while self.bytes > self.max_bytes:
            _, old = self._entries.popitem(last=False)
            self.bytes -= sum(t.numel() * t.element_size() for t in old)

    def __len__(self) -> int:
        return len(self._entries)
