"""``python -m admission.tools.sim ...`` — the same as ``admission simulate ...``."""
import sys

from .cli import main

sys.exit(main(sys.argv[1:]))
