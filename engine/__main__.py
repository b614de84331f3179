"""`python -m texstream`: the command line."""

import sys

from ._shadow import shadow_message, shadowing_folder

if (_folder := shadowing_folder()) is not None:  # a `texstream` folder in the working folder
    print(f"texstream: {shadow_message(_folder)}", file=sys.stderr)
    raise SystemExit(1)

from .apps.cli import main  # noqa: E402 - only once the package is known to be the real one

raise SystemExit(main())
