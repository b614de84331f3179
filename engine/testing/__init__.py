"""Testing your own rendering headless in CI: `converge`, `all_resident`, `assert_image_close`, `psnr`.

These functions need only numpy and Pillow. The pytest plugin (`texstream.testing.plugin`, installed
as the ``texstream`` entry point of ``pytest11``) adds fixtures around them: ``gl_context`` (headless
EGL, GL errors checked after each test), ``streamer`` (released after the test, the GL objects
texstream made checked for leaks; ``texstream_strict_gl`` / ``--texstream-strict-gl`` checks all),
``golden`` with the ``texstream_golden`` marker and the ``--texstream-update-golden`` flag. See the
documentation page "Testing your rendering in CI".
"""

from __future__ import annotations

from .frames import ConvergenceError, all_resident, converge, read_framebuffer
from .images import IDENTICAL_DB, ImageMismatch, assert_image_close, difference_image, psnr, read_png, write_png

__all__ = [
    "IDENTICAL_DB",
    "ConvergenceError",
    "ImageMismatch",
    "all_resident",
    "assert_image_close",
    "converge",
    "difference_image",
    "psnr",
    "read_framebuffer",
    "read_png",
    "write_png",
]
