"""The shared backbone: ONE frozen VLM, resident, read-only for every tenant.

``Backbone.load(path)`` takes any local Hugging Face checkpoint directory of a
supported family; ``Backbone.from_preset(name, root)`` builds a preset with
random weights once (seeded), saves it with ``save_pretrained`` under ``root``
and loads it back through the same path. Parameters are frozen and the model
is in eval() (BatchNorm-style layers must never see train mode: grouped and
separate forwards would differ). ``prepare`` normalises one request;
``forward`` runs one group of requests of the same bucket and returns one
VLAFeature per request, in order.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from transformers import AutoConfig, AutoImageProcessor, AutoModelForImageTextToText, AutoTokenizer
from transformers.utils import logging as hf_logging

from backbone.families import Family, family_for
from backbone.feature import VLAFeature
from backbone.info import MINI_PRESET, SPEC_FILE, BackboneInfo, fingerprint, resolve_device
from backbone.inputs import BucketKey, InvalidRequest, Prepared, VLARequest, proprio_tensor, resize_images
from backbone.mini import IMAGE_SIZE as MINI_IMAGE_SIZE
from backbone.mini import MiniFamily, MiniVLM
from backbone.presets import Preset, SpecialTokens, get_preset, hf_config, preset_dir
from backbone.tokenizer import build_tokenizer
from infra.errors import ConfigError
from infra.logging import get_logger
from infra.reproducible import seeded

__all__ = [
    "Backbone",
    "BackboneSpec",
    "build_preset",
    "ensure_preset",
    "preset_parameters",
]

log = get_logger("backbone.model")
hf_logging.disable_progress_bar()  # shard-loading bars would interleave with JSON logs
hf_logging.set_verbosity_error()


@dataclass(frozen=True)
class BackboneSpec:
    """What joynexus needs to know beyond the HF config; saved beside the checkpoint."""

    family: str
    image_size: int
    max_cameras: int = 3
    token_buckets: tuple[int, ...] = (8, 16, 32, 64)
    preset: str | None = None
    tokens: SpecialTokens = SpecialTokens()


def _read_spec(path: Path, config, tokenizer) -> BackboneSpec:
    spec_file = path / SPEC_FILE
    if spec_file.exists():
        raw = json.loads(spec_file.read_text())
        raw["token_buckets"] = tuple(raw["token_buckets"])
        raw["tokens"] = SpecialTokens(**raw["tokens"])
        return BackboneSpec(**raw)
    # A foreign checkpoint: its own special-token ids (text ones from the tokenizer, which
    # owns them; multimodal ones from the config), its vision tower's native resolution.
    def token(*names: str, default: int) -> int:
        for source in (tokenizer, config):
            for name in names:
                value = getattr(source, name, None)
                if isinstance(value, int):
                    return value
        return default

    defaults = SpecialTokens()
    tokens = SpecialTokens(
        pad=token("pad_token_id", default=defaults.pad), bos=token("bos_token_id", default=defaults.bos),
        eos=token("eos_token_id", default=defaults.eos),
        image=token("image_token_id", "image_token_index", default=defaults.image),
        vision_start=token("vision_start_token_id", default=defaults.vision_start),
        vision_end=token("vision_end_token_id", default=defaults.vision_end),
    )
    vision = getattr(config, "vision_config", None)
    size = getattr(vision, "image_size", None) or 224
    return BackboneSpec(family=config.model_type, image_size=int(size), tokens=tokens)


INSTRUCTION_CACHE_ENTRIES = 4096


class Backbone:
    """A frozen VLM with its tokenizer and image processor."""

    def __init__(self, model, tokenizer, family: Family, spec: BackboneSpec, backbone_id: str):
        self.model = model
        self.tokenizer = tokenizer
        self.family = family
        self.spec = spec
        self.backbone_id = backbone_id
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self._instruction_ids: dict[str, tuple[int, ...]] = {}
        model.eval()
        for p in model.parameters():
            p.requires_grad_(False)

    # ------------------------------------------------------------ loading
    @classmethod
    def load(cls, path: str | Path, device: str = "auto", dtype: str = "auto") -> Backbone:
        path = Path(path)
        if not (path / "config.json").exists():
            raise ConfigError(f"{path} is not a Hugging Face checkpoint directory (no config.json)")
        config = AutoConfig.from_pretrained(path, local_files_only=True)
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        spec = _read_spec(path, config, tokenizer)
        family_cls = family_for(spec.family)
        dev, dt = resolve_device(device, dtype)
        model = AutoModelForImageTextToText.from_pretrained(path, local_files_only=True, dtype=dt)
        model.to(dev)
        processor = AutoImageProcessor.from_pretrained(path, local_files_only=True)
        patch = getattr(config.vision_config, "patch_size", 14)
        family = family_cls(processor, spec.tokens, patch)
        backbone_id = f"{spec.preset or path.name}@{fingerprint(path)}"
        log.info("backbone loaded", path=str(path), family=spec.family, device=str(dev),
                 dtype=str(dt), parameters=sum(p.numel() for p in model.parameters()),
                 backbone_id=backbone_id)
        return cls(model, tokenizer, family, spec, backbone_id)

    @classmethod
    def from_preset(cls, name: str, root: str | Path, device: str = "auto",
                    dtype: str = "auto") -> Backbone:
        if name == MINI_PRESET:
            return cls.mini_pretrained(device, dtype)
        return cls.load(ensure_preset(name, root), device, dtype)

    @classmethod
    def mini_pretrained(cls, device: str = "auto", dtype: str = "auto") -> Backbone:
        """EfficientNet-Lite0 + MiniLM with their real weights, straight from their packages."""
        model, tokenizer = MiniVLM.from_packages()
        dev, dt = resolve_device(device, dtype)
        model.to(dev, dt)
        spec = BackboneSpec(family="mini", image_size=MINI_IMAGE_SIZE, preset=MINI_PRESET)
        digest = hashlib.sha256(model.projection.cpu().numpy().tobytes()).hexdigest()[:16]
        log.info("backbone loaded", preset=MINI_PRESET, device=str(dev), dtype=str(dt),
                 parameters=sum(p.numel() for p in model.parameters()))
        return cls(model, tokenizer, MiniFamily(tokenizer), spec, f"{MINI_PRESET}@{digest}")

    @property
    def hidden_size(self) -> int:
        config = self.model.config
        return (config.get_text_config() if hasattr(config, "get_text_config") else config).hidden_size

    @property
    def info(self) -> BackboneInfo:
        return BackboneInfo(self.backbone_id, self.hidden_size, self.device)

    # ------------------------------------------------------------ requests
    def prepare(self, request: VLARequest) -> Prepared:
        """Validate and normalise one request. Raises InvalidRequest for it alone."""
        spec = self.spec
        images = resize_images(request.images, spec.image_size, spec.max_cameras)
        if not isinstance(request.instruction, str):
            raise InvalidRequest("instruction must be a string")
        ids = list(self._tokenize(request.instruction))
        pixels = self.family.pixels(images)
        row, mask = self.family.layout(pixels, ids, spec.token_buckets)
        return Prepared(
            tenant=request.tenant, key=BucketKey(len(images), len(row)), pixels=pixels,
            input_ids=torch.tensor(row, dtype=torch.long), attention_mask=torch.tensor(mask),
            proprio=proprio_tensor(request.proprio), task_id=int(request.task_id),
        )

    def _tokenize(self, instruction: str) -> tuple[int, ...]:
        """Token ids of an instruction, remembered: a session sends the same instruction every step,
        and tokenising was a fifth of preparing a request. Bounded; threads may race to fill an
        entry, with the same value."""
        ids = self._instruction_ids.get(instruction)
        if ids is None:
            if len(self._instruction_ids) >= INSTRUCTION_CACHE_ENTRIES:
                self._instruction_ids.clear()
            ids = tuple(self.tokenizer(instruction, add_special_tokens=False)["input_ids"])
            self._instruction_ids[instruction] = ids
        return ids

    @torch.no_grad()
    def forward(self, group: Sequence[Prepared]) -> list[VLAFeature]:
        """ONE backbone forward for a group of one bucket; one VLAFeature per request."""
        if not group:
            return []
        keys = {p.key for p in group}
        if len(keys) != 1:
            raise ValueError(f"a group must share one bucket, got {sorted(keys)}")
        input_ids = torch.stack([p.input_ids for p in group])
        mask = torch.stack([p.attention_mask for p in group])
        kwargs = self.family.collate([p.pixels for p in group], input_ids, mask.long())
        positions = self.family.position_ids(self.model, kwargs)
        if positions is not None:
            kwargs["position_ids"] = positions
        kwargs = {k: v.to(self.device) if torch.is_tensor(v) else v for k, v in kwargs.items()}
        mask = mask.to(self.device)
        if "pixel_values" in kwargs:
            kwargs["pixel_values"] = kwargs["pixel_values"].to(self.dtype)
        hidden = self.family.hidden_states(self.model, kwargs).float()
        weights = mask.unsqueeze(-1).float()
        pooled = (hidden * weights).sum(1) / weights.sum(1).clamp_min(1.0)
        return [
            VLAFeature(hidden[i:i + 1].cpu(), mask[i:i + 1].cpu(), pooled[i:i + 1].cpu(),
                       p.proprio.unsqueeze(0), torch.tensor([p.task_id]))
            for i, p in enumerate(group)
        ]

    # ------------------------------------------------------------ read-only checks
    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.model.parameters())

    def nbytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.model.parameters())

    def weights_digest(self) -> str:
        """sha256 over every parameter and buffer: equal before and after = nothing changed them."""
        digest = hashlib.sha256()
        for name, tensor in sorted(self.model.state_dict().items()):
            digest.update(name.encode())
            digest.update(tensor.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
        return digest.hexdigest()

    def trainable_parameters(self) -> list[str]:
        return [n for n, p in self.model.named_parameters() if p.requires_grad]


def preset_parameters(name: str) -> int:
    """Parameters of a preset, counted on the meta device (no memory, any size)."""
    if name == MINI_PRESET:
        return MiniVLM.count_parameters()
    with torch.device("meta"):
        model = AutoModelForImageTextToText.from_config(hf_config(get_preset(name)))
    return sum(p.numel() for p in model.parameters())


def ensure_preset(name: str, root: str | Path) -> Path:
    """The checkpoint directory of preset ``name`` under ``root``, built once.

    Safe when many processes cold-start at once: one builds under an exclusive file lock, the
    others wait for it and load what it built (and a build that died half-way left only a
    private temporary folder, never a half-written checkpoint).
    """
    preset = get_preset(name)
    path = preset_dir(root, preset)
    if (path / SPEC_FILE).exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.parent / f".{path.name}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, also if we die
        if not (path / SPEC_FILE).exists():
            build_preset(preset, path)
    return path


def build_preset(preset: Preset, path: Path) -> None:
    """Build a preset with seeded random weights and save it as an HF checkpoint (into a private
    temporary folder, renamed into place only if nobody else's build is already there)."""
    tokens = SpecialTokens()
    config = hf_config(preset, tokens)
    family_cls = family_for(preset.family)
    # bf16 presets are drawn on the GPU when there is one: on a CPU a 2B draw took > 120 s there
    where = "cuda" if preset.weights_dtype == "bfloat16" and torch.cuda.is_available() else "cpu"
    with seeded(preset.seed), torch.device(where):
        model = AutoModelForImageTextToText.from_config(config, dtype=getattr(torch, preset.weights_dtype))
    tokenizer = build_tokenizer(preset.tokenizer_vocab, tokens)
    processor = family_cls.default_processor(preset.image_size, preset.vision)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    processor.save_pretrained(tmp)
    spec = BackboneSpec(family=preset.family, image_size=preset.image_size,
                        max_cameras=preset.max_cameras, token_buckets=preset.token_buckets,
                        preset=preset.name, tokens=tokens)
    (tmp / SPEC_FILE).write_text(json.dumps(asdict(spec), indent=2))
    try:
        tmp.rename(path)  # a half-built preset is never picked up
    except OSError:  # another builder got there first: theirs is identical (same seed)
        shutil.rmtree(tmp, ignore_errors=True)
        if not (path / SPEC_FILE).exists():
            raise
        return
    log.info("backbone preset built", preset=preset.name, path=str(path),
             parameters=sum(p.numel() for p in model.parameters()))
