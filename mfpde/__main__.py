"""``python -m mfpde``: the command line."""

from mfpde.launch import main

raise SystemExit(main())
