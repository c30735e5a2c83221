"""`python -m qkvqa` runs the same command line as `qkvqa`."""

import sys

from qkvqa.cli.main import main

sys.exit(main())
