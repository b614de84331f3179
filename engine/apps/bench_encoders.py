"""`texstream bench bake`, first part: every block encoder candidate on quality and single-thread speed.

Quality: each image is cut into 136² slots (the default 128 tile plus a 4-texel border; the edge
slots padded by repeating the last texel), encoded, decoded with texture2ddecoder (independent of
every encoder) and compared on the image's own texels. dB colour is PSNR over R, G, B where alpha
> 0 (what a blended icon shows), over R for BC4 and R, G for BC5; dB alpha is PSNR of alpha where
the format keeps it (BC3, BC7). Speed: MPixel/s of one thread, warm, best of several runs, on
slot-sized inputs cut from a photograph (72², 136², 264²: tiles 64, 128, 256 with their borders)
and on one 512² call, where per-call overhead no longer shows.

BC7 presets (`bench_bc7_presets`): every `bc7_quality` level through `bcn.encode_slot` (the chosen
encoder, as the bake calls it) on the photographs' 136² slots: dB colour on each, MPixel/s of one
thread, and the bake's own rate on the pipeline's cores (a photo-derived image baked to BC7 at that
level, source MPixel/s: mips and borders included).

Images: the repository's photographs, uniform noise, a procedural icon (antialiased shapes with
sharp colour edges over a transparent background: straight alpha, RGB 0 where alpha is 0) and a
procedural normal map (BC4/BC5 only, with the photographs and the noise).
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np

from ..bake.encoders import BC7_QUALITIES, ENCODERS, Encoder
from ..config import BakeConfig
from ..pack.format import TexelFormat
from ..testing.images import psnr

ASSET_DIRS = (
    Path(__file__).resolve().parent.parent / "sample_images",  # an installed package
    Path(__file__).resolve().parents[2] / "assets",  # a checkout (editable install)
)
PHOTOS = ("astronaut.png", "coffee.png", "chelsea.png")
SLOT = 136
SPEED_SIDES = (72, 136, 264, 512)
_COLOUR_FORMATS = (TexelFormat.BC1, TexelFormat.BC3, TexelFormat.BC7)


def _photo(name: str) -> np.ndarray | None:
    from PIL import Image

    path = next((d / name for d in ASSET_DIRS if (d / name).exists()), None)
    return None if path is None else np.asarray(Image.open(path).convert("RGBA")).copy()


def make_icon(size: int = 256, seed: int = 7) -> np.ndarray:
    """Flat-coloured discs and bars with 4x4-supersampled (antialiased) alpha over transparency."""
    rng = np.random.default_rng(seed)
    ss = 4
    n = size * ss
    yy, xx = np.mgrid[0:n, 0:n].astype(np.float32) / ss
    premul = np.zeros((n, n, 3), np.float32)
    cover = np.zeros((n, n), np.float32)
    for i in range(14):
        colour = rng.integers(0, 256, 3).astype(np.float32)
        cx, cy = rng.uniform(0.1, 0.9, 2) * size
        if i % 2:
            r = rng.uniform(0.05, 0.2) * size
            inside = (xx - cx) ** 2 + (yy - cy) ** 2 <= r * r
        else:
            hw, hh = rng.uniform(0.02, 0.25, 2) * size
            inside = (abs(xx - cx) <= hw) & (abs(yy - cy) <= hh)
        premul[inside] = colour  # painted over: later shapes cover earlier ones
        cover[inside] = 1.0
    alpha = cover.reshape(size, ss, size, ss).mean(axis=(1, 3))
    colour = premul.reshape(size, ss, size, ss, 3).mean(axis=(1, 3))
    rgb = np.where(alpha[..., None] > 0, colour / np.maximum(alpha, 1e-6)[..., None], 0.0)
    out = np.empty((size, size, 4), np.uint8)
    out[..., :3] = np.clip(rgb + 0.5, 0, 255).astype(np.uint8)
    out[..., 3] = np.clip(alpha * 255 + 0.5, 0, 255).astype(np.uint8)
    return out


def make_noise(size: int = 256, seed: int = 3) -> np.ndarray:
    out = np.random.default_rng(seed).integers(0, 256, (size, size, 4), dtype=np.uint8)
    out[..., 3] = 255
    return out


def make_normals(size: int = 256, seed: int = 1) -> np.ndarray:
    from ..bake.procedural import normal_rows

    return normal_rows(0, size, size, size, seed)


def _images(quick: bool) -> dict[str, np.ndarray]:
    images = {}
    for name in PHOTOS[:1] if quick else PHOTOS:
        img = _photo(name)
        if img is not None:
            images[name.removesuffix(".png")] = img
    images["noise"] = make_noise()
    images["icon"] = make_icon()
    images["normals"] = make_normals()
    return images


def _slots(img: np.ndarray, side: int = SLOT) -> list[np.ndarray]:
    h, w = img.shape[:2]
    ph, pw = -(-h // side) * side, -(-w // side) * side
    padded = np.pad(img, ((0, ph - h), (0, pw - w), (0, 0)), mode="edge")
    return [
        np.ascontiguousarray(padded[y : y + side, x : x + side]) for y in range(0, ph, side) for x in range(0, pw, side)
    ]


def _decode(raw: bytes, fmt: TexelFormat, side: int) -> np.ndarray:
    import texture2ddecoder as t2d

    fn = {
        TexelFormat.BC1: t2d.decode_bc1,
        TexelFormat.BC3: t2d.decode_bc3,
        TexelFormat.BC4: t2d.decode_bc4,
        TexelFormat.BC5: t2d.decode_bc5,
        TexelFormat.BC7: t2d.decode_bc7,
        TexelFormat.BC6H: t2d.decode_bc6,  # 8-bit sources encode as linear v / 255: decoded back to 8 bits
    }[fmt]
    bgra = np.frombuffer(fn(raw, side, side), np.uint8).reshape(side, side, 4)
    return bgra[..., [2, 1, 0, 3]]


def quality(enc: Encoder, img: np.ndarray, bc7_quality: str = "normal") -> tuple[float, float | None]:
    """(dB colour, dB alpha or None) of `img` through `enc`, slot by slot."""
    h, w = img.shape[:2]
    slots = _slots(img)
    cols = -(-w // SLOT)
    decoded = np.empty((-(-h // SLOT) * SLOT, cols * SLOT, 4), np.uint8)
    for i, slot in enumerate(slots):
        y, x = divmod(i, cols)
        raw = enc.encode(slot, bc7_quality, True, True)
        decoded[y * SLOT : (y + 1) * SLOT, x * SLOT : (x + 1) * SLOT] = _decode(raw, enc.fmt, SLOT)
    got = decoded[:h, :w]
    if enc.fmt is TexelFormat.BC4:
        return psnr(got[..., 0], img[..., 0]), None
    if enc.fmt is TexelFormat.BC5:
        return psnr(got[..., :2], img[..., :2]), None
    seen = img[..., 3] > 0
    colour = psnr(got[..., :3][seen], img[..., :3][seen])
    return colour, (psnr(got[..., 3], img[..., 3]) if enc.fmt is not TexelFormat.BC1 else None)


def speed(enc: Encoder, photo: np.ndarray, side: int, bc7_quality: str = "normal", seconds: float = 0.25) -> float:
    """Single-thread MPixel/s on side² inputs cut from `photo` (tiled by mirroring past its edge)."""
    reps = -(-max(side, 2 * SLOT) // min(photo.shape[:2]))
    big = np.tile(np.concatenate([photo, photo[::-1]], 0), (reps, 2 * reps, 1))[: max(side, 512), : max(side, 512)]
    inputs = _slots(big, side)[: max(1, min(16, (1 << 18) // (side * side)))]
    for s in inputs[:2]:
        enc.encode(s, bc7_quality, True, True)  # warm: tables, caches
    best = 0.0
    deadline = time.perf_counter() + seconds
    while True:
        t0 = time.perf_counter()
        for s in inputs:
            enc.encode(s, bc7_quality, True, True)
        dt = time.perf_counter() - t0
        best = max(best, len(inputs) * side * side / dt / 1e6)
        if time.perf_counter() > deadline:
            return best


def _available(enc: Encoder) -> bool:
    try:
        enc.encode(np.zeros((4, 4, 4), np.uint8), "fast", True, True)
    except ImportError:
        return False
    return True


def bench_encoders(quick: bool) -> list[dict]:
    """One row per (format, encoder[, BC7 level], image): dB colour, dB alpha, MPixel/s at each size."""
    images = _images(quick)
    photo = images.get("astronaut", images["noise"])
    rows = []
    for (fmt, name), enc in ENCODERS.items():
        if not _available(enc):
            rows.append({"format": fmt.name.lower(), "encoder": name, "missing": True})
            continue
        levels = BC7_QUALITIES if fmt is TexelFormat.BC7 else ("-",)
        for level in levels:
            rates = {
                f"mpix_s_{side}": round(speed(enc, photo, side, level, 0.1 if quick else 0.3), 2)
                for side in (SPEED_SIDES[1:2] if quick else SPEED_SIDES)
            }
            for image, img in images.items():
                if fmt in _COLOUR_FORMATS and image == "normals":
                    continue
                if fmt not in _COLOUR_FORMATS and image == "icon":
                    continue
                colour, alpha = quality(enc, img, level)
                rows.append(
                    {
                        "format": fmt.name.lower(),
                        "encoder": name,
                        "level": level,
                        "image": image,
                        "db_colour": round(colour, 2),
                        "db_alpha": None if alpha is None else round(alpha, 2),
                        **rates,
                    }
                )
    return rows


def print_encoders(rows: list[dict]) -> None:
    print("block-compression encoders: dB colour (RGB where alpha > 0; R for bc4, RG for bc5), dB alpha,")
    print("MPixel/s of one thread on NxN inputs (72/136/264: slots of tile 64/128/256; 512: one call)")
    sides = [k for k in next((r for r in rows if "db_colour" in r), {}) if k.startswith("mpix_s_")]
    head = f"{'format':<6} {'encoder':<8} {'level':<6} {'image':<10} {'dB col':>7} {'dB a':>6} " + " ".join(
        f"{s.removeprefix('mpix_s_') + '²':>7}" for s in sides
    )
    print(head)
    for r in rows:
        if r.get("missing"):
            print(f"{r['format']:<6} {r['encoder']:<8} (library not installed)")
            continue
        alpha = "-" if r["db_alpha"] is None else f"{r['db_alpha']:.2f}"
        print(
            f"{r['format']:<6} {r['encoder']:<8} {r['level']:<6} {r['image']:<10} {r['db_colour']:>7.2f} "
            f"{alpha:>6} " + " ".join(f"{r[s]:>7}" for s in sides)
        )


def _tiled_photo(photo: np.ndarray, side: int) -> np.ndarray:
    """A side² image tiled from `photo`, alternate copies mirrored (no trivially repeated blocks)."""
    pair = np.concatenate([photo, photo[:, ::-1]], 1)
    quad = np.concatenate([pair, pair[::-1]], 0)
    reps = -(-side // min(quad.shape[:2]))
    return np.ascontiguousarray(np.tile(quad, (reps, reps, 1))[:side, :side])


def bench_bc7_presets(
    jobs: int, quick: bool, side: int | None = None, levels: tuple[str, ...] = BC7_QUALITIES
) -> list[dict]:
    """One row per BC7 level of `levels`: dB colour on each photograph, one thread's MPixel/s on 136²
    slots and the bake's MPixel/s of a side² image (default 1024² when `quick`, else 2048²) on `jobs`
    worker processes (0: every usable core)."""
    from ..bake import ArraySource, bake, bcn
    from ..config import usable_cores
    from ..pack.format import TexelFormat

    images = {n.removesuffix(".png"): img for n in PHOTOS if (img := _photo(n)) is not None}
    if not images:
        return []
    photo = images.get("astronaut", next(iter(images.values())))
    workers = jobs or usable_cores()
    side = side or (1024 if quick else 2048)
    source = ArraySource(_tiled_photo(photo, side), "bench-bc7")
    enc = ENCODERS[(TexelFormat.BC7, bcn.CHOSEN[TexelFormat.BC7])]
    rows = []
    with tempfile.TemporaryDirectory(prefix="texstream-bench-bc7-") as tmp:
        out = Path(tmp) / "bc7.tpk"
        warm = BakeConfig(texel_format=TexelFormat.BC7, bc7_quality="fast", jobs=workers, progress=False)
        bake(ArraySource(photo, "warm-up"), out, warm)  # starts the worker processes: not measured
        for level in levels:
            cfg = BakeConfig(texel_format=TexelFormat.BC7, bc7_quality=level, jobs=workers, progress=False)
            report = bake(source, out, cfg)
            rows.append(
                {
                    "level": level,
                    "mpix_s_1core": round(speed(enc, photo, SLOT, level, 0.1 if quick else 0.4), 2),
                    "bake_mpix_s": round(report.mpixels_per_s, 2),
                    "bake_cores": report.jobs,
                    "bake_size": side,
                    **{f"db_{name}": round(quality(enc, img, level)[0], 2) for name, img in images.items()},
                }
            )
    return rows


def print_bc7_presets(rows: list[dict]) -> None:
    if not rows:
        print("bc7 presets: the sample photographs are missing")
        return
    photos = [k.removeprefix("db_") for k in rows[0] if k.startswith("db_")]
    print(
        f"bc7 presets: MPixel/s of one thread on {SLOT}² slots, bake MPixel/s of a {rows[0]['bake_size']}² "
        f"photo-derived image on {rows[0]['bake_cores']} cores, dB colour on each photograph"
    )
    print(f"{'level':<9} {'1 core':>7} {'bake':>7} " + " ".join(f"{p:>10}" for p in photos))
    for r in rows:
        print(
            f"{r['level']:<9} {r['mpix_s_1core']:>7} {r['bake_mpix_s']:>7} "
            + " ".join(f"{r['db_' + p]:>10.2f}" for p in photos)
        )
