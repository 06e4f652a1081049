"""Flight-recorder dumps (issue 13 item 4): scripts/flight_recorder.py reading files a hostile
user may have planted (links, FIFOs, pickles with globals, truncated, oversize), and
diagnostics/builtin/stacks/flight_recorder.py judging what came back. The dumps are a real 4-rank gloo job's
(tests/fixtures/stacks/fr/, see its README); the real job end to end:
tests/integration/test_stacks_fr.py."""

import copy
import json
import os
import pickle
import random
import shutil
import subprocess

import pytest

from diagnostics.builtin.stacks import flight_recorder as stacks_fr
from tests.programs import SCRIPTS, codes, load_script

fr = load_script("flight_recorder.py", "mldiag_test_flight_recorder")
FIXTURES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures",
                        "stacks", "fr")
PREFIX = os.path.join(FIXTURES, "comm_lib_trace_rank_")
LEVELS = {"ok", "info", "warn", "fail"}
CODES = {"fr-ranks-diverge", "fr-missing-dumps", "fr-agree", "fr-bad-dump", "fr-duplicate-rank",
         "fr-stale-dumps"}


def raw_dump(rank):
    with open(PREFIX + str(rank), "rb") as f:
        return pickle.load(f)      # the recorded fixture, plain data (asserted below)


@pytest.fixture
def planted(tmp_path):
    """A directory holding copies of the recorded dumps under the prefix ``fr_``."""
    for rank in range(4):
        shutil.copyfile(PREFIX + str(rank), tmp_path / f"fr_{rank}")
    return tmp_path


# -- the recorded dumps -------------------------------------------------------------------------

def test_recorded_dumps_are_plain_data():
    import pickletools
    for rank in range(4):
        with open(PREFIX + str(rank), "rb") as f:
            ops = {op.name for op, _, _ in pickletools.genops(f.read())}
        assert not ops & {"GLOBAL", "STACK_GLOBAL", "REDUCE", "INST", "OBJ", "NEWOBJ", "NEWOBJ_EX",
                          "BUILD", "EXT1", "EXT2", "EXT4", "PERSID", "BINPERSID"}


def test_collect_summarises_each_rank():
    result = fr.collect([PREFIX])
    assert result["prefixes"] == [PREFIX] and result["more_files"] == 0
    dumps = result["dumps"]
    assert [d["rank"] for d in dumps] == [0, 1, 2, 3]
    assert all("error" not in d and d["format"] == "pickle" and d["version"] == "2.10" for d in dumps)
    for d in dumps:
        assert d["pg_config"] == {"": {"name": "", "desc": "", "ranks": [[0, 3]], "ranks_count": 4}}
        status = d["pg_status"]["0"]
        assert status["name"] == "0" and status["desc"] == "default_pg"
        assert status["last_started_collective"] == -1 and status["last_completed_collective"] == 1
        assert {e["state"] for e in d["entries"]} == {"scheduled"}
        assert d["file"] == PREFIX + str(d["rank"]) and d["size"] == os.path.getsize(d["file"])
    assert [d["pg_status"]["0"]["last_enqueued_collective"] for d in dumps] == [2, 2, 2, 1]
    assert [d["entries_total"] for d in dumps] == [2, 2, 2, 1]
    assert dumps[0]["pg_status"]["0"]["recent_ops"] == [[1, "gloo:all_reduce"], [2, "gloo:all_reduce"]]
    entry = dumps[0]["entries"][-1]
    assert entry["collective_seq_id"] == 2 and entry["op_id"] == 2 and entry["record_id"] == 1
    assert entry["profiling_name"] == "gloo:all_reduce" and entry["process_group"] == ["0", "default_pg"]
    assert entry["input_sizes"] == [[4]] and entry["output_sizes"] == [[4]]
    assert entry["is_p2p"] is False and entry["retired"] is False and entry["timeout_ms"] == 120000
    # frames: torch's innermost, then the program's own (the library's wrapper left out)
    assert [f["name"] for f in entry["frames"]] == ["all_reduce", "sync", "main", "<module>"]
    assert entry["frames"][1]["filename"].endswith("fr_gloo_job.py") and entry["frames_total"] == 5
    json.dumps(result)                                        # what goes over the wire


def test_analyse_names_rank_3_and_the_collective():
    findings, lines = stacks_fr.analyse([("trainbox", fr.collect([PREFIX]))])
    assert codes(findings) == ["fr-ranks-diverge"]
    assert findings[0]["level"] == "fail" and findings[0]["action"] == "none"
    assert findings[0]["message"] == (
        "flight recorder: pg 0 (default_pg) diverges at collective #2 (all_reduce): ranks 0-2 "
        "enqueued all_reduce #2, rank 3 (on trainbox) is at #1 (all_reduce)")
    assert lines == ["flight recorder: 4 dumps, ranks 0-3 on trainbox, format 2.10",
                     "  pg 0 (default_pg): ranks 0-2 at #2 all_reduce; rank 3 at #1 all_reduce"
                     "   ← diverge at #2"]
    dumps, errors, duplicates = stacks_fr.merge([("trainbox", fr.collect([PREFIX]))])
    groups = stacks_fr.divergences(dumps)
    (d,) = groups.diverged
    assert (d.group, d.seq, d.op) == ("0", 2, "all_reduce")
    assert d.ahead == {0: 2, 1: 2, 2: 2} and d.behind == {3: 1}
    assert groups.members == {"0": frozenset(range(4))} and groups.source == {"0": "pg_config"}
    assert not errors and not duplicates


def test_ranks_on_several_targets():
    dumps = fr.collect([PREFIX])["dumps"]
    findings, lines = stacks_fr.analyse([("node-a", {"dumps": dumps[:2]}), ("node-b", {"dumps": dumps[2:]})])
    assert codes(findings) == ["fr-ranks-diverge"]
    assert "rank 3 (on node-b) is at #1" in findings[0]["message"]
    assert lines[0] == "flight recorder: 4 dumps, ranks 0-3 on node-a,node-b, format 2.10"


def test_gloo_empty_pg_config_key_gives_the_members():
    """pg_config {'': ranks '[0, 1, 2, 3]'} (torchfrtrace: KeyError ('0', N)): the default
    group's members, so the rank without a dump is named."""
    dumps = fr.collect([PREFIX])["dumps"][:3]
    findings, lines = stacks_fr.analyse([("trainbox", {"dumps": dumps})])
    assert codes(findings) == ["fr-missing-dumps", "fr-agree"]
    assert findings[0]["level"] == "warn"
    assert findings[0]["message"] == ("flight recorder: no dump from rank 3 (3 of 4 ranks dumped; "
                                      "members from pg_config)")
    assert findings[1]["level"] == "info"
    assert "pg 0 (default_pg) at #2 (all_reduce), not completed on ranks 0-2" in findings[1]["message"]
    assert lines[-1] == "  no dump: rank 3"


def test_empty_key_not_believed_when_it_leaves_out_a_rank(tmp_path):
    """The 1-process world writes '' → '[]'; a '' that does not hold the ranks that have the
    group is not their membership (world_size decides then)."""
    dump = raw_dump(0)
    dump["pg_config"] = {"": {"name": "", "desc": "", "ranks": "[]"}}
    for rank in (0, 1):
        (tmp_path / f"fr_{rank}").write_bytes(pickle.dumps(dump, protocol=2))
    collected = fr.collect([str(tmp_path / "fr_")])
    assert collected["dumps"][0]["pg_config"][""]["ranks_count"] == 0
    findings, _ = stacks_fr.analyse([("t", collected)])
    assert codes(findings) == ["fr-agree"]
    findings, _ = stacks_fr.analyse([("t", collected)], world_size=4)
    assert codes(findings) == ["fr-missing-dumps", "fr-agree"]
    assert "no dump from ranks 2-3 (2 of 4 ranks dumped; members from the job's world size)" in findings[0]["message"]


def test_named_groups_as_nccl_writes_them(tmp_path):
    """NCCL's shape: pg_config keyed by group name, a subgroup of some ranks; divergence in the
    subgroup only, a member without a dump named."""
    def dump(rank, world_seq, sub_seq):
        d = raw_dump(0)
        d["pg_config"] = {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1, 2, 3, 4, 5]"},
                          "1": {"name": "1", "desc": "tp", "ranks": "[0, 1, 2]"}}
        d["pg_status"] = {"0": {"last_enqueued_collective": world_seq, "last_started_collective": world_seq,
                                "last_completed_collective": world_seq}}
        entry = dict(d["entries"][0], collective_seq_id=sub_seq, pg_id=1, process_group=("1", "tp"),
                     profiling_name="nccl:all_gather")
        d["entries"] = [dict(d["entries"][0], profiling_name="nccl:broadcast",
                             collective_seq_id=world_seq)]
        if sub_seq is not None:
            d["entries"].append(entry)
            d["pg_status"]["1"] = {"last_enqueued_collective": sub_seq, "last_started_collective": sub_seq,
                                   "last_completed_collective": sub_seq - 1}
        return d
    for rank, world_seq, sub_seq in ((0, 7, 41), (1, 7, 41), (2, 7, 40), (3, 7, None), (4, 7, None)):
        (tmp_path / f"fr_{rank}").write_bytes(pickle.dumps(dump(rank, world_seq, sub_seq)))
    findings, lines = stacks_fr.analyse([("n1", fr.collect([str(tmp_path / "fr_")]))])
    assert codes(findings) == ["fr-ranks-diverge", "fr-missing-dumps"]
    assert findings[0]["message"] == ("flight recorder: pg 1 (tp) diverges at collective #41 "
                                      "(all_gather): ranks 0-1 enqueued all_gather #41, rank 2 (on n1) "
                                      "is at #40 (all_gather)")
    assert "no dump from rank 5 (5 of 6 ranks dumped" in findings[1]["message"]
    assert lines[1] == "  pg 0 (default_pg): ranks 0-4 at #7 broadcast"
    assert lines[2].startswith("  pg 1 (tp): ranks 0-1 at #41 all_gather; rank 2 at #40 all_gather")


def test_json_dump_reads_the_same(tmp_path):
    """torch's _dump_fr_trace_json shape: tuples as lists, pg_status numbers as strings."""
    for rank in range(4):
        d = raw_dump(rank)
        for status in d["pg_status"].values():
            for key in list(status):
                status[key] = str(status[key])
        (tmp_path / f"fr_{rank}").write_text(json.dumps(d))
    collected = fr.collect([str(tmp_path / "fr_")])
    assert {d["format"] for d in collected["dumps"]} == {"json"}
    assert [d["pg_status"]["0"]["last_enqueued_collective"] for d in collected["dumps"]] == [2, 2, 2, 1]
    findings, _ = stacks_fr.analyse([("trainbox", collected)])
    assert codes(findings) == ["fr-ranks-diverge"] and "rank 3 (on trainbox) is at #1" in findings[0]["message"]


# -- hostile files ------------------------------------------------------------------------------

def errors_by_rank(prefix, **kw):
    return {d["rank"]: d.get("error") for d in fr.collect([prefix], **kw)["dumps"]}


def test_symlink_is_refused(planted, tmp_path_factory):
    secret = tmp_path_factory.mktemp("secret") / "shadow"
    shutil.copyfile(PREFIX + "3", secret)           # a valid dump: it would parse if followed
    os.remove(planted / "fr_3")
    os.symlink(secret, planted / "fr_3")
    errors = errors_by_rank(str(planted / "fr_"))
    assert errors[3] == "a symbolic link: refused"
    assert [errors[r] for r in range(3)] == [None] * 3
    findings, _ = stacks_fr.analyse([("t", fr.collect([str(planted / "fr_")]))])
    assert codes(findings) == ["fr-missing-dumps", "fr-bad-dump", "fr-agree"]
    assert "fr_3: a symbolic link: refused" in findings[1]["message"]


def test_symlink_swapped_in_after_lstat_is_not_followed(planted, monkeypatch):
    real_lstat = os.lstat
    target = planted / "fr_1"

    def lstat_then_swap(path, *a, **kw):
        st = real_lstat(path, *a, **kw)
        if str(path) == str(target):
            os.rename(target, planted / "elsewhere")
            os.symlink(planted / "elsewhere", target)
        return st
    monkeypatch.setattr(fr.os, "lstat", lstat_then_swap)
    data, _, error = fr.read_bytes(str(target))
    assert data is None and error.startswith("cannot open: ")


def test_fifo_and_directory_are_refused_without_blocking(planted):
    os.remove(planted / "fr_2")
    os.mkfifo(planted / "fr_2")                     # opening it for reading would block
    os.remove(planted / "fr_1")
    os.mkdir(planted / "fr_1")
    errors = errors_by_rank(str(planted / "fr_"))
    assert errors == {0: None, 1: "a directory: refused", 2: "a FIFO: refused", 3: None}


class _System:
    def __init__(self, command):
        self.command = command

    def __reduce__(self):
        return (os.system, (self.command,))


class _Eval:
    def __reduce__(self):
        import builtins
        return (builtins.eval, ("__import__('os').system('true')",))


@pytest.mark.parametrize("protocol", [0, 2, 4])
def test_pickle_with_a_global_is_refused_without_running_it(planted, tmp_path, protocol):
    marker = tmp_path / "ran"
    dump = raw_dump(2)
    dump["entries"][0]["frames"] = _System(f"touch {marker}")
    (planted / "fr_2").write_bytes(pickle.dumps(dump, protocol=protocol))
    (planted / "fr_1").write_bytes(pickle.dumps({"version": _Eval()}, protocol=protocol))
    errors = errors_by_rank(str(planted / "fr_"))
    assert not marker.exists()
    assert errors[2].startswith("refused a global (posix.system)") or \
        errors[2].startswith("refused a global (os.system)")
    assert errors[1].startswith(("refused a global (builtins.eval)", "refused a global (__builtin__.eval)"))
    assert errors[0] is None and errors[3] is None


def test_truncated_garbage_and_empty_files_are_per_file_errors(planted):
    data = (planted / "fr_1").read_bytes()
    (planted / "fr_1").write_bytes(data[:len(data) // 2])
    (planted / "fr_2").write_bytes(b"\x00\xffnot a dump at all")
    (planted / "fr_3").write_bytes(b"")
    (planted / "fr_4").write_bytes(b"{\"entries\": [")
    (planted / "fr_5").write_bytes(pickle.dumps([1, 2, 3]))
    (planted / "fr_6").write_bytes(pickle.dumps({"unrelated": 1}))
    (planted / "fr_7").write_bytes(b"\x80\x02" + b"(" * 50000)   # marks, never closed
    (planted / "fr_8").write_bytes(b"[" * 100000)                 # deep JSON-looking garbage
    (planted / "fr_9").write_bytes(b" {" + b"[" * 100000)
    errors = errors_by_rank(str(planted / "fr_"))
    assert errors[0] is None
    assert errors[1] == "a truncated pickle"
    assert errors[2] == "not a valid pickle (nor JSON)"
    assert errors[3] == "empty file"
    assert errors[4] == "not valid JSON (JSONDecodeError)"
    assert errors[5] == "not a flight-recorder dump (a list, not a dict)"
    assert errors[6] == "not a flight-recorder dump (no entries, pg_status or pg_config)"
    assert errors[7] in ("a truncated pickle", "not a valid pickle")
    assert errors[8] in ("a truncated pickle", "not a valid pickle (nor JSON)")
    assert errors[9].startswith("not valid JSON (")


def test_oversize_is_refused_before_reading(planted):
    size = os.path.getsize(planted / "fr_0")
    assert errors_by_rank(str(planted / "fr_"), max_bytes=size - 1)[0] == \
        f"{size} bytes, over the {size - 1}-byte limit: not read"
    with open(planted / "fr_9", "wb") as f:             # sparse: 33 MB without writing them
        f.truncate(33 * 1024 * 1024)
    assert errors_by_rank(str(planted / "fr_"))[9] == \
        f"{33 * 1024 * 1024} bytes, over the {fr.MAX_BYTES}-byte limit: not read"


def test_memory_bombs_are_refused(planted):
    """One-byte opcodes that each build a container (8 M empty dicts: ~600 MB from 8 MB), and
    the JSON twin: a MemoryError under the parse's address-space cap, the cap put back after."""
    import resource
    before = resource.getrlimit(resource.RLIMIT_AS)
    (planted / "fr_1").write_bytes(b"\x80\x02" + b"}" * (8 << 20) + b".")
    (planted / "fr_2").write_bytes(b'{"entries": [' + b"{}," * (3 << 20) + b"{}]}")
    errors = errors_by_rank(str(planted / "fr_"), max_memory=64 << 20)
    assert resource.getrlimit(resource.RLIMIT_AS) == before
    assert errors == {0: None, 1: "a pickle too deep or too large (MemoryError)",
                      2: "not valid JSON (MemoryError)", 3: None}


def test_only_prefix_and_digits(planted):
    for name in ("fr_0.pipe", "fr_1.tmp", "fr_", "fr_x1", "fr_12345678", "other_0"):
        (planted / name).write_bytes(b"x")
    assert [d["rank"] for d in fr.collect([str(planted / "fr_")])["dumps"]] == [0, 1, 2, 3]
    # a prefix ending in "/": the file names are the bare ranks
    (planted / "5").write_bytes((planted / "fr_0").read_bytes())
    assert [d["rank"] for d in fr.collect([str(planted) + "/"])["dumps"]] == [5]
    # no directory, garbage prefixes: nothing, no exception
    assert fr.collect([str(planted / "nowhere" / "fr_"), "", None, 5, "a\0b"])["dumps"] == []


def test_bounds(planted):
    big = raw_dump(0)
    entry = big["entries"][-1]
    entry["frames"] = [dict(name="f" * 10000, filename="/x.py", line=n) for n in range(1000)]
    entry["input_sizes"] = [[1] * 100] * 100
    big["entries"] = [dict(entry, record_id=n) for n in range(2000)]
    big["pg_status"] = {str(n): big["pg_status"]["0"] for n in range(500)}
    spread = str(list(range(0, 200000, 2)))            # 100000 ranks, none adjacent
    big["pg_config"] = {str(n): {"name": str(n), "desc": "d" * 10000, "ranks": spread if n < 2 else "[0, 1]"}
                        for n in range(100)}
    (planted / "fr_0").write_bytes(pickle.dumps(big))
    collected = fr.collect([str(planted / "fr_")], max_files=2)
    assert collected["more_files"] == 2 and len(collected["dumps"]) == 2
    d = collected["dumps"][0]
    assert d["entries_total"] == 2000 and len(d["entries"]) == fr.MAX_ENTRIES
    assert len(d["pg_status"]) == fr.MAX_GROUPS and d["pg_status_groups"] == 500
    assert len(d["pg_config"]) == fr.MAX_GROUPS and d["pg_config_groups"] == 100
    assert d["pg_config"]["0"]["ranks_count"] == 100000 and len(d["pg_config"]["0"]["ranks"]) == fr.MAX_RANGES
    assert len(d["entries"][0]["frames"]) == fr.MAX_FRAMES
    assert len(d["entries"][0]["frames"][0]["name"]) == fr.MAX_TEXT
    assert len(d["entries"][0]["input_sizes"]) == fr.MAX_TENSORS
    assert len(json.dumps(collected)) < 300000
    stacks_fr.analyse([("t", collected)])
    # past the output budget: the status numbers only, still enough for the analysis
    collected = fr.collect([str(planted / "fr_")], max_output=1000)
    assert [d.get("trimmed") for d in collected["dumps"]] == [True, True, True, True]
    assert collected["dumps"][1]["entries"] == [] and "ranks" not in collected["dumps"][1]["pg_config"][""]
    assert collected["dumps"][3]["pg_status"]["0"]["last_enqueued_collective"] == 1
    findings, _ = stacks_fr.analyse([("t", collected)])
    assert codes(findings) == ["fr-ranks-diverge"] and "rank 3 (on t) is at #1" in findings[0]["message"]


def test_corrupted_dumps_never_raise(tmp_path):
    """The recorded pickle and its JSON twin with bytes flipped, dropped or cut, at random
    (seeded): a summary or a per-file error each time, always JSON-serialisable."""
    rng = random.Random(4)
    with open(PREFIX + "0", "rb") as f:
        pickled = f.read()
    as_json = json.dumps(raw_dump(0)).encode()
    path = tmp_path / "fr_0"
    outcomes = set()
    for n in range(600):
        data = bytearray(pickled if n % 2 else as_json)
        for _ in range(rng.randint(1, 4)):
            at = rng.randrange(len(data))
            choice = rng.random()
            if choice < 0.6:
                data[at] = rng.randrange(256)
            elif choice < 0.8:
                del data[at:at + rng.randint(1, 8)]
            else:
                del data[at:]
                break
        path.write_bytes(bytes(data))
        (item,) = fr.collect([str(tmp_path / "fr_")])["dumps"]
        json.dumps(item)
        outcomes.add("error" in item)
        stacks_fr._analyse([("t", {"dumps": [item]})], None)
    assert outcomes == {True, False}


# -- the client on garbage ----------------------------------------------------------------------

GARBAGE = [
    None, 5, "x", [], [None], [("t",)], [("t", None)], [("t", 5)], [("t", {"dumps": "x"})],
    [(None, {"dumps": [None, 1, "a", [], {}]})],
    [("t", {"dumps": [{"rank": "0"}, {"rank": -1, "pg_status": {}, "pg_config": {}},
                      {"rank": True, "pg_status": {}, "pg_config": {}},
                      {"rank": 0, "pg_status": [], "pg_config": {}},
                      {"rank": 0, "file": 7, "error": ["x"]},
                      {"rank": 1, "pg_status": {"0": {"last_enqueued_collective": "9"}}, "pg_config": {}},
                      {"rank": 2, "pg_status": {"0": {"last_enqueued_collective": 2 ** 80}},
                       "pg_config": {"": {"ranks": [[5, 1]]}, "0": {"ranks": [[0, 10 ** 12]]}}},
                      {"rank": 3, "pg_status": {"0": {"last_enqueued_collective": 3, "recent_ops": [[3, None], "x", [True, 1]]},
                                                "1": None, 2: {}}, "pg_config": {"0": {"ranks": "[0, 1]"}},
                       "mtime": float("nan"), "version": {"a": 1}},
                      {"rank": 4, "pg_status": {"0": {"last_enqueued_collective": 1, "name": "\x1b[31mred\n",
                                                      "desc": ["x"]}}, "pg_config": {}, "mtime": "yesterday"},
                      {"rank": 5, "pg_status": {"\u00b2": {"last_enqueued_collective": 1, "name": "\u00b2"},
                                                "10": {"last_enqueued_collective": 1},
                                                "2": {"last_enqueued_collective": 1}}, "pg_config": {}}]})],
]


@pytest.mark.parametrize("garbage", GARBAGE)
def test_garbage_into_analyse_is_a_finding_not_an_exception(garbage):
    findings, lines = stacks_fr._analyse(garbage, None)    # without analyse's safety net
    for f in findings:
        assert f["level"] in LEVELS and f["code"] in CODES and isinstance(f["message"], str)
    assert all(isinstance(line, str) and "\x1b" not in line and "\n" not in line for line in lines)
    assert all("\x1b" not in f["message"] for f in findings)
    stacks_fr._analyse(garbage, 4)
    stacks_fr._analyse(garbage, "4")


def test_garbage_marks_bad_dumps():
    findings, _ = stacks_fr.analyse([("t", {"dumps": [{"rank": 0, "file": "/tmp/x_0", "error": "a FIFO: refused"},
                                                      {"rank": 1}]})])
    assert codes(findings) == ["fr-bad-dump"]
    assert findings[0]["message"] == ("flight recorder: 2 dump(s) not read: t:/tmp/x_0: a FIFO: refused; "
                                      "t:?: malformed summary (no pg_status/pg_config)")
    assert stacks_fr.analyse([]) == ([], [])
    assert stacks_fr.analyse([("t", {"dumps": []})]) == ([], [])


def test_mutated_summaries_never_raise():
    """The recorded summaries with values swapped for garbage of every type, at random (seeded)."""
    base = fr.collect([PREFIX])
    junk = [None, True, -1, 2 ** 70, 1.5, float("inf"), "", "x" * 5000, "\x1b[2J", [], [[]], {}, {"": None},
            [[1, 0]], [["a", "b"]]]
    rng = random.Random(13)

    def paths(node, here=()):
        yield here
        if isinstance(node, dict):
            for k, v in node.items():
                yield from paths(v, here + (k,))
        elif isinstance(node, list):
            for i, v in enumerate(node):
                yield from paths(v, here + (i,))
    every = list(paths(base))
    for _ in range(400):
        mutated = copy.deepcopy(base)
        for path in rng.sample(every, 3):
            if not path:
                continue
            node = mutated
            try:
                for step in path[:-1]:
                    node = node[step]
                node[path[-1]] = rng.choice(junk)
            except (KeyError, IndexError, TypeError):
                continue
        findings, lines = stacks_fr._analyse([("t", mutated)], rng.choice([None, 4, 0, -3]))
        assert all(f["code"] in CODES for f in findings)


def test_duplicate_and_stale_dumps():
    a = fr.collect([PREFIX])
    b = copy.deepcopy(a)
    for d in b["dumps"]:
        d["mtime"] += 3600                                   # newer, on another target
    b["dumps"][3]["pg_status"]["0"]["last_enqueued_collective"] = 2   # the newer rank 3 caught up
    findings, _ = stacks_fr.analyse([("old", a), ("new", b)])
    assert codes(findings) == ["fr-duplicate-rank", "fr-agree"]
    assert findings[0]["message"].startswith("flight recorder: 4 ranks dumped more than once (the newest "
                                             "used): rank 0: new:")
    stale = copy.deepcopy(a)
    stale["dumps"][3]["mtime"] -= 7200
    findings, _ = stacks_fr.analyse([("t", stale)])
    assert codes(findings) == ["fr-ranks-diverge", "fr-stale-dumps"]
    assert findings[1]["message"] == ("flight recorder: the dumps were written 120 min apart; rank 3 "
                                      "may be from an earlier run")


# -- prefixes -----------------------------------------------------------------------------------

def test_prefixes_from_environ():
    env = {"TORCH_FR_DUMP_TEMP_FILE": "dumps/fr_", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "/scratch/nccl_",
           "HOME": "/home/alice", "PATH": "/usr/bin"}
    assert fr.prefixes_from_environ(env, cwd="/work/job") == [
        "/work/job/dumps/fr_", "/scratch/nccl_", "/home/alice/.cache/torch/comm_lib_trace_rank_",
        "/tmp/nccl_trace_rank_"]
    assert fr.prefixes_from_environ({b"XDG_CACHE_HOME": b"/cache"}) == [
        "/cache/torch/comm_lib_trace_rank_", "/tmp/nccl_trace_rank_"]
    assert fr.prefixes_from_environ({}) == ["/tmp/.cache/torch/comm_lib_trace_rank_",
                                            "/tmp/nccl_trace_rank_"]
    assert fr.prefixes_from_environ({"TORCH_FR_DUMP_TEMP_FILE": "/d/x_", "HOME": 5}, defaults=False) == ["/d/x_"]
    assert fr.prefixes_from_environ(None, defaults=False) == []
    assert fr.prefixes_from_environ({"TORCH_FR_DUMP_TEMP_FILE": "a\0b", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "x" * 5000},
                                    defaults=False) == []


# -- the script by hand, on the oldest Python it supports ---------------------------------------

def test_by_hand_on_python38():
    from tests.pythons import require_python
    py38 = require_python("3.8")
    proc = subprocess.run([py38, str(SCRIPTS / "flight_recorder.py"), PREFIX], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == json.loads(json.dumps(fr.collect([PREFIX])))
