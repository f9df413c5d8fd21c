"""`python -m selector_service serve ...` is the same as `selector-service serve ...`."""

import sys

from selector_service.server.cli import main

sys.exit(main())
