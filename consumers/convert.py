"""Where events meet compute: observations and gradient jobs into backbone requests, features and
targets into FeatureBatch tensors and back. Copies and reshapes only, no math.

A FeatureBatch carries ``pooled`` and ``proprio`` always and the token states
(``sequence``, ``attention_mask``) only when the tenant's modules read them
(a policy suffix): for a pooled-feature head they would be most of the bytes
and never used. Without them, ``to_feature`` gives a one-token sequence
holding the pooled vector, which is all such a head looks at.
"""

from __future__ import annotations

import numpy as np
import torch

from backbone.feature import VLAFeature
from backbone.inputs import VLARequest
from infra.errors import DecodeError
from schemas import events as ev
from schemas.tensors import from_numpy, to_numpy
from tenants.targets import PPOTargets, SFTTargets, Targets

__all__ = [
    "feature_tensors",
    "gradient_job_requests",
    "observation_request",
    "targets_of",
    "to_feature",
    "torch_of",
]


def torch_of(tensor: ev.Tensor) -> torch.Tensor:
    return torch.from_numpy(to_numpy(tensor).copy())


def _images(array: np.ndarray) -> list[np.ndarray]:
    # one HxWx3 image per camera; a single image may come without the camera axis
    return [array] if array.ndim == 3 else list(array)


def observation_request(obs: ev.Observation, state_in_proprio: bool) -> VLARequest:
    if obs.image is None:
        raise DecodeError("the observation has no image; the backbone needs one")
    proprio = to_numpy(obs.proprio).astype(np.float32) if obs.proprio is not None else np.zeros(0, np.float32)
    if state_in_proprio:
        if obs.state is None:
            raise DecodeError("the session asks for state in proprio but the observation has no state")
        proprio = np.concatenate([proprio, to_numpy(obs.state).astype(np.float32)])
    return VLARequest(obs.tenant_id or "", _images(to_numpy(obs.image)), obs.instruction, proprio)


def gradient_job_requests(job: ev.GradientJob) -> list[VLARequest]:
    if job.images is None:
        raise DecodeError("the gradient job has no images; the backbone needs them")
    images = to_numpy(job.images)
    proprio = to_numpy(job.proprio) if job.proprio is not None else np.zeros((len(images), 0), np.float32)
    if not len(images) == len(proprio) == len(job.instructions):
        raise DecodeError(
            f"gradient job {job.batch_id}: {len(images)} images, {len(proprio)} proprio rows, "
            f"{len(job.instructions)} instructions"
        )
    return [
        VLARequest(
            job.tenant_id or "", _images(images[i]), job.instructions[i], proprio[i].astype(np.float32)
        )
        for i in range(len(images))
    ]


def feature_tensors(feature: VLAFeature, needs_sequence: bool) -> dict[str, ev.Tensor]:
    out = {"pooled": feature.pooled, "proprio": feature.proprio, "task_id": feature.task_id}
    if needs_sequence:
        out |= {"sequence": feature.sequence, "attention_mask": feature.attention_mask}
    return {name: from_numpy(t.detach().cpu().numpy()) for name, t in out.items()}


def to_feature(tensors: dict[str, ev.Tensor]) -> VLAFeature:
    try:
        pooled, proprio, task_id = (torch_of(tensors[n]) for n in ("pooled", "proprio", "task_id"))
    except KeyError as exc:
        raise DecodeError(f"feature batch lacks {exc}") from None
    if "sequence" in tensors:
        sequence, mask = torch_of(tensors["sequence"]), torch_of(tensors["attention_mask"])
    else:
        sequence, mask = pooled.unsqueeze(1), torch.ones(pooled.shape[0], 1, dtype=torch.bool)
    return VLAFeature(sequence, mask, pooled, proprio, task_id)


def targets_of(targets: dict[str, ev.Tensor]) -> Targets:
    """PPO targets when the rollout role computed advantages, else SFT action chunks."""
    if "advantages" in targets:
        try:
            return PPOTargets(
                *(torch_of(targets[n]).float() for n in ("actions", "old_log_probs", "advantages", "returns"))
            )
        except KeyError as exc:
            raise DecodeError(f"PPO targets lack {exc}") from None
    if "actions" not in targets:
        raise DecodeError("targets lack 'actions'")
    return SFTTargets(torch_of(targets["actions"]).float())
