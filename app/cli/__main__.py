"""`python -m app.cli`: the same as `kvscope` (and `python -m app`)."""

from . import main

raise SystemExit(main())
