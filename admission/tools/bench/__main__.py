"""``python -m admission.tools.bench ...`` — the same as ``admission bench ...``."""
import sys

from .cli import main

sys.exit(main())
