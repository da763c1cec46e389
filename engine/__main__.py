"""The `hubserve` command: `hubserve serve ...` (Triton-like flags, engine/cli/), `hubserve perf ...` (the
load tester).

The load tester is a package of its own (perf/hubserve_perf/): `hubserve perf ARGS` is handed to it whole and
imported only then, and the server's modules are imported only for `serve`, so neither loads the other.
"""

from __future__ import annotations

import sys

from .cli.parser import build_parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["perf"]:
        try:
            from hubserve_perf.cli import main as perf_main
        except ModuleNotFoundError as e:
            if e.name != "hubserve_perf":
                raise
            print("hubserve perf: the load tester (package hubserve_perf, perf/hubserve_perf/ in the "
                  "checkout) is not installed; run `pip install -e .` in the checkout", file=sys.stderr)
            return 2
        return perf_main(argv[1:])
    args = build_parser().parse_args(argv)
    if args.command == "serve":
        from .cli.serve import serve

        return serve(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())
