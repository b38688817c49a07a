"""What a process knows of the backbone without loading its model: the checkpoint's id and width
(read from its files), and the device and threads it runs with.

The master, rollout and optimizer processes need no forward, only these facts;
importing ``backbone.model`` would pull in transformers' image stack (measured
14-30 s of a restart on this machine under load), so they stop here. The id is
``<preset or folder name>@<sha256 of the checkpoint's weight and JSON files>``,
the same string ``Backbone.load`` gives.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import torch

__all__ = ["MINI_PRESET", "SPEC_FILE", "BackboneInfo", "describe", "fingerprint", "resolve_device",
           "set_torch_threads", "text_hidden_size"]

SPEC_FILE = "joynexus_backbone.json"
MINI_PRESET = "mini-pretrained"


@dataclass(frozen=True)
class BackboneInfo:
    """A backbone's id and width, and the device its tenants' modules live on."""

    backbone_id: str
    hidden_size: int
    device: torch.device


def resolve_device(device: str = "auto", dtype: str = "auto") -> tuple[torch.device, torch.dtype]:
    """CUDA + bf16 when present, else CPU + fp32 (unless told otherwise)."""
    dev = torch.device("cuda" if device == "auto" and torch.cuda.is_available() else
                       ("cpu" if device == "auto" else device))
    if dtype == "auto":
        return dev, torch.bfloat16 if dev.type == "cuda" else torch.float32
    return dev, getattr(torch, dtype)


def set_torch_threads(threads: int | None) -> None:
    """Pin torch's CPU threads. Several roles share few cores: oversubscribed OpenMP
    threads busy-wait and were measured to slow a step 50x (FINDINGS)."""
    if threads:
        torch.set_num_threads(threads)


def fingerprint(path: Path) -> str:
    digest = hashlib.sha256()
    for file in sorted(path.glob("*.safetensors")) + sorted(path.glob("*.json")):
        digest.update(file.name.encode())
        digest.update(file.read_bytes())
    return digest.hexdigest()[:16]


def text_hidden_size(config: dict) -> int:
    """The language model's width from a config.json (VLM configs nest it in ``text_config``)."""
    text = config.get("text_config") or {}
    return int(text.get("hidden_size") or config["hidden_size"])


def describe(name_or_path: str, root: str | Path, device: str = "auto") -> BackboneInfo:
    """The id and width of a local checkpoint or a preset, without loading it (a preset not built
    yet is built first: its id is a digest of the saved files)."""
    if name_or_path == MINI_PRESET:  # its id is a digest of weights that come from packages
        from backbone.model import Backbone

        return Backbone.mini_pretrained(device).info
    path = Path(name_or_path).expanduser()
    if not path.is_dir():
        from backbone.presets import get_preset, preset_dir

        path = preset_dir(root, get_preset(name_or_path))
        if not (path / SPEC_FILE).exists():
            from backbone.model import ensure_preset

            ensure_preset(name_or_path, root)
    config = json.loads((path / "config.json").read_text())
    spec_file = path / SPEC_FILE
    preset = json.loads(spec_file.read_text()).get("preset") if spec_file.exists() else None
    return BackboneInfo(f"{preset or path.name}@{fingerprint(path)}", text_hidden_size(config),
                        resolve_device(device)[0])
