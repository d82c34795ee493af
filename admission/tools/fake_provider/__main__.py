"""``python -m admission.tools.fake_provider ...`` — the same as ``admission fake-provider ...``."""
import sys

from .cli import main

sys.exit(main())
