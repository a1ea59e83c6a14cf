"""Run as a script: load commtag's annotated per-rank JSON with whichever ``hta`` is importable
(HolisticTraceAnalysis 0.5.0 from the venv, or traceinsight 0.6.1 put first on PYTHONPATH: both
install the module ``hta``) and print, as JSON, what it parsed of the collectives.

A subprocess, because the two packages cannot share one interpreter.
"""

from __future__ import annotations

import json
import sys


def main(trace_dir: str) -> None:
    import hta
    from hta.configs.parser_config import ParserConfig
    from hta.trace_analysis import TraceAnalysis

    ParserConfig.enable_communication_args()
    analysis = TraceAnalysis(trace_dir=trace_dir)
    symbols = analysis.t.symbol_table.get_sym_table()
    ranks = {}
    for rank in sorted(analysis.t.get_all_traces()):
        df = analysis.t.get_trace(rank)
        comm = df[df["collective_name"].ne("")]
        ranks[rank] = {
            "collective_name": comm["collective_name"].tolist(),
            "in_msg_nelems": [int(n) for n in comm["in_msg_nelems"]],
            "group_size": [int(n) for n in comm["group_size"]],
            "msg_dtype": comm["msg_dtype"].tolist(),
            "names": [symbols[i] for i in comm["name"]],
        }
    overlap = analysis.get_comm_comp_overlap(visualize=False)
    print(json.dumps({"module": hta.__file__, "ranks": ranks, "overlap_ranks": sorted(int(r) for r in overlap["rank"])}))


if __name__ == "__main__":
    main(sys.argv[1])
