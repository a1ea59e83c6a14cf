"""Inputs are data only: nothing in commtag unpickles or evaluates, and no path read from an
input file decides where the merge writes.

Traces and sidecars come from other machines and other people; a merge must
be safe to run on them. The source scan reads commtag's own modules (AST, so
comments and strings do not count); the path tests feed a merge sidecars and
traces whose fields hold ``../`` and absolute paths, then compare every file
under the test's directory before and after.
"""

from __future__ import annotations

import ast
import gzip
import shutil
from pathlib import Path

import orjson
import pytest

import commtag
from commtag.cli import main
from commtag.merge.pftrace.validate import validate_file
from commtag.testing import PUBLIC_TRACES

PACKAGE = Path(commtag.__file__).resolve().parent
HTA = PUBLIC_TRACES / "hta-sampled-2rank"

#: Modules whose loading runs code from the data.
UNSAFE_MODULES = {"pickle", "cPickle", "_pickle", "marshal", "shelve", "dill", "cloudpickle", "joblib", "yaml"}
#: Builtins that run text as code.
UNSAFE_BUILTINS = {"eval", "exec", "compile"}
#: Written on the line of an exec() or compile() of text commtag builds itself from its own
#: names (the idle path's wrappers, as dataclasses builds __init__): not input data. Each
#: such line is listed in OWN_CODE, so a new one is a decision, not an accident.
OWN_CODE_MARK = "# commtag's own text, not input data"
OWN_CODE = {"commtag/runtime/install/idle.py"}
#: Calls that unpickle under the hood.
UNSAFE_CALLS = {("torch", "load"), ("np", "load"), ("numpy", "load"), ("pd", "read_pickle"),
                ("pandas", "read_pickle"), ("pickle", "load"), ("pickle", "loads")}
#: The modules that may import pickle, and why: Flight Recorder dumps are torch's pickles. One reads
#: them through its class-refusing unpickler (never pickle.load/loads, flagged above); the others write them.
PICKLE_MODULES = {"commtag/merge/hangs/dumps.py", "commtag/merge/hangs/export.py", "commtag/runtime/record/ring.py",
                  "commtag/testing/fr_dumps.py"}
#: torch.distributed's object collectives pickle what they carry.
UNSAFE_METHODS = {"all_gather_object", "broadcast_object_list", "gather_object", "scatter_object_list",
                  "send_object_list", "recv_object_list", "loads"}


def _findings(source: str, label: str) -> list[str]:
    found = []
    lines = source.splitlines()
    for node in ast.walk(ast.parse(source, filename=label)):
        where = f"{label}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.Import):
            found += [f"{where}: import {a.name}" for a in node.names if a.name.split(".")[0] in UNSAFE_MODULES
                      and not (a.name == "pickle" and label in PICKLE_MODULES)]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in UNSAFE_MODULES:
            found.append(f"{where}: from {node.module} import")
        elif isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Name) and func.id in UNSAFE_BUILTINS:
                if not (label in OWN_CODE and OWN_CODE_MARK in lines[node.lineno - 1]):
                    found.append(f"{where}: {func.id}()")
            elif isinstance(func, ast.Name) and func.id == "__import__" and not (
                    node.args and isinstance(node.args[0], ast.Constant)):
                found.append(f"{where}: __import__ of a computed name")
            elif isinstance(func, ast.Attribute):
                owner = func.value.id if isinstance(func.value, ast.Name) else None
                if (owner, func.attr) in UNSAFE_CALLS:
                    found.append(f"{where}: {owner}.{func.attr}()")
                elif func.attr in UNSAFE_METHODS and owner not in ("orjson", "json"):
                    found.append(f"{where}: .{func.attr}()")
    return found


def test_no_pickle_or_eval_in_commtag():
    sources = sorted(PACKAGE.rglob("*.py"))
    assert len(sources) > 20  # the whole package, runtime and merge
    findings = [f for path in sources for f in _findings(path.read_text(), str(path.relative_to(PACKAGE.parent)))]
    assert findings == []
    marked = {str(p.relative_to(PACKAGE.parent)) for p in sources if OWN_CODE_MARK in p.read_text()}
    assert marked == OWN_CODE


def test_the_scan_finds_what_it_looks_for():
    """The scanner itself: each unsafe form is reported, safe look-alikes are not."""
    found = _findings(SOURCE_WITH_EVERYTHING, "probe.py")
    assert [f.split(": ", 1)[1] for f in found] == [
        "import pickle", "from marshal import", "eval()", "exec()", "exec()", "__import__ of a computed name",
        "torch.load()", ".all_gather_object()", "pickle.loads()",
    ]
    # The mark only counts in the files listed for it.
    listed = [f.split(": ", 1)[1] for f in _findings(SOURCE_WITH_EVERYTHING, "commtag/runtime/install/idle.py")]
    assert listed.count("exec()") == 1


SOURCE_WITH_EVERYTHING = '''
import pickle
from marshal import loads as m
import re, orjson
eval("1")
exec("x = 1")
exec("y = 2")  # commtag's own text, not input data
__import__(name)
torch.load(f)
dist.all_gather_object(out, obj)
pickle.loads(b"")
re.compile("x")          # fine
orjson.loads(b"{}")      # fine
__import__("sys")        # fine: a literal module name
'''


# ---------------------------------------------------------------------------
# No path from an input file is used to write outside the output directory.


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _sidecar_for(trace_file: str, rank: int) -> dict:
    ann = {
        "Collective name": "allreduce", "In msg nelems": 4, "Out msg nelems": 4, "Group size": 2, "dtype": "Float",
        "Process Group Name": "../../pg", "Process Group Description": "/etc/passwd",
        "Process Group Ranks": "[0, 1]", "Rank": rank, "Seq": 1, "commtag lane id": 99,
        "commtag lane": "../../../tmp/lane", "commtag pg uid": "../uid",
    }
    return {
        "kind": "commtag-sidecar", "schema_version": 1, "run_id": "../../run", "rank": rank, "world_size": 2,
        "host": "../../host", "pid": 1, "torch_version": "2", "trace_file": trace_file,
        "process_groups": [{"uid": "../uid", "name": "../../pg", "desc": "/etc/passwd", "ranks": [0, 1],
                            "backend": "gloo", "lane_id": 99, "lane_name": "../../../tmp/lane"}],
        "collectives": [{"annotation": ann, "start_ns": 1682725897226747000, "end_ns": 1682725897226748000,
                         "tid": 1, "thread_name": "../../thread"}],
    }


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """inputs/ holds two public ranks; outputs go to out/ and json/; everything else must stay as it is."""
    inputs = tmp_path / "deep" / "inputs"
    inputs.mkdir(parents=True)
    for src in sorted(HTA.iterdir()):
        shutil.copy(src, inputs / src.name)
    (tmp_path / "out").mkdir()
    (tmp_path / "bystander.txt").write_text("must survive")
    return tmp_path


@pytest.mark.parametrize("trace_file", ["../sampled_rank-0.json.gz", "../../bystander.txt", "/etc/passwd",
                                        "..", "sub/../sampled_rank-0.json.gz", "..\\sampled_rank-0.json.gz"])
def test_sidecar_trace_file_with_a_path_is_refused(trace_file: str, workdir: Path, capsys):
    side = workdir / "deep" / "inputs" / "sampled_rank-0.commtag.json"
    side.write_bytes(orjson.dumps(_sidecar_for(trace_file, 0)))
    before = _snapshot(workdir)
    code = main(["merge", "--no-progress", str(workdir / "deep" / "inputs"), "-o", str(workdir / "out" / "m.pftrace"),
                 "--json", str(workdir / "json")])
    err = capsys.readouterr().err
    assert code == 2 and f"{side}: invalid sidecar: trace_file" in err and "bare file name" in err
    assert _snapshot(workdir) == before


def test_path_like_fields_in_traces_and_sidecars_write_only_into_the_outputs(workdir: Path, capsys):
    inputs = workdir / "deep" / "inputs"
    evil = "../../../" + str(workdir / "pwned")
    for path in sorted(inputs.glob("*.json.gz")):
        trace = orjson.loads(gzip.decompress(path.read_bytes()))
        trace["traceName"] = evil
        trace["host_name"] = "../../bystander.txt"
        trace["distributedInfo"] = {"rank": int(path.name[-9]), "world_size": 2, "backend": "../gloo",
                                    "pg_config": [{"pg_name": evil, "pg_desc": "/etc/passwd", "ranks": [0, 1]}]}
        for e in trace["traceEvents"][:50]:
            if e.get("ph") == "M" and e.get("name") == "thread_name":
                e["args"]["name"] = evil
            elif e.get("ph") == "X":
                e["name"] = evil
                e.setdefault("args", {})["file"] = "/etc/passwd"
        path.write_bytes(gzip.compress(orjson.dumps(trace)))
    (inputs / "sampled_rank-1.commtag.json").write_bytes(orjson.dumps(_sidecar_for("sampled_rank-1.json.gz", 1)))
    before = _snapshot(workdir)

    out = workdir / "out" / "m.pftrace"
    code = main(["merge", "--no-progress", str(inputs), "-o", str(out), "--json", str(workdir / "json")])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert validate_file(out) == []
    after = _snapshot(workdir)
    new = sorted(set(after) - set(before))
    assert new == ["json/sampled_rank-0.json.gz", "json/sampled_rank-1.json.gz", "out/m.pftrace"]
    assert {k: v for k, v in after.items() if k in before} == before  # nothing else touched
    assert not (workdir / "pwned").exists()
