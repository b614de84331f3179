"""Packs for image files: `pack_for_image` bakes an image once into the pack cache and returns the
pack's path; later calls for the same bytes and settings return it at once.

The cache key is the xxh3-128 of (the file's bytes' xxh3-128, the resolved bake settings, the pack
format version, this cache's layout version). The file's digest is kept in a note keyed by its real
path and checked against (device, inode, size, mtime_ns, ctime_ns): a second call does not read the
file again, and any write to the file (which moves its ctime, whatever its mtime is set back to)
makes it hashed anew. The content facts the settings are chosen from (`image_settings`) are kept in a
note keyed by the digest, so a hit neither decodes nor hashes anything.

Bakes run through `texstream.bake.bake` on worker processes (``jobs``: 0 is every core), reading the
image through the same sources as ``texstream bake`` (Pillow; libvips for images above 16 M texels and
for TIFF, which streams big tiled and pyramidal files strip by strip); OpenEXR and Radiance HDR files
through `texstream.assets.exr` and `texstream.assets.hdr` (float texels, baked to BC6H).
"""

from __future__ import annotations

import enum
import json
import logging
import os
import stat
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import xxhash

from ..errors import SourceError
from ..pack.format import MAGIC, PackHeader
from ..pack.format import VERSION as PACK_VERSION
from ..pack.reader import PackReader
from .image_settings import ContentKind, ImageBakeSettings, ImageContent, analyse_source, classify, settings_for
from .pack_cache import PackCache, PackCacheConfig

if TYPE_CHECKING:
    from ..config import RemoteConfig

log = logging.getLogger(__name__)

__all__ = [
    "CACHE_LAYOUT",
    "MAX_SOURCE_PIXELS",
    "CachedPackReader",
    "ImagePackProgress",
    "ImagePackStage",
    "default_pack_cache",
    "file_digest",
    "image_pack_key",
    "is_pack_file",
    "looks_like_image",
    "open_pack_reader",
    "pack_for_image",
    "pack_for_block_file",
    "resolve_pack",
]

CACHE_LAYOUT = 1  # bumped when what the key covers changes meaning
MAX_SOURCE_PIXELS = 1 << 32  # 65536² texels: larger claims are refused before anything is decoded
HASH_CHUNK = 8 << 20  # bytes read at a time while hashing
DEFLATE_MAX_RATIO = 1032  # zlib's limit on inflated / deflated bytes: a PNG claiming more is truncated


class ImagePackStage(enum.Enum):
    """What `pack_for_image` is doing; progress callbacks receive each stage's advance."""

    HASHING = "hashing"  # done / total: bytes of the file read
    ANALYSING = "analysing"  # decoding a sample to choose the settings (done / total: 0 / 1, then 1 / 1)
    WAITING = "waiting"  # another process is baking the same pack
    BAKING = "baking"  # done / total: source rows read by the bake
    DONE = "done"


@dataclass(frozen=True, kw_only=True)
class ImagePackProgress:
    """One progress report of `pack_for_image`."""

    source: Path
    stage: ImagePackStage
    done: int
    total: int

    @property
    def fraction(self) -> float:
        return self.done / self.total if self.total else 1.0


ProgressCallback = Callable[[ImagePackProgress], None]

_default_caches: dict[Path, PackCache] = {}


def default_pack_cache() -> PackCache:
    """This process's cache object for the default folder ($TEXSTREAM_CACHE/packs), made once per
    folder so a pack used many times is leased once."""
    config = PackCacheConfig()
    folder = config.path.resolve()
    cache = _default_caches.get(folder)
    if cache is None:
        cache = _default_caches[folder] = PackCache(config)
    return cache


def is_pack_file(path: str | os.PathLike[str]) -> bool:
    """Whether `path` is a regular file starting with the pack magic (a FIFO or device is not
    opened: it is no pack, and reading one could wait forever)."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return False
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except (OSError, ValueError):
        return False
    try:
        return stat.S_ISREG(os.fstat(fd).st_mode) and os.read(fd, len(MAGIC)) == MAGIC
    except OSError:
        return False
    finally:
        os.close(fd)


def looks_like_image(path: str | os.PathLike[str]) -> bool:
    """Whether Pillow or libvips recognises `path` as an image, from its header (nothing decoded)."""
    import warnings

    from PIL import Image, UnidentifiedImageError

    p = Path(path)
    if not p.is_file():
        return False
    from .exr import EXR_MAGIC
    from .hdr import is_hdr_bytes

    try:
        with open(p, "rb") as f:
            head = f.read(80)
    except OSError:
        return False
    if head.startswith(EXR_MAGIC) or is_hdr_bytes(head):
        return True
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(p):
                return True
    except Image.DecompressionBombError:
        return True  # an image, too big for Pillow: libvips takes it
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError):
        pass
    try:
        import pyvips

        pyvips.Image.new_from_file(str(p), access="sequential")
        return True
    except Exception:  # pyvips.Error, or libvips missing: not an image as far as we can tell
        return False


def _identity(st: os.stat_result) -> list[int]:
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def file_digest(
    path: str | os.PathLike[str],
    cache: PackCache | None = None,
    progress: ProgressCallback | None = None,
) -> str:
    """The xxh3-128 of the file's bytes (hex), reusing the digest noted in `cache` for the same file
    (device, inode, size, mtime_ns, ctime_ns) instead of reading it again."""
    p = Path(path)
    try:
        real = p.resolve(strict=True)
        st = os.stat(real)
    except FileNotFoundError:
        raise SourceError(f"{p}: no such file") from None
    except OSError as exc:
        raise SourceError(f"{p}: cannot open: {exc.strerror or exc}") from None
    if not os.path.isfile(real):
        raise SourceError(f"{p}: not a regular file")
    note_name = f"digest-{xxhash.xxh3_64_hexdigest(os.fsencode(real))}"
    if cache is not None:
        note = cache.read_note(note_name)
        if note and note.get("path") == str(real) and note.get("identity") == _identity(st):
            digest = note.get("digest")
            if isinstance(digest, str) and len(digest) == 32:
                return digest
    hasher = xxhash.xxh3_128()
    buf = bytearray(HASH_CHUNK)
    view = memoryview(buf)
    done = 0
    try:
        with open(real, "rb", buffering=0) as f:
            while n := f.readinto(buf):
                hasher.update(view[:n])
                done += n
                if progress is not None:
                    progress(ImagePackProgress(source=p, stage=ImagePackStage.HASHING, done=done, total=st.st_size))
            after = os.fstat(f.fileno())
    except OSError as exc:
        raise SourceError(f"{p}: cannot read: {exc.strerror or exc}") from None
    digest = hasher.hexdigest()
    if cache is not None and _identity(after) == _identity(st):  # not written to while it was read
        cache.write_note(note_name, {"path": str(real), "identity": _identity(st), "digest": digest})
    return digest


def image_pack_key(digest: str, settings: ImageBakeSettings) -> str:
    """The cache key of a pack baked from bytes of `digest` with resolved `settings`."""
    if not settings.resolved:
        raise ValueError("the cache key needs resolved settings (texel format and sRGB chosen)")
    what = {"layout": CACHE_LAYOUT, "pack_version": PACK_VERSION, "source": digest, "settings": settings.key_fields()}
    return xxhash.xxh3_128_hexdigest(json.dumps(what, sort_keys=True).encode())


def _check_claims(path: Path, width: int, height: int) -> None:
    """Refuse sizes no real file of this length can hold, before any pixel is decoded."""
    if width * height > MAX_SOURCE_PIXELS:
        raise SourceError(
            f"{path}: claims {width:,} x {height:,} texels, over the {MAX_SOURCE_PIXELS:,}-texel limit of image packs"
        )
    try:
        with open(path, "rb") as f:
            head = f.read(33)
        size = os.path.getsize(path)
    except OSError as exc:
        raise SourceError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if len(head) == 33 and head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR":
        w, h, depth, colour = struct.unpack(">IIBB", head[16:26])
        channels = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}.get(colour, 4)
        raw = h * (1 + -(-(w * channels * depth) // 8))
        if raw > DEFLATE_MAX_RATIO * size + (1 << 16):
            raise SourceError(
                f"{path}: claims {w:,} x {h:,} texels but holds only {size:,} bytes "
                "(more than deflate can hold): truncated or not a real PNG"
            )


def _open_checked(path: Path) -> object:
    from ..bake.source import open_source
    from ..bake.workers import signals_deferred

    with signals_deferred():  # libvips may call into Python while it opens the file
        source = open_source(path)
    _check_claims(path, int(source.width), int(source.height))
    return source


def _content_of(
    path: Path, digest: str, cache: PackCache, progress: ProgressCallback | None
) -> tuple[ImageContent, object | None]:
    """The noted content facts of these bytes, or (decoding a sample) new ones and the opened source."""
    note = cache.read_note(f"content-{digest}")
    if note is not None:
        try:
            return ImageContent.from_dict(note), None
        except (TypeError, ValueError) as exc:
            log.debug("content note for %s unusable (%s): analysing again", path, exc)
    if progress is not None:
        progress(ImagePackProgress(source=path, stage=ImagePackStage.ANALYSING, done=0, total=1))
    source = _open_checked(path)
    content = analyse_source(source, path)
    cache.write_note(f"content-{digest}", content.as_dict())
    if progress is not None:
        progress(ImagePackProgress(source=path, stage=ImagePackStage.ANALYSING, done=1, total=1))
    return content, source


class _ReadCounter:
    """A source whose row reads report bake progress; every other attribute is the wrapped source's,
    so the bake treats it exactly as the source itself (in-memory, streamed, region-readable)."""

    def __init__(self, source: object, report: Callable[[int], None]) -> None:
        self._source = source
        self._report = report

    def __getattr__(self, name: str) -> object:
        return getattr(self._source, name)

    def read_rows(self, y0: int, y1: int) -> np.ndarray:
        rows = self._source.read_rows(y0, y1)  # type: ignore[attr-defined]
        self._report(y1)
        return rows

    @property
    def read_rows_into(self) -> Callable[..., np.ndarray] | None:
        into = getattr(self._source, "read_rows_into", None)
        if into is None:
            return None

        def read(y0: int, y1: int, out: np.ndarray) -> np.ndarray:
            rows = into(y0, y1, out)
            self._report(y1)
            return rows

        return read


def pack_for_image(
    path: str | os.PathLike[str],
    *,
    settings: ImageBakeSettings | None = None,
    progress: ProgressCallback | None = None,
    cache: PackCache | None = None,
    jobs: int = 0,
) -> Path:
    """The path of a pack baked from the image file at `path`, baking it first unless cached.

    Parameters
    ----------
    path
        a PNG, JPEG, TIFF (big tiled / pyramidal ones streamed), WebP or any other file Pillow or
        libvips reads
    settings
        None: chosen by the file's name and content (`texstream.assets.image_settings`'s rules); the
        fields given here win over the rules, None fields are still chosen
    progress
        called with an `ImagePackProgress` as the file is hashed, analysed and baked
    cache
        None: `default_pack_cache()` ($TEXSTREAM_CACHE/packs, 8 GiB, least recently used evicted)
    jobs
        worker processes of a bake; 0: every core

    Returns
    -------
    Path
        the cached pack, leased by `cache` (never evicted by any process): each call holds the
        lease until a matching ``cache.release(path)``, or this process's exit

    Raises
    ------
    SourceError
        one line naming the file: missing, not an image, truncated, or claiming an absurd size
    """
    p = Path(path)
    cache = cache or default_pack_cache()
    if not isinstance(cache, PackCache):
        raise TypeError(f"cache must be a PackCache, got {type(cache).__name__}")
    if settings is not None and not isinstance(settings, ImageBakeSettings):
        raise TypeError(f"settings must be ImageBakeSettings, got {type(settings).__name__}")
    if is_pack_file(p):
        raise SourceError(f"{p} is already a pack: open it as it is")
    digest = file_digest(p, cache, progress)
    content, opened = _content_of(p, digest, cache, progress)
    kind = classify(p.name, content)
    resolved = settings_for(kind, settings)
    key = image_pack_key(digest, resolved)
    identity = _identity(os.stat(p))

    def report(stage: ImagePackStage, done: int, total: int) -> None:
        if progress is not None:
            progress(ImagePackProgress(source=p, stage=stage, done=done, total=total))

    def bake_into(out: Path) -> dict:
        from ..bake.pipeline import bake
        from ..bake.workers import start_context

        config = resolved.bake_config(jobs=jobs)
        if config.worker_count > 1:
            start_context()  # the fork server starts while the file is opened
        source = opened if opened is not None else _open_checked(p)
        width, height = int(source.width), int(source.height)  # type: ignore[attr-defined]
        try:  # what a pack (and the streamer) can hold, refused in one line naming the file
            PackHeader(
                width=width,
                height=height,
                tile_size=resolved.tile_size,
                texel_format=resolved.texel_format,
                srgb=bool(resolved.srgb),
            )
        except ValueError as exc:
            raise SourceError(f"{p}: {exc}") from None
        report(ImagePackStage.BAKING, 0, height)
        counted = _ReadCounter(source, lambda rows: report(ImagePackStage.BAKING, rows, height))
        metadata = {"source_digest": digest, "content_kind": kind.value, "image_pack_key": key}
        result = bake(counted, out, config, metadata)  # type: ignore[arg-type]
        if _identity(os.stat(p)) != identity:  # changed under the bake: the pack is of other bytes
            out.unlink(missing_ok=True)
            raise SourceError(f"{p}: changed while it was being baked; try again")
        log.info("%s: baked into the pack cache as %s (%s, %.2f s)", p, key, kind.value, result.seconds)
        return {
            "source": p.name,
            "source_path": str(p.resolve()),
            "source_digest": digest,
            "content_kind": kind.value,
            "settings": resolved.key_fields(),
            "width": result.width,
            "height": result.height,
        }

    started = time.perf_counter()
    out, baked = cache.get_or_bake(key, bake_into, on_wait=lambda: report(ImagePackStage.WAITING, 0, 1))
    report(ImagePackStage.DONE, 1, 1)
    if not baked:
        log.debug("%s: cache hit %s in %.3f ms", p, key, (time.perf_counter() - started) * 1e3)
    return out


def resolve_pack(
    path: str | os.PathLike[str],
    *,
    settings: ImageBakeSettings | None = None,
    progress: ProgressCallback | None = None,
    cache: PackCache | None = None,
    jobs: int = 0,
) -> str | os.PathLike[str]:
    """What a pack reader should open for `path`: `path` itself for a pack, a URL or anything that
    is not an image (the reader's own error then names the problem), else the image's cached pack
    (`pack_for_image`, baked first when needed; leased until this process exits or the pack is
    released from `cache`)."""
    return _resolve(path, settings=settings, progress=progress, cache=cache, jobs=jobs)[0]


def _resolve(
    path: str | os.PathLike[str],
    *,
    settings: ImageBakeSettings | None,
    progress: ProgressCallback | None,
    cache: PackCache | None,
    jobs: int,
) -> tuple[str | os.PathLike[str], PackCache | None]:
    """`resolve_pack`'s answer, and the cache holding a lease on it (None: not a cached pack)."""
    from ..remote.urls import is_remote
    from .load import is_block_file

    text = os.fspath(path)
    if isinstance(text, bytes) or is_remote(text) or text.startswith("file://"):
        return path, None
    if is_pack_file(text):
        return path, None
    cache = cache or default_pack_cache()
    if Path(text).is_file() and is_block_file(text):  # DDS / KTX2: re-tiled, never re-encoded
        return pack_for_block_file(text, cache=cache), cache
    if not looks_like_image(text):
        return path, None
    return pack_for_image(text, settings=settings, progress=progress, cache=cache, jobs=jobs), cache


class CachedPackReader(PackReader):
    """A `PackReader` of a pack in the pack cache that gives its hold on the pack's lease back when
    it closes (once), so the cache may evict the pack when nothing else uses it."""

    def __init__(self, path: Path, cache: PackCache, remote: RemoteConfig | None = None) -> None:
        self._lease_cache: PackCache | None = None  # a failed open gives nothing back: the caller does
        super().__init__(path, remote)
        self._lease_cache = cache

    def close(self) -> None:
        super().close()
        cache, self._lease_cache = getattr(self, "_lease_cache", None), None
        if cache is not None:
            cache.release(self.path)


def open_pack_reader(
    path: str | os.PathLike[str],
    remote: RemoteConfig | None = None,
    *,
    settings: ImageBakeSettings | None = None,
    progress: ProgressCallback | None = None,
    cache: PackCache | None = None,
    jobs: int = 0,
) -> PackReader:
    """A reader of what `resolve_pack` names for `path`. For an image or block file, the reader
    holds the cached pack's lease while it is open: closing it (the streamer does when a texture's
    last handle closes) lets the cache evict the pack again.

    Raises
    ------
    PackNotFoundError, PackFormatError, SourceError, RemoteError
        as `PackReader` and `pack_for_image` raise them
    """
    target, lease_cache = _resolve(path, settings=settings, progress=progress, cache=cache, jobs=jobs)
    if lease_cache is None:
        return PackReader(target, remote)
    try:
        return CachedPackReader(Path(target), lease_cache, remote)
    except BaseException:
        lease_cache.release(target)  # no reader took the hold
        raise


def pack_for_block_file(path: str | os.PathLike[str], *, cache: PackCache | None = None) -> Path:
    """The path of a pack re-tiled from a DDS or KTX2 file's blocks (`retile_to_pack`, default
    geometry), made once in the pack cache like an image's; leased as `pack_for_image`'s are.

    Raises
    ------
    SourceError
        one line naming the file: unreadable, truncated, or a format a pack cannot hold as it is
    """
    from .load import read_block_file
    from .retile import RetileConfig, retile_to_pack

    p = Path(path)
    cache = cache or default_pack_cache()
    digest = file_digest(p, cache)
    what = {"layout": CACHE_LAYOUT, "pack_version": PACK_VERSION, "source": digest, "retile": "default"}
    key = xxhash.xxh3_128_hexdigest(json.dumps(what, sort_keys=True).encode())

    def retile_into(out: Path) -> dict:
        report = retile_to_pack(read_block_file(p), out, RetileConfig())
        return {"source": str(p), "retiled": True, "levels_copied": list(report.levels_copied)}

    pack, _baked = cache.get_or_bake(key, retile_into)
    return pack


def content_kind(path: str | os.PathLike[str], cache: PackCache | None = None) -> ContentKind:
    """The kind `pack_for_image` would bake `path` as (by the name and content rules)."""
    p = Path(path)
    cache = cache or default_pack_cache()
    content, _ = _content_of(p, file_digest(p, cache), cache, None)
    return classify(p.name, content)
