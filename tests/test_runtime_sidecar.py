"""Sidecar files: round trip, atomic writes, and clear refusal of bad files."""

from __future__ import annotations

import gzip
from pathlib import Path

import orjson
import pytest

from commtag.constants import MAX_UNWATCHED_SPANS, SCHEMA_VERSION, sidecar_name_for
from commtag.runtime.record.sidecar import write_sidecar
from commtag.sidecarfile import SidecarError, read_sidecar
from commtag.schema import Sidecar

#: The version a sidecar written now carries, and the next one (a reader must refuse it).
_VERSION = f'"schema_version":{SCHEMA_VERSION}'.encode()
_NEXT_VERSION = f'"schema_version":{SCHEMA_VERSION + 1}'.encode()


def _sidecar(**overrides) -> Sidecar:
    annotation = {
        "Collective name": "allreduce", "In msg nelems": 4, "Out msg nelems": 4, "Group size": 2,
        "dtype": "Float", "Global rank start": 0, "Global rank stride": 1, "Process Group Name": "0",
        "Process Group Description": "default_pg", "Process Group Ranks": "[0, 1]", "Rank": 1, "Seq": 3,
        "commtag lane id": 123, "commtag lane": "PG 0 (default_pg) [0, 1]", "commtag pg uid": "0:abc",
    }
    data = {
        "run_id": "run-1", "rank": 1, "world_size": 2, "host": "h", "pid": 7, "torch_version": "2.13.0",
        "trace_file": "rank1.step3.pt.trace.json.gz",
        "process_groups": [{"uid": "0:abc", "name": "0", "desc": "default_pg", "ranks": [0, 1],
                            "backend": "gloo", "lane_id": 123, "lane_name": "PG 0 (default_pg) [0, 1]"}],
        "collectives": [{"annotation": annotation, "start_ns": 10, "end_ns": 25, "tid": 99}],
    }
    data.update(overrides)
    return Sidecar.model_validate(data)


def test_round_trip(tmp_path: Path):
    side = _sidecar()
    path = write_sidecar(tmp_path / "rank1.step3.commtag.json", side)
    assert read_sidecar(path) == side
    raw = orjson.loads(path.read_bytes())
    assert raw["collectives"][0]["annotation"]["Collective name"] == "allreduce"  # eager keys on disk
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary left behind


def test_sidecar_next_to_its_trace():
    # The name trace_handler gives a trace's sidecar, and the merge looks for.
    assert sidecar_name_for("rank2.step5.pt.trace.json.gz") == "rank2.step5.commtag.json"


@pytest.mark.parametrize(
    "content, problem",
    [
        (lambda good: good[: len(good) // 2], "not valid JSON"),
        (lambda good: b"", "not valid JSON"),
        (lambda good: orjson.dumps({"traceEvents": []}), "not a commtag sidecar"),
        (lambda good: orjson.dumps([1, 2]), "not a commtag sidecar"),
        (lambda good: good.replace(_VERSION, b'"schema_version":99'), "newer than this commtag"),
        (lambda good: good.replace(b'"Group size":2', b'"Group size":3'), "Group size"),
        (lambda good: good.replace(b'"dtype":"Float"', b'"dtype":"float32"'), "dtype"),
        (lambda good: good.replace(b'"In msg nelems":4', b'"In msg nelems":-4'), "In msg nelems"),
        # a rank list is checked however often the same text was valid before (the check is cached)
        (lambda good: good.replace(b'"Process Group Ranks":"[0, 1]"', b'"Process Group Ranks":"[0,1]"'),
         "Process Group Ranks"),
        (lambda good: good.replace(b'"In split size":"[]"', b'"In split size":"[1, 2"'), "In split size"),
        # the group checks read each group's members once (sets): a peer or rank outside still fails
        (lambda good: good.replace(b'"Rank":1', b'"Rank":1,"Dst Rank":5'), "Dst Rank: global rank 5 is not in"),
        (lambda good: good.replace(b'"ranks":[0,1]', b'"ranks":[0,2]'), "this rank \\(1\\) is not a member"),
        (lambda good: good.replace(b'"Process Group Ranks":"[0, 1]"', b'"Process Group Ranks":"[0, 1, 2]"'),
         "Group size: 2 but Process Group Ranks lists 3 ranks"),
        # the spans in which commtag was not installed: ordered, and few (the merge cuts windows by each)
        (lambda good: good.replace(b'"unwatched":[]', b'"unwatched":[{"start_ns":9,"end_ns":3}]'),
         "unwatched.0: Value error, end_ns 3 is before start_ns 9"),
        (lambda good: good.replace(b'"unwatched":[]', b'"unwatched":[' + b",".join(
            [b'{"start_ns":1,"end_ns":2}'] * (MAX_UNWATCHED_SPANS + 1)) + b"]"), "unwatched: List should have at most"),
    ],
)
def test_bad_files_are_refused_naming_file_and_problem(tmp_path: Path, content, problem):
    good = write_sidecar(tmp_path / "good.commtag.json", _sidecar()).read_bytes()
    bad = tmp_path / "bad.commtag.json"
    bad.write_bytes(content(good))
    assert bad.read_bytes() != good
    with pytest.raises(SidecarError, match=problem) as info:
        read_sidecar(bad)
    assert str(bad) in str(info.value)


def test_missing_file_is_refused(tmp_path: Path):
    with pytest.raises(SidecarError, match="cannot read"):
        read_sidecar(tmp_path / "nope.commtag.json")


def test_failed_write_keeps_the_previous_file(tmp_path: Path):
    path = write_sidecar(tmp_path / "rank1.step3.commtag.json", _sidecar())
    before = path.read_bytes()
    invalid = _sidecar().model_copy(update={"rank": 5})  # model_copy skips validation
    with pytest.raises(ValueError):
        write_sidecar(path, invalid)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == [path.name]


def test_a_sidecar_written_before_backend_detection_loads_as_legacy(tmp_path: Path):
    """The group entry's backend_impls and record_format came with schema version 2: a version-1
    sidecar, without them, still loads, and its groups' annotations read as the legacy format they
    were written in."""
    side = _sidecar()
    path = write_sidecar(tmp_path / "rank1.step3.commtag.json", side)
    raw = orjson.loads(path.read_bytes())
    assert raw["schema_version"] == SCHEMA_VERSION == 3
    raw["schema_version"] = 1
    del raw["unwatched"]  # came with version 3
    for group in raw["process_groups"]:
        del group["backend_impls"], group["record_format"]
    path.write_bytes(orjson.dumps(raw))
    (group,) = read_sidecar(path).process_groups
    assert group.record_format == "legacy" and group.backend_impls == {}
    assert read_sidecar(path).schema_version == 1
    assert read_sidecar(path).unwatched == []


def test_an_nccl2_group_entry_and_its_annotation_round_trip(tmp_path: Path):
    """nccl2's annotations leave out the description, rank start / stride and peers, and list no
    ranks; the group entry says which implementation wrote them."""
    side = _sidecar()
    group = side.process_groups[0].model_copy(update={"backend": "nccl", "backend_impls": {"cuda": "nccl2"},
                                                       "record_format": "nccl2"})
    annotation = side.collectives[0].annotation.model_copy(update={
        "collective_name": "all_reduce", "pg_desc": None, "pg_ranks": "[]", "global_rank_start": None,
        "global_rank_stride": None, "in_split_size": "[4]", "out_split_size": "[4]"})
    side = side.model_copy(update={"process_groups": [group],
                                   "collectives": [side.collectives[0].model_copy(update={"annotation": annotation})]})
    path = write_sidecar(tmp_path / "rank1.step3.commtag.json", side)
    back = read_sidecar(path)
    assert back == side and back.process_groups[0].record_format == "nccl2"
    eager = orjson.loads(path.read_bytes())["collectives"][0]["annotation"]
    assert "Process Group Description" not in eager and eager["Process Group Ranks"] == "[]"


#: Whether the merge's discovery, which reads only a sidecar's head, refuses the file too (False:
#: the fault lies in a field the head parses past; the rank's conversion refuses it).
HEAD, WHOLE = True, False


@pytest.mark.parametrize(
    "content, problem, head",
    [
        (lambda good: b"[1, 2]", "not a commtag sidecar (its JSON is an array, not an object)", HEAD),
        (lambda good: b'"commtag-sidecar"', "not a commtag sidecar (its JSON is a string, not an object)", HEAD),
        (lambda good: good.replace(b'"kind":"commtag-sidecar"', b'"kind":"chrome-trace"'),
         "not a commtag sidecar (kind is 'chrome-trace', expected 'commtag-sidecar')", HEAD),
        # complete otherwise: the model's default kind serves Python callers, a file must name it
        (lambda good: good.replace(b'"kind":"commtag-sidecar",', b""),
         "not a commtag sidecar (it names no kind, expected 'commtag-sidecar')", HEAD),
        (lambda good: b'{"traceEvents": []}', "not a commtag sidecar (it names no kind, expected 'commtag-sidecar')", HEAD),
        # a newer format is said to be one, not listed as the fields it renamed
        (lambda good: good.replace(_VERSION, _NEXT_VERSION).replace(b'"run_id"', b'"run"'),
         f"invalid sidecar: schema_version: Value error, sidecar schema version {SCHEMA_VERSION + 1} is newer than this commtag", HEAD),
        # NaN and Infinity parse as floats, and no field of a sidecar is one: refused, naming the field
        (lambda good: good.replace(b'"start_ns":10', b'"start_ns":NaN'),
         "invalid sidecar: collectives.0.start_ns: Input should be a finite number", WHOLE),
        (lambda good: good.replace(b'"pid":7', b'"pid":-Infinity'), "invalid sidecar: pid: Input should be a finite number",
         WHOLE),
        (lambda good: good.replace(b'"rank":1', b'"rank":Infinity'), "invalid sidecar: rank: Input should be a finite number",
         HEAD),
        (lambda good: good.replace(b'"host":"h"', b'"host":"h\xff"'), "invalid sidecar: not UTF-8 text (byte 0xff at offset",
         HEAD),
        (lambda good: gzip.compress(good)[:-9], "truncated or corrupt gzip", HEAD),
    ],
)
def test_one_reader_one_refusal_in_both_wings(tmp_path: Path, content, problem, head):
    """read_sidecar (tests, tools) and the merge's discovery and conversion read a sidecar with the
    same reader: the same file is refused in the same words, the merge's as its own input error."""
    from commtag.merge.errors import MergeInputError
    from commtag.merge.inputs.sidecars import load_sidecar, load_sidecar_head

    good = write_sidecar(tmp_path / "good.commtag.json", _sidecar()).read_bytes()
    bad = tmp_path / "bad.commtag.json"
    bad.write_bytes(content(good))
    with pytest.raises(SidecarError) as info:
        read_sidecar(bad)
    assert str(info.value).startswith(f"{bad}: {problem}"), info.value
    with pytest.raises(MergeInputError) as merged:
        load_sidecar(bad)
    assert str(merged.value) == str(info.value) and merged.value.problem == info.value.problem
    if head:
        with pytest.raises(MergeInputError) as discovered:
            load_sidecar_head(bad)
        assert str(discovered.value) == str(info.value)
    else:
        assert load_sidecar_head(bad).rank == 1


def test_a_gzipped_sidecar_reads_as_the_plain_one(tmp_path: Path):
    path = write_sidecar(tmp_path / "rank1.step3.commtag.json", _sidecar())
    zipped = tmp_path / "rank1.step3.commtag.json.gz"
    zipped.write_bytes(gzip.compress(path.read_bytes()))
    assert read_sidecar(zipped) == read_sidecar(path) == _sidecar()
