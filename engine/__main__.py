"""`python -m texstream`: the command line."""

from .apps.cli import main

raise SystemExit(main())
