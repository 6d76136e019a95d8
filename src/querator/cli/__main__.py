"""``python -m querator.cli``: the ``querator`` console script without the installed entry point."""

from __future__ import annotations

import sys

from querator.cli import main

sys.exit(main())
