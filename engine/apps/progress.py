"""Progress on a terminal for the programs: a tqdm bar per stage of an image's bake into the pack cache."""

from __future__ import annotations

import sys

__all__ = ["ImagePackBar"]


class ImagePackBar:
    """A tqdm bar on stderr per stage of `pack_for_image` (hashing bytes, baking rows)."""

    def __init__(self) -> None:
        self.bar = None
        self.stage = None

    def __call__(self, event: object) -> None:
        from tqdm import tqdm

        from ..assets.image_packs import ImagePackStage

        stage = event.stage  # type: ignore[attr-defined]
        if stage is not self.stage:
            self.close()
            self.stage = stage
            if stage in (ImagePackStage.HASHING, ImagePackStage.BAKING):
                unit = "B" if stage is ImagePackStage.HASHING else "row"
                name = event.source.name  # type: ignore[attr-defined]
                self.bar = tqdm(
                    total=event.total,  # type: ignore[attr-defined]
                    desc=f"{stage.value} {name}",
                    unit=unit,
                    unit_scale=stage is ImagePackStage.HASHING,
                    leave=False,
                    dynamic_ncols=True,
                )
            elif stage is ImagePackStage.WAITING:
                print(f"texstream: waiting for another process baking {event.source.name}", file=sys.stderr)  # type: ignore[attr-defined]
        if self.bar is not None:
            self.bar.update(event.done - self.bar.n)  # type: ignore[attr-defined]

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
