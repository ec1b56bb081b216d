"""``python -m torchrun_launcher`` (the zipapp's own __main__ runs main the same way)."""

import sys

from .main import main

sys.exit(main())
