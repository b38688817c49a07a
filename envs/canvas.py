"""A tiny numpy rasteriser for the built-in 2D tasks: filled discs and squares on a square image.

No anti-aliasing and no randomness, so an image is a pure function of the
scene (bit-identical across runs and machines). A view maps a window of the
world (centre, half extent) onto the pixels, which gives both the fixed
top-down camera and the agent-centred "wrist" camera.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["Canvas", "View"]


@dataclass(frozen=True)
class View:
    center: tuple[float, float]
    half_extent: float


class Canvas:
    """Draws into an RGB uint8 image of ``size`` x ``size`` seen through ``view``; +y points up."""

    def __init__(self, size: int, view: View, background: tuple[int, int, int],
                 outside: tuple[int, int, int] | None = None, world_half_extent: float = 1.0):
        centers = (np.arange(size, dtype=np.float32) + 0.5) / size * 2.0 - 1.0  # in [-1, 1]
        scale = view.half_extent
        self.x = (view.center[0] + centers * scale)[None, :]  # [1, W]
        self.y = (view.center[1] - centers * scale)[:, None]  # [H, 1]: row 0 is the top
        self.image = np.empty((size, size, 3), dtype=np.uint8)
        self.image[:] = background
        if outside is not None:  # paint what lies beyond the world's walls
            beyond = (np.abs(self.x) > world_half_extent) | (np.abs(self.y) > world_half_extent)
            self.image[beyond] = outside

    def disc(self, center: np.ndarray, radius: float, color: tuple[int, int, int]) -> None:
        mask = (self.x - center[0]) ** 2 + (self.y - center[1]) ** 2 <= radius**2
        self.image[mask] = color

    def square(self, center: np.ndarray, half_size: float, color: tuple[int, int, int]) -> None:
        mask = (np.abs(self.x - center[0]) <= half_size) & (np.abs(self.y - center[1]) <= half_size)
        self.image[mask] = color
