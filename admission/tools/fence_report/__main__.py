"""``python -m admission.tools.fence_report ...`` — the same as ``admission fence-report ...``."""
import sys

from .cli import main

sys.exit(main())
