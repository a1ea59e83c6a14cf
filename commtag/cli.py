"""The ``commtag`` console script: a thin layer over the library API."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional, Sequence

import orjson

from commtag.errors import CommtagError


def _cmd_schema(args: argparse.Namespace) -> int:
    from commtag.schema import CollectiveAnnotation, Sidecar

    model = Sidecar if args.sidecar else CollectiveAnnotation
    schema = model.model_json_schema(by_alias=True)
    sys.stdout.write(orjson.dumps(schema, option=orjson.OPT_INDENT_2).decode() + "\n")
    return 0


def _cmd_summary(args: argparse.Namespace) -> int:
    from commtag.report import tables as report
    from commtag.report.hangs import hangs_text, join_profile, load_hangs, only_dumps, summary_json
    from commtag.report.inputs import SummaryInputError, load

    if args.plot is not None and not _can_plot():
        sys.stderr.write("commtag summary: --plot needs matplotlib, which is not installed: "
                         "pip install 'commtag[plot]'\n")
        return 2
    problem = None if args.plot is None else report.plot_target_problem(args.plot, args.input)
    if problem is not None:
        sys.stderr.write(f"commtag summary: {args.plot}: {problem}\n")
        return 2
    warnings: list[str] = []
    notices: list[str] = []
    dumps, join = load_hangs(args.input), None
    try:
        analysis, kernels = load(args.input, straggler_min_skew_us=args.straggler_skew_us,
                                 rank_pattern=args.rank_pattern, rank=args.rank, warnings=warnings, notices=notices,
                                 nccl_inspector=args.nccl_inspector)
        if dumps is not None:  # the same job profiled and dumped: the dumps' entries join its calls
            join = join_profile(args.input, analysis)
    except SummaryInputError as exc:
        if dumps is None or not only_dumps(exc) or args.format == "csv" or args.plot is not None:
            raise
        # Flight Recorder dumps alone: a hung job writes no profile.
        if args.format == "json":
            sys.stdout.buffer.write(summary_json(None, None, dumps))
        else:
            sys.stdout.write(hangs_text(dumps))
        return 0
    sys.stderr.writelines([*(f"commtag summary: notice: {n}\n" for n in notices),
                           *(f"commtag summary: warning: {w}\n" for w in warnings)])
    if args.format == "json":
        sys.stdout.buffer.write(summary_json(analysis, kernels, dumps, join))
    elif args.format == "csv":
        sys.stdout.write(report.to_csv(analysis, args.table))
    else:
        sys.stdout.write(report.to_text(analysis, kernels) + (hangs_text(dumps, join) if dumps is not None else ""))
    if args.plot is not None:
        try:
            report.plot(analysis, args.plot)
        except (OSError, ValueError) as exc:
            sys.stderr.write(f"commtag summary: cannot write the plot {args.plot}: {exc}\n")
            return 2
    return 0


def _can_plot() -> bool:
    """matplotlib is an extra (``commtag[plot]``): checked before the summary's work, not after."""
    try:
        import matplotlib  # noqa: F401 - imported only to learn whether it is installed
    except ImportError:
        return False
    return True


def _cmd_merge(args: argparse.Namespace) -> int:
    from commtag.merge import merge
    from commtag.merge.hangs.trace import dumps_beside_traces, dumps_without_traces

    from commtag.merge.engine.budget import parse_size

    try:
        selection = _selection(args)
        max_output = None if args.max_output.strip().lower() == "none" else parse_size(args.max_output)
    except ValueError as exc:
        sys.stderr.write(f"commtag merge: error: {exc}\n")
        return 2
    dumps_only = dumps_without_traces(args.inputs)
    if dumps_only is not None:  # a hung job: Flight Recorder dumps and no profile
        return _merge_dumps(dumps_only, args.output)
    dumps = dumps_beside_traces(args.inputs)  # read first: a bad dump stops the merge before it writes
    result = merge(args.inputs, args.output, align=args.align, json_dir=args.json, rank_pattern=args.rank_pattern,
                   rank=args.rank, skip_bad_ranks=args.skip_bad_ranks, strict=args.strict,
                   list_left_out=args.verbose, progress=False if args.no_progress else None, selection=selection,
                   max_output=max_output, jobs=args.jobs, nccl_inspector=args.nccl_inspector)
    if not result.lead:
        return 0
    _say("merge", [*(f"notice: {n}" for n in result.notices), *(f"warning: {w}" for w in result.warnings),
          *(f"skipped: {_one_line(e)}" for e in result.skipped),
          *_account_lines(result.accounts, args.verbose)])
    if result.alignment is not None:
        sys.stderr.write(result.alignment.describe() + "\n")
    if dumps:  # the report's modules only where dumps lie beside the traces
        from commtag.report.hangs import beside_profile

        _say("merge", beside_profile(dumps, result.instances))
    sys.stdout.write(f"{result.output}: {len(result.ranks)} ranks, {result.slices} collective slices"
                     " (open it in https://ui.perfetto.dev)\n")
    return _report_desyncs([f.message for f in result.analysis.desyncs] if result.analysis else [], args.strict)


def _merge_dumps(folder: Path, output: Optional[Path]) -> int:
    from commtag.merge.hangs.trace import merge_dumps

    target, drawn, diagnosis = merge_dumps(folder, output)
    _say("merge", [*(f"notice: {n}" for n in diagnosis.notices), *(h.message for h in diagnosis.hangs),
          *(m.message for m in diagnosis.mismatches)])
    sys.stdout.write(f"{target}: {len(diagnosis.ranks)} ranks' Flight Recorder dumps, {drawn} calls, "
                     f"{len(diagnosis.hangs)} hangs (open it in https://ui.perfetto.dev)\n")
    return 0


#: Up to this many ranks the merge says each rank's account; above, one line adds them up
#: (--verbose: every rank's, as below it), so a 1,024-rank merge prints one line, not a thousand.
ACCOUNT_LINES_MAX = 16


def _account_lines(accounts: Sequence, verbose: bool) -> list[str]:
    """What became of every event read: per rank, or for a big job one line over all ranks."""
    if len(accounts) > ACCOUNT_LINES_MAX and not verbose:
        from commtag.merge.account import EventAccount
        from commtag.merge.inputs.selection import describe_numbers

        ranks = describe_numbers([a.rank for a in accounts])
        return [EventAccount.total(accounts).describe(f"{len(accounts)} ranks ({ranks})")
                + " (--verbose: each rank's)"]
    return [line for a in accounts for line in [a.describe(), *(f"  left out: {x}" for x in a.listed)]]


def _say(command: str, lines: list[str]) -> None:
    """Lines for the user on stderr, each as ``commtag COMMAND: LINE``."""
    for line in lines:
        sys.stderr.write(f"commtag {command}: {line}\n")
    sys.stderr.flush()


def _selection(args: argparse.Namespace):
    """The --steps/--window/--detail choice, or None for the whole job (ValueError: a bad spec)."""
    from commtag.merge.inputs.selection import Selection, parse_detail, parse_numbers, parse_window

    if args.steps is None and args.window is None and args.detail is None:
        return None
    return Selection(
        steps=parse_numbers(args.steps, "--steps") if args.steps is not None else None,
        window=parse_window(args.window) if args.window is not None else None,
        detail=parse_detail(args.detail) if args.detail is not None else None,
    )


def _one_line(exc: Exception) -> str:
    """An error as one line: the file, then the problem."""
    return " ".join(str(exc).split())


def _report_desyncs(desyncs: list[str], strict: bool) -> int:
    """Desyncs go to stderr, one line each (group, Seq, ranks, fields); --strict makes them fatal."""
    _say("merge", desyncs)
    if desyncs and strict:
        _say("merge", [f"--strict: {len(desyncs)} desync(s) between ranks"])
        return 1
    return 0


def _cmd_validate(args: argparse.Namespace) -> int:
    from commtag.merge.pftrace.validate import validate_file

    violations = validate_file(args.file)
    for violation in violations:
        sys.stdout.write(f"{args.file}: {violation}\n")
    if violations:
        sys.stderr.write(f"commtag validate: {args.file}: {len(violations)} violation(s)\n")
        return 1
    sys.stdout.write(f"{args.file}: OK\n")
    return 0


def _cmd_export_fr(args: argparse.Namespace) -> int:
    from commtag.merge.hangs.export import export_fr, job_instances

    warnings: list[str] = []
    exported = export_fr(job_instances(args.input, args.rank_pattern, args.rank, warnings), args.output)
    sys.stderr.writelines([*(f"commtag export-fr: warning: {w}\n" for w in warnings),
                           *(f"commtag export-fr: left out {n}: {why}\n" for why, n in sorted(exported.left_out.items()))])
    sys.stdout.write(f"{args.output}: {len(exported.paths)} Flight Recorder dumps, {exported.entries} entries "
                     f"(python -m torch.distributed.flight_recorder.fr_trace {args.output})\n")
    return 0


def add_rank_arguments(parser: argparse.ArgumentParser) -> None:
    """How a trace that names no rank gets one: merge and summary read traces alike, and the
    error that cites these options comes from either."""
    parser.add_argument("--rank-pattern", metavar="REGEX",
                        help="regex with one group giving the rank from a file name, for traces without "
                             "distributedInfo or sidecar (default rule: rank<N>, rank-<N>, rank_<N>, worker<N>)")
    parser.add_argument("--rank", type=int, metavar="N",
                        help="the rank of a single trace that names none (no distributedInfo, sidecar or "
                             "rank in its file name)")


def add_merge_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of `commtag merge` (which `python -m commtag.merge` runs)."""
    parser.add_argument("inputs", type=Path, nargs="+", metavar="DIR_OR_TRACE",
                        help="directories of rank traces (.json/.json.gz) and sidecars, or trace files")
    parser.add_argument("-o", "--output", type=Path, metavar="FILE",
                        help="the .pftrace to write (default: DIR/merged.pftrace)")
    parser.add_argument("--align", choices=("none", "collectives"), default="none",
                        help="collectives: correct each host's clock from collectives that end together")
    parser.add_argument("--json", type=Path, metavar="DIR2",
                        help="also write each rank's annotated Chrome JSON there (for HTA, TraceLens)")
    add_rank_arguments(parser)
    parser.add_argument("-j", "--jobs", type=_positive, metavar="N",
                        help="merge worker processes on this host, same trace (default: the CPUs this process may "
                             "use, fewer for small inputs; 1: this process alone; ignored under torchrun)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--steps", metavar="SPEC",
                        help="keep only these profiler steps (ProfilerStep#N) on every rank, lanes included: "
                             "a list or ranges, e.g. 3 or 2,5-7; what is left out is counted per rank")
    parser.add_argument("--window", metavar="START_MS:END_MS",
                        help="keep only events starting in this window, in ms from the job's first event (the "
                             "earliest of any rank), on every rank, lanes included")
    parser.add_argument("--detail", metavar="SPEC",
                        help="ranks whose full timelines (CPU threads, GPU streams, launches, flows) are written: "
                             "all (default), none (the comm view of the whole job) or a list like 0,8-15; "
                             "every rank still gives its lanes and analysis")
    parser.add_argument("--max-output", default="1.5G", metavar="SIZE",
                        help="stop before writing (exit 2) when the merged trace is estimated above SIZE, "
                             "saying which --detail or --steps would fit (default %(default)s; none: no limit)")
    parser.add_argument("--skip-bad-ranks", action="store_true",
                        help="leave out unreadable or inconsistent files and ranks, merge the rest, and list "
                             "what was skipped and why (default: stop at the first, writing nothing)")
    parser.add_argument("--verbose", action="store_true",
                        help="say each rank's events read, written and left out (by reason) also above "
                             "16 ranks (one line adds them up otherwise), and list every event left out: "
                             "file, index, name, reason")
    parser.add_argument("--strict", action="store_true",
                        help="exit 2 writing nothing where files may be of different runs (what is otherwise "
                             "a warning: days apart, another host); exit 1 when ranks disagree on a collective "
                             "(op, size, dtype, missing rank, Seq gap), the trace still written")
    add_inspector_argument(parser)


def add_inspector_argument(parser: argparse.ArgumentParser) -> None:
    """--nccl-inspector, for merge and summary alike."""
    parser.add_argument("--nccl-inspector", type=Path, metavar="DIR",
                        help="a folder of NCCL Inspector dumps (<host>-pid<pid>.log): each record joins its "
                             "collective, which then carries NCCL's own busbw, algbw and time beside commtag's")


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of workers (1 or more)")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="commtag", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    schema = sub.add_parser("schema", help="print the JSON Schema of an annotation (or a sidecar)")
    schema.add_argument("--sidecar", action="store_true", help="the whole sidecar file instead")
    schema.set_defaults(func=_cmd_schema)

    merge = sub.add_parser("merge", help="merge every rank's trace and sidecar into one Perfetto .pftrace")
    add_merge_arguments(merge)
    merge.set_defaults(func=_cmd_merge)

    validate = sub.add_parser("validate", help="check a .pftrace against trace_processor's import rules")
    validate.add_argument("file", type=Path, help="the .pftrace to check")
    validate.set_defaults(func=_cmd_validate)

    summary = sub.add_parser(
        "summary", help="per group and op: count, bytes, time, skew, busbw, stragglers, desyncs"
    )
    summary.add_argument("input", type=Path, metavar="DIR_OR_TRACE_OR_MERGED_OUTPUT",
                         help="a directory of rank traces (+ sidecars), one trace, "
                              "or a .pftrace written by `commtag merge`")
    summary.add_argument("--format", choices=("text", "csv", "json"), default="text")
    summary.add_argument("--table", choices=("summary", "impact", "all_to_all"), default="summary",
                         help="the table --format csv writes: per group and op (default), what each late rank "
                              "cost (impact), or each all-to-all's rank-pair traffic (all_to_all)")
    summary.add_argument("--plot", type=Path, metavar="FILE.png",
                         help="also draw the ranks x collectives skew heatmap and busbw per group")
    summary.add_argument("--straggler-skew-us", type=float, default=1000.0, metavar="US",
                         help="name the last rank a straggler from this skew on (and at least the "
                              "collective's own time and 10x the run's noise, see README; default %(default)s)")
    add_rank_arguments(summary)
    add_inspector_argument(summary)
    summary.set_defaults(func=_cmd_summary)

    export = sub.add_parser("export-fr", help="write a profiled job's collectives as Flight Recorder dumps "
                                              "(torch's pickle format and naming), for torch's fr_trace")
    export.add_argument("input", type=Path, metavar="DIR_OR_MERGED_OUTPUT",
                        help="a directory of rank traces (+ sidecars), or a .pftrace written by `commtag merge`")
    export.add_argument("-o", "--output", type=Path, required=True, metavar="DIR",
                        help="the folder of dumps to write (commtag_export_rank_<R>; none may exist yet)")
    add_rank_arguments(export)
    export.set_defaults(func=_cmd_export_fr)
    return parser


#: The shell's exit status for a command stopped by Ctrl-C (128 + SIGINT) or by SIGTERM (128 + 15).
EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143


def main(argv: Optional[Sequence[str]] = None) -> int:
    from commtag.merge.errors import Terminated, sigterm_stops_cleanly

    args = build_parser().parse_args(argv)
    try:
        with sigterm_stops_cleanly():
            return int(args.func(args))
    except CommtagError as exc:  # every error raised on purpose: one line each, no traceback
        _say(args.command, [f"error: {_one_line(told)}" for told in exc.told()])
        return exc.exit_code
    except KeyboardInterrupt as exc:
        # The merge's temporaries are gone by now (its cleanup ran on the way out); outputs
        # appear only by an atomic rename, so the previous ones are as they were.
        how = "terminated" if isinstance(exc, Terminated) else "interrupted"
        sys.stderr.write(f"commtag {args.command}: {how}; no file was changed\n")
        return EXIT_TERMINATED if isinstance(exc, Terminated) else EXIT_INTERRUPTED
