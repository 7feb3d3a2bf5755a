"""Decoding image files (JPEG, PNG, …) into ``uint8`` channels-first arrays with Pillow.

Pillow is imported lazily, only by loaders that decode images. Resizing uses Pillow's bilinear filter,
which low-pass filters when it shrinks (CORe50 128→32, Tiny-ImageNet 64→32).
"""

from __future__ import annotations

import io
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ferret_core.errors import DataError

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".ppm", ".webp")

Progress = Callable[[int, int | None], None]
"""``progress(done, total)`` after each decoded image; ``total`` is None when not known in advance."""


def decode_image(data: bytes, size: tuple[int, int] | None = None, *, source: str = "<bytes>") -> np.ndarray:
    """One encoded image as ``uint8 (3, H, W)`` RGB; resized to ``size = (H, W)`` when given."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as image:
            rgb: Any = image.convert("RGB")
    except (UnidentifiedImageError, OSError, SyntaxError) as exc:
        raise DataError(f"cannot decode image {source}: {exc}") from exc
    if size is not None and (rgb.height, rgb.width) != tuple(size):
        rgb = rgb.resize((size[1], size[0]), Image.Resampling.BILINEAR)
    array = np.asarray(rgb, dtype=np.uint8)
    return np.ascontiguousarray(array.transpose(2, 0, 1))


def decode_files(
    paths: Sequence[Path],
    size: tuple[int, int],
    progress: Progress | None = None,
    *,
    start: int = 0,
    total: int | None = None,
) -> np.ndarray:
    """Decode image files into one ``uint8 (N, 3, H, W)`` array.

    ``progress(start + done, total)`` is called after each image (``total`` defaults to ``len(paths)``),
    so that several calls can report one running count.
    """
    out = np.empty((len(paths), 3, *size), dtype=np.uint8)
    for i, path in enumerate(paths):
        out[i] = decode_image(Path(path).read_bytes(), size, source=str(path))
        if progress is not None:
            progress(start + i + 1, len(paths) if total is None else total)
    return out


def list_images(folder: Path) -> list[Path]:
    """Image files directly inside ``folder``, sorted by name."""
    return sorted(p for p in folder.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)
