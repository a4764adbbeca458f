"""`python -m duplexcadence`: the `dsl` command."""

import sys

from duplexcadence.interpreter.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
