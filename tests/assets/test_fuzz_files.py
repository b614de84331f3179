"""Random corruption of DDS and KTX2 headers and level indexes: the readers either read the file or
refuse it with one SourceError line; nothing else escapes (seeded, so a failure reproduces)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from texstream.assets import read_block_file
from texstream.errors import SourceError
from texstream.pack.format import TexelFormat

from .files import block_levels, dds_bytes, ktx2_file_bytes, picture

F = TexelFormat


@pytest.mark.parametrize("kind", ["dds", "ktx2", "zstd.ktx2"])
def test_corrupted_headers_are_read_or_refused_in_one_line(tmp_path: Path, kind: str) -> None:
    levels = block_levels(F.BC1, picture(32, 32), 3)
    if kind == "dds":
        data, head = dds_bytes(F.BC1, 32, 32, levels), 148
    else:
        data, head = ktx2_file_bytes(F.BC1, 32, 32, levels, zstd=kind.startswith("zstd")), 80 + 24 * 3 + 28
    rng = np.random.default_rng(21)
    path = tmp_path / f"f.{kind}"
    for _ in range(400):
        buf = bytearray(data)
        for _ in range(int(rng.integers(1, 4))):
            pos = int(rng.integers(0, head))
            if rng.random() < 0.5:
                buf[pos] ^= 1 << int(rng.integers(0, 8))
            else:
                buf[pos : pos + 4] = rng.integers(0, 256, 4, dtype=np.uint8).tobytes()
        path.write_bytes(bytes(buf[: len(data)]))
        try:
            texture = read_block_file(path)
        except SourceError as exc:
            assert "\n" not in str(exc) and str(path) in str(exc)
        else:  # what was read is consistent with itself
            for level in texture.levels:
                assert level.blocks.shape == (
                    -(-level.height // 4),
                    -(-level.width // 4),
                    texture.texel_format.block_bytes,
                )
