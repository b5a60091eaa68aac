"""``python -m mfpde``: the command line."""

from mfpde.cli import main

raise SystemExit(main())
