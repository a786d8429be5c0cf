"""`python -m assisted ...` runs the `structspec` command."""

import sys

from assisted.cli import main

sys.exit(main())
