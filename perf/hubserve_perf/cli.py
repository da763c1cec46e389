"""`hubserve perf ...` and `hubserve perf tune-window ...`: flags, and the run of a sweep.

engine/__main__.py hands `hubserve perf ARGS` to `main(ARGS)`, importing this package only then, so the server
never loads the load tester; `python -m hubserve_perf ARGS` is the same command without the server's CLI.
This module imports only argparse and the load tester's own types at load time.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .types import Distribution, ExitCode, LoadPlan, PerfError

DESCRIPTION = """\
Measure a KServe v2 / Triton server as NVIDIA's perf_analyzer does: closed-loop concurrency or open-loop
request-rate load over HTTP (binary tensors) or gRPC, measurement windows (1.2 x --measurement-interval, as
perf_analyzer's) until 3 in a row agree within --stability-percentage, client latency percentiles, server
queue and compute time from the statistics extension. Progress goes to stderr, one line per window; the
table to stdout. A point with no stable measurement is reported as such and the sweep goes on. In every mode
-f writes CSV (as perf_analyzer's -f) and --json writes JSON. Exit codes as perf_analyzer's:
0 success, 1 bad flags or input data, 2 a point without a stable measurement, 99 the server refused a
request."""


class HelpFormatter(argparse.HelpFormatter):
    """Each flag's default once, as "(default: X)" at the end of its help: not for a switch that is off unless
    given, a default of None (not given: nothing, or a default the help says in words), nor where the help
    says "(default: ...)" itself. The server's help does the same (engine/cli/flags.py; the load tester does
    not import the server's CLI)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if ("(default:" in text or not action.option_strings or action.default is None
                or action.default is argparse.SUPPRESS or action.default is False or action.default == []):
            return text
        return f"{text} (default: %(default)s)"


class _SweepHelpFormatter(argparse.RawDescriptionHelpFormatter, HelpFormatter):
    """`hubserve perf --help`: DESCRIPTION's lines as written, the defaults as HelpFormatter shows them."""


@dataclass(frozen=True, slots=True)
class Range:
    start: float
    end: float
    step: float

    def values(self) -> list[float]:
        out, value = [], self.start
        while value <= self.end + 1e-9:
            out.append(value)
            value += self.step
        return out


def parse_range(text: str) -> Range:
    """perf_analyzer's `start[:end[:step]]`."""
    try:
        parts = [float(p) for p in text.split(":")]
    except ValueError:
        parts = []
    if not 1 <= len(parts) <= 3:
        raise argparse.ArgumentTypeError(f"expected START[:END[:STEP]], got '{text}'")
    start = parts[0]
    end = parts[1] if len(parts) > 1 else start
    step = parts[2] if len(parts) > 2 else 1.0
    if start <= 0 or end < start or step <= 0:
        raise argparse.ArgumentTypeError(f"range '{text}' needs 0 < START <= END and STEP > 0")
    return Range(start, end, step)


def _add_target_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("-m", "--model-name", dest="model", help="model to measure (required)")
    p.add_argument("-x", "--model-version", dest="version", default="",
                   help="version (default: the one the server picks)")
    p.add_argument("-u", "--url", default=None,
                   help="server HOST:PORT (default: localhost:8000 for http, localhost:8001 for grpc)")
    p.add_argument("-i", "--protocol", choices=("http", "grpc"), default="http", help="protocol")
    p.add_argument("--grpc-client", choices=("h2", "grpcio"), default="h2",
                   help="gRPC load client: our lean HTTP/2 client, or grpcio's grpc.aio (several times the "
                        "client CPU per call)")
    p.add_argument("--grpc-calls-per-connection", type=int, default=6, metavar="N",
                   help="gRPC (h2 client): open another connection whenever N calls are in flight on each, "
                        "as perf_analyzer's client shares a channel among 6 (0: one connection)")
    p.add_argument("-b", "--batch-size", type=int, default=1, help="batch size of each request")
    p.add_argument("--shape", action="append", default=[], metavar="NAME:DIMS",
                   help="shape of an input with variable dims, without the batch dim, e.g. INPUT0:3,224,224")
    p.add_argument("--input-data", default="random", metavar="zero|random|FILE.json",
                   help="input values: zeros, random bytes, or a perf_analyzer JSON data file")
    p.add_argument("-p", "--measurement-interval", dest="interval_ms", type=int, default=5000, metavar="MS",
                   help="length of one measurement window in milliseconds")
    p.add_argument("-s", "--stability-percentage", type=float, default=10.0, metavar="P",
                   help="stable when the last 3 windows' max/min throughput and latency are at most "
                        "1 + P/100")
    p.add_argument("-r", "--max-trials", type=int, default=10, metavar="N",
                   help="at most this many windows per step before giving up as unstable")
    p.add_argument("--percentile", type=int, default=0, metavar="P",
                   help="stabilize on the P-th percentile latency instead of the average (also reported; "
                        "0: the average)")
    p.add_argument("--workers", type=int, default=0, metavar="N",
                   help="load processes, each with its own event loop (default: one per 32 requests in "
                        "flight or 2,000 requests/s, at most the cores, half of them for a local server)")
    p.add_argument("--json", type=Path, metavar="OUT.json",
                   help="write everything measured as JSON, every point, stable or not")
    p.add_argument("--plot", type=Path, metavar="OUT.png",
                   help="draw the curve, every point, unstable ones hollow (needs matplotlib, in the perf "
                        "extra)")


def _add_load_flags(p: argparse.ArgumentParser, sweep: bool) -> None:
    kind = parse_range if sweep else float
    p.add_argument("--request-rate-range" if sweep else "--request-rate", dest="request_rate", type=kind,
                   metavar="START:END:STEP" if sweep else "R",
                   help="open-loop load at these request rates (requests/s) instead of a concurrency")
    p.add_argument("--request-distribution", choices=("constant", "poisson"), default="constant",
                   help="spacing of open-loop requests")


def build_parser(prog: str = "hubserve perf") -> argparse.ArgumentParser:
    perf = argparse.ArgumentParser(prog=prog, description=DESCRIPTION, formatter_class=_SweepHelpFormatter)
    _add_target_flags(perf)
    perf.add_argument("--concurrency-range", type=parse_range, default=None, metavar="START:END:STEP",
                      help="closed-loop load: requests in flight at each step (default: 1)")
    _add_load_flags(perf, sweep=True)
    perf.add_argument("-f", "--latency-report-file", dest="csv", type=Path, metavar="OUT.csv",
                      help="write perf_analyzer's CSV report (its columns; the stable points, as it has no "
                           "column to mark the others: --json has every point)")
    tune_sub = perf.add_subparsers(dest="perf_command", metavar="{tune-window,generate}")
    tune = tune_sub.add_parser(
        "tune-window", help="find the batching window (max_queue_delay_microseconds) for a p95 budget",
        formatter_class=HelpFormatter,
        description="Reload the model with each max_queue_delay_microseconds through the repository API (a "
                    "config override, so the server must run with --model-control-mode explicit, as Triton "
                    "must too), measure "
                    "each, recommend the highest-throughput window whose p95 meets the budget, and put the "
                    "original config back. Exits 1 when no window meets the budget.")
    _add_target_flags(tune)
    tune.add_argument("--p95-budget-ms", type=float, required=True, help="the p95 latency budget")
    tune.add_argument("--windows-us", default="0,100,500,1000,2000,5000", metavar="LIST",
                      help="comma-separated max_queue_delay_microseconds values to try")
    tune.add_argument("--concurrency", type=int, default=0, metavar="N",
                      help="closed-loop load during each measurement (default: 2 x max_batch_size)")
    _add_load_flags(tune, sweep=False)
    tune.add_argument("-f", "--curve-file", dest="csv", type=Path, metavar="OUT.csv",
                      help="write the curve as CSV, one row per window tried")
    tune.add_argument("--metrics-url", metavar="HOST:PORT",
                      help="hubserve's Prometheus port: count end-of-window flushes exactly from "
                           "hubserve_batch_dispatch_total (default: estimate them from batch sizes)")
    _add_generate_parser(tune_sub)
    return perf


def _add_generate_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    gen = sub.add_parser(
        "generate", help="streamed OpenAI completions: TTFT, inter-token latency, tokens/s",
        formatter_class=HelpFormatter,
        description="Load an OpenAI-compatible server (/v1/chat/completions or /v1/completions, "
                    "stream: true) with synthetic seeded prompts, at each concurrency or request rate, and "
                    "report TTFT, inter-token and end-to-end latency percentiles (p50/p90/p95/p99), "
                    "output tokens/s and requests/s per point, as a table, CSV (-f) and JSON (--json). "
                    "Exit 99 when a request fails.")
    gen.add_argument("-m", "--model-name", dest="model", help="the model, as /v1/models lists it (required)")
    gen.add_argument("-u", "--url", default="localhost:8000", help="server HOST:PORT")
    gen.add_argument("--endpoint", choices=("chat", "completions"), default="chat",
                     help="chat: /v1/chat/completions; completions: /v1/completions")
    gen.add_argument("--concurrency-range", type=parse_range, default=None, metavar="START:END:STEP",
                     help="closed-loop load: streams in flight at each point (default: 1)")
    _add_load_flags(gen, sweep=True)
    gen.add_argument("--prompt-tokens", type=int, default=64, metavar="N",
                     help="synthetic prompt length in characters (one token each with a byte-level "
                          "tokenizer; the JSON has the server's count, usage.prompt_tokens)")
    gen.add_argument("--prompt-tokens-stddev", type=float, default=0.0, metavar="S",
                     help="standard deviation of the prompt length")
    gen.add_argument("--max-tokens", type=int, default=64, metavar="N", help="max_tokens of each request")
    gen.add_argument("--temperature", type=float, default=None, metavar="T",
                     help="temperature of each request (default: not sent, the server's default; 0: greedy)")
    gen.add_argument("--ignore-eos", action="store_true",
                     help="ask for max_tokens every time (vLLM's ignore_eos, which hubserve accepts)")
    gen.add_argument("--request-count", type=int, default=0, metavar="N",
                     help="measured requests per point (default: max(10, 4 x concurrency))")
    gen.add_argument("--warmup-request-count", type=int, default=0, metavar="N",
                     help="requests sent first at each point and not measured")
    gen.add_argument("--max-duration-s", type=float, default=120.0, metavar="S",
                     help="a point stops sending after this long")
    gen.add_argument("--seed", type=int, default=0, help="seed of the prompts and of Poisson arrivals")
    gen.add_argument("-f", "--latency-report-file", dest="csv", type=Path, metavar="OUT.csv",
                     help="write one CSV row per point: its level, tokens/s, requests/s and latency "
                          "percentiles in ms")
    gen.add_argument("--json", "--profile-export-file", dest="json", type=Path, metavar="OUT.json",
                     help="write every point's numbers as JSON")


def main(argv: list[str] | None = None, prog: str = "hubserve perf") -> int:
    """Run `hubserve perf ARGV` (or its tune-window); returns the exit code. `argv` excludes the word
    `perf`."""
    from .workers import run_loop

    args = build_parser(prog).parse_args(argv)
    try:
        if not args.model:
            raise PerfError("-m MODEL is required", ExitCode.USAGE)
        if args.perf_command == "tune-window":
            from .tune import run_tune

            return int(run_loop(run_tune(args)))
        if args.perf_command == "generate":
            return run_generate_command(args, run_loop)
        return int(run_loop(run_sweep(args)))
    except PerfError as e:
        print(f"hubserve perf: {e.message}", file=sys.stderr)
        return int(e.exit_code)
    except KeyboardInterrupt:
        return 130


def run_generate_command(args: argparse.Namespace, run_loop: Any) -> int:
    """`hubserve perf generate`: check the flags, then one point per concurrency or request rate."""
    from .generative import GenOptions, GenPoint, run_generate

    if args.request_rate is not None and args.concurrency_range is not None:
        raise PerfError("give --concurrency-range or --request-rate-range, not both", ExitCode.USAGE)
    if args.request_rate is not None:
        poisson = args.request_distribution == "poisson"
        points = [GenPoint(request_rate=r, poisson=poisson) for r in args.request_rate.values()]
    else:
        points = [GenPoint(concurrency=int(c)) for c in (args.concurrency_range or Range(1, 1, 1)).values()]
    if min(args.prompt_tokens, args.max_tokens) < 1 or args.max_duration_s <= 0 \
            or min(args.request_count, args.warmup_request_count, args.prompt_tokens_stddev) < 0:
        raise PerfError("--prompt-tokens and --max-tokens must be positive, --max-duration-s above 0, and "
                        "the counts and --prompt-tokens-stddev not negative", ExitCode.USAGE)
    host, _, port = args.url.rpartition(":")
    if not host or not port.isdigit():
        raise PerfError(f"-u wants HOST:PORT, got '{args.url}'", ExitCode.USAGE)
    largest = max(p.concurrency for p in points)
    options = GenOptions(
        host=host, port=int(port), model=args.model, endpoint=args.endpoint,
        prompt_tokens=args.prompt_tokens, prompt_tokens_stddev=args.prompt_tokens_stddev,
        max_tokens=args.max_tokens, temperature=args.temperature, ignore_eos=args.ignore_eos,
        request_count=args.request_count or max(10, 4 * largest),
        warmup_request_count=args.warmup_request_count, max_duration_s=args.max_duration_s, seed=args.seed)
    return int(run_loop(run_generate(options, points, args.json, args.csv)))


def sweep_plans(args: argparse.Namespace) -> list[LoadPlan]:
    if args.request_rate is not None and args.concurrency_range is not None:
        raise PerfError("give --concurrency-range or --request-rate-range, not both", ExitCode.USAGE)
    if args.request_rate is not None:
        distribution = Distribution(args.request_distribution)
        return [LoadPlan(request_rate=r, distribution=distribution) for r in args.request_rate.values()]
    concurrency = args.concurrency_range or Range(1, 1, 1)
    return [LoadPlan(concurrency=int(c)) for c in concurrency.values()]


def check_common(args: argparse.Namespace) -> None:
    if args.interval_ms < 1 or args.max_trials < 1:
        raise PerfError("--measurement-interval and --max-trials must be positive", ExitCode.USAGE)
    if not 0 <= args.percentile <= 100 or args.stability_percentage <= 0:
        raise PerfError("--percentile must lie in 0..100 and --stability-percentage above 0", ExitCode.USAGE)
    if args.workers < 0:
        raise PerfError("--workers must be 0 (automatic) or more", ExitCode.USAGE)
    if args.grpc_calls_per_connection < 0:
        raise PerfError("--grpc-calls-per-connection must be 0 (one connection) or more", ExitCode.USAGE)
    if args.protocol == "grpc" and importlib.util.find_spec("grpc") is None:
        raise PerfError("-i grpc needs grpcio (the control calls, and --grpc-client grpcio): pip install "
                        "'hubserve[perf]'", ExitCode.USAGE)
    if args.plot:
        from .report import check_plot_available

        check_plot_available()


async def run_sweep(args: argparse.Namespace) -> int:
    from . import report
    from .measure import describe, measure_step
    from .session import open_session

    plans = sweep_plans(args)
    check_common(args)
    largest = max(plans, key=lambda p: (p.concurrency, p.request_rate))
    async with open_session(args, largest) as session:
        steps = []
        for plan in plans:
            step = await measure_step(session.load, session.control, session.model.name, args.version, plan,
                                      session.settings, session.progress)
            steps.append(step)
            session.warn_if_delayed(step)
            session.warn_if_client_bound(step)
            if not step.stable:  # reported, and the sweep goes on: the next point may well settle
                session.progress(f"Failed to obtain a stable measurement within {args.max_trials} windows "
                                 f"at {describe(plan)}; try a longer --measurement-interval or a larger "
                                 "--stability-percentage")
    settings = session.settings
    report.print_table(steps, settings)
    stable = [s for s in steps if s.stable]
    open_loop = plans[0].open_loop
    if args.csv:
        report.write_csv(args.csv, stable, settings, open_loop)
    if args.json:
        report.write_json(args.json, {**session.describe(), "steps": [report.step_json(s) for s in steps]})
    if args.plot:
        report.plot_latency_throughput(args.plot, steps, f"{args.model} over {args.protocol}")
    return int(ExitCode.OK if len(stable) == len(steps) else ExitCode.UNSTABLE)
