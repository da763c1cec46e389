"""`python -m hubserve_perf ARGS`: the load tester on its own, the same command as `hubserve perf ARGS`."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main(prog="python -m hubserve_perf"))
