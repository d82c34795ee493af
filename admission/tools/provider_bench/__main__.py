"""``python -m admission.tools.provider_bench ...`` — the same as ``admission bench --provider ...``."""
import sys

from .cli import main

sys.exit(main())
