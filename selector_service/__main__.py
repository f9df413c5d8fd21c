"""`python -m selector_service serve ...` is the same as `selector-service serve ...`."""

import sys

from selector_service.cli import main

sys.exit(main())
