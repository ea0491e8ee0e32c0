import copy
import json

import pytest
from wfcommons import WorkflowGenerator
from wfcommons.wfchef.recipes import BlastRecipe

from dagsched.core.workflow import TaskType, WorkflowError
from dagsched.sim.wfformat import parse_wfformat, task_type_hint


def _v15(version="1.5"):
    return {
        "name": "tiny-blast",
        "schemaVersion": version,
        "workflow": {
            "specification": {
                "tasks": [
                    {
                        "name": "split_fasta_00000001",
                        "id": "00000001",
                        "parents": [],
                        "children": ["00000002", "00000003"],
                        "inputFiles": ["in.fa"],
                        "outputFiles": ["a.fa", "b.fa"],
                    },
                    {
                        "name": "blastall",
                        "id": "00000002",
                        "parents": ["00000001"],
                        "children": ["00000004"],
                        "inputFiles": ["a.fa"],
                        "outputFiles": ["a.out"],
                    },
                    {
                        "name": "gpu_align",
                        "id": "00000003",
                        "parents": ["00000001"],
                        "children": ["00000004"],
                        "inputFiles": ["b.fa"],
                        "outputFiles": ["b.out"],
                    },
                    {
                        "name": "stage_out",
                        "id": "00000004",
                        "parents": ["00000002", "00000003"],
                        "children": [],
                        "inputFiles": ["a.out", "b.out"],
                        "outputFiles": [],
                    },
                ],
                "files": [
                    {"id": "in.fa", "sizeInBytes": 1000},
                    {"id": "a.fa", "sizeInBytes": 300},
                    {"id": "b.fa", "sizeInBytes": 200},
                    {"id": "a.out", "sizeInBytes": 40},
                    {"id": "b.out", "sizeInBytes": 60},
                ],
            },
            "execution": {
                "makespanInSeconds": 30.0,
                "executedAt": "2024-01-01T00:00:00Z",
                "tasks": [
                    {"id": "00000001", "runtimeInSeconds": 4.5, "coreCount": 1},
                    {
                        "id": "00000002",
                        "runtimeInSeconds": 10.0,
                        "coreCount": 4,
                        "memoryInBytes": 2_000_000_000,
                    },
                    {"id": "00000003", "runtimeInSeconds": 0, "coreCount": 2.5},
                    {"id": "00000004"},
                ],
            },
        },
    }


def _v14():
    return {
        "name": "tiny-montage",
        "schemaVersion": "1.4",
        "workflow": {
            "makespanInSeconds": 12.0,
            "executedAt": "2021-01-01T00:00:00Z",
            "tasks": [
                {
                    "name": "mProject_ID01",
                    "id": "ID01",
                    "category": "mProject",
                    "type": "compute",
                    "runtimeInSeconds": 3.0,
                    "cores": 2,
                    "memoryInBytes": 500_000_000,
                    "parents": [],
                    "files": [
                        {"link": "input", "name": "raw.fits", "sizeInBytes": 800},
                        {"link": "output", "name": "p.fits", "sizeInBytes": 900},
                    ],
                },
                {
                    "name": "mAdd_ID02",
                    "id": "ID02",
                    "category": "mAdd",
                    "type": "compute",
                    "runtimeInSeconds": 7.25,
                    "parents": ["mProject_ID01"],
                    "files": [{"link": "input", "name": "p.fits", "sizeInBytes": 900}],
                },
                {
                    "name": "stage_out_ID03",
                    "type": "transfer",
                    "runtimeInSeconds": 1.0,
                    "cores": 1,
                    "parents": ["ID02"],  # an id reference, resolved as a fallback
                    "children": [],
                },
            ],
        },
    }


def _by_name(wf):
    return {t.name: i for i, t in enumerate(wf.tasks)}


def _assert_v15(wf):
    assert wf.size == 4
    idx = _by_name(wf)
    split = idx["split_fasta_00000001"]
    blast = idx["blastall:00000002"]
    align = idx["gpu_align:00000003"]
    out = idx["stage_out:00000004"]
    assert sorted(wf.edges) == sorted([(split, blast), (split, align), (blast, out), (align, out)])
    t = wf.tasks
    assert t[split].duration_s == 4.5 and t[split].cpu_cores == 1
    assert t[blast].duration_s == 10.0 and t[blast].cpu_cores == 4 and t[blast].mem_gb == 2.0
    assert t[align].duration_s == 0.01 and t[align].cpu_cores == 2.5  # zero runtime -> minimum
    assert t[out].duration_s == 1.0 and t[out].cpu_cores == 1  # defaults
    assert t[split].mem_gb == 1.0
    assert t[split].input_bytes == 1000 and t[split].output_bytes == 500
    assert t[out].input_bytes == 100 and t[out].output_bytes == 0
    assert t[split].type is TaskType.CPU
    assert t[align].type is TaskType.GPU
    assert t[out].type is TaskType.IO
    assert wf.entries() == [split] and wf.exits() == [out]
    assert wf.id == "tiny-blast"
    assert wf.source == "wfformat:tiny.json"
    assert wf.deadline_s == pytest.approx(2.0 * (4.5 + 10.0 + 1.0))


def test_v15_and_v16_import():
    _assert_v15(parse_wfformat(_v15(), "tiny.json"))
    _assert_v15(parse_wfformat(json.loads(json.dumps(_v15("1.6"))), "tiny.json"))


def test_v15_without_execution_uses_defaults():
    doc = _v15()
    del doc["workflow"]["execution"]
    wf = parse_wfformat(doc, "spec-only", wf_id="custom", slack=3.0)
    assert wf.id == "custom"
    assert all(t.duration_s == 1.0 and t.cpu_cores == 1 and t.mem_gb == 1.0 for t in wf.tasks)
    assert wf.deadline_s == pytest.approx(3.0 * 3)


def test_v15_children_only_and_parents_only_are_merged():
    doc = _v15()
    tasks = doc["workflow"]["specification"]["tasks"]
    tasks[0]["children"] = []  # the edges survive through the children's parents lists
    tasks[3]["parents"] = []  # and through the parents' children lists
    wf = parse_wfformat(doc, "x")
    assert len(wf.edges) == 4


def test_v14_import():
    wf = parse_wfformat(_v14(), "montage-1.4")
    idx = _by_name(wf)
    p, a, s = idx["mProject_ID01"], idx["mAdd_ID02"], idx["stage_out_ID03"]
    assert sorted(wf.edges) == sorted([(p, a), (a, s)])
    t = wf.tasks
    assert (t[p].duration_s, t[p].cpu_cores, t[p].mem_gb) == (3.0, 2, 0.5)
    assert (t[a].duration_s, t[a].cpu_cores, t[a].mem_gb) == (7.25, 1, 1.0)
    assert t[p].input_bytes == 800 and t[p].output_bytes == 900
    assert t[a].input_bytes == 900 and t[a].output_bytes == 0
    assert t[s].type is TaskType.IO and t[p].type is TaskType.CPU
    assert wf.id == "tiny-montage" and wf.source == "wfformat:montage-1.4"


def test_v13_legacy_keys():
    doc = _v14()
    doc["schemaVersion"] = "1.3"
    task = doc["workflow"]["tasks"][0]
    task["runtime"] = task.pop("runtimeInSeconds")
    task["memory"] = 250_000  # KB
    del task["memoryInBytes"]
    for f in task["files"]:
        f["size"] = f.pop("sizeInBytes")
    wf = parse_wfformat(doc, "old")
    t = wf.tasks[_by_name(wf)["mProject_ID01"]]
    assert (t.duration_s, t.mem_gb, t.output_bytes) == (3.0, 0.25, 900)


def test_multiple_entries_and_exits_are_kept():
    doc = _v15()
    spec = doc["workflow"]["specification"]["tasks"]
    spec.append({"name": "lonely", "id": "x9", "parents": [], "children": []})
    wf = parse_wfformat(doc, "x")
    assert wf.size == 5 and len(wf.entries()) == 2 and len(wf.exits()) == 2


def test_task_type_hints():
    assert task_type_hint(["train_model"]) is TaskType.GPU
    assert task_type_hint(["runGPUKernel"]) is TaskType.GPU
    assert task_type_hint(["stage_in_1"]) is TaskType.IO
    assert task_type_hint(["x", "transfer"]) is TaskType.IO
    assert task_type_hint(["DownloadData"]) is TaskType.IO
    assert task_type_hint(["io"]) is TaskType.IO
    assert task_type_hint(["validation", "bioinformatics", "ratio"]) is TaskType.CPU
    assert task_type_hint(["mProject"]) is TaskType.CPU


def _spec(doc):
    return doc["workflow"]["specification"]


def _exec(doc):
    return doc["workflow"]["execution"]


def _malformed():
    """(label, mutate(doc) -> doc, pattern the error must contain)."""

    def set_(path_fn, key, value):
        def mutate(doc):
            path_fn(doc)[key] = value
            return doc

        return mutate

    def drop(path_fn, key):
        def mutate(doc):
            del path_fn(doc)[key]
            return doc

        return mutate

    return [
        ("not an object", lambda d: [d], "must be a JSON object"),
        ("no workflow", drop(lambda d: d, "workflow"), "missing 'workflow'"),
        ("no version", drop(lambda d: d, "schemaVersion"), "unsupported schemaVersion missing"),
        (
            "bad version",
            set_(lambda d: d, "schemaVersion", "9.9"),
            "unsupported schemaVersion '9.9'",
        ),
        ("no spec", drop(lambda d: d["workflow"], "specification"), "workflow.specification"),
        ("no tasks", set_(_spec, "tasks", []), "no tasks"),
        (
            "duplicate id",
            set_(lambda d: _spec(d)["tasks"][2], "id", "00000002"),
            "duplicate task id '00000002'",
        ),
        (
            "unknown parent",
            set_(lambda d: _spec(d)["tasks"][3], "parents", ["00000002", "nope"]),
            "task '00000004': unknown parent task 'nope'",
        ),
        (
            "unknown child",
            set_(lambda d: _spec(d)["tasks"][0], "children", ["ghost"]),
            "task '00000001': unknown child task 'ghost'",
        ),
        (
            "cycle",
            set_(lambda d: _spec(d)["tasks"][0], "parents", ["00000004"]),
            "cycle",
        ),
        (
            "negative runtime",
            set_(lambda d: _exec(d)["tasks"][1], "runtimeInSeconds", -3),
            "task '00000002': runtimeInSeconds must be >= 0",
        ),
        (
            "non-numeric runtime",
            set_(lambda d: _exec(d)["tasks"][1], "runtimeInSeconds", "ten"),
            "task '00000002': runtimeInSeconds must be a number",
        ),
        (
            "bool runtime",
            set_(lambda d: _exec(d)["tasks"][1], "runtimeInSeconds", True),
            "runtimeInSeconds must be a number",
        ),
        (
            "zero cores",
            set_(lambda d: _exec(d)["tasks"][1], "coreCount", 0),
            "task '00000002': coreCount must be > 0",
        ),
        (
            "negative memory",
            set_(lambda d: _exec(d)["tasks"][1], "memoryInBytes", -1),
            "memoryInBytes must be >= 0",
        ),
        (
            "unknown execution task",
            set_(lambda d: _exec(d)["tasks"][1], "id", "zzz"),
            "execution task 'zzz' is not in the specification",
        ),
        (
            "duplicate execution task",
            set_(lambda d: _exec(d)["tasks"][1], "id", "00000001"),
            "duplicate execution entry for task '00000001'",
        ),
        (
            "unknown file",
            set_(lambda d: _spec(d)["tasks"][1], "inputFiles", ["missing.fa"]),
            "task '00000002': inputFiles refers to unknown file 'missing.fa'",
        ),
        (
            "negative file size",
            set_(lambda d: _spec(d)["files"][0], "sizeInBytes", -5),
            "file 'in.fa' sizeInBytes must be >= 0",
        ),
        (
            "parents not a list",
            set_(lambda d: _spec(d)["tasks"][1], "parents", "00000001"),
            "parents must be a list",
        ),
    ]


def test_malformed_v15_documents_raise():
    for label, mutate, pattern in _malformed():
        doc = mutate(copy.deepcopy(_v15()))
        with pytest.raises(WorkflowError) as err:
            parse_wfformat(doc, "bad.json")
        assert pattern in str(err.value), (label, str(err.value))
        assert "bad.json" in str(err.value) or "cycle" in str(err.value), label


def test_task_without_name_or_id():
    doc = _v15()
    task = _spec(doc)["tasks"][1]
    del task["id"], task["name"]
    with pytest.raises(WorkflowError, match=r"task #1 has neither an id nor a name"):
        parse_wfformat(doc, "x")
    doc = _v14()
    del doc["workflow"]["tasks"][2]["name"]
    with pytest.raises(WorkflowError, match=r"task #2 has neither a name nor an id"):
        parse_wfformat(doc, "x")


def test_malformed_v14_documents_raise():
    cases = [
        ("duplicate", lambda t: t[1].update(name="mProject_ID01"), "duplicate task id"),
        ("dangling", lambda t: t[1].update(parents=["ghost"]), "unknown parent task 'ghost'"),
        ("runtime", lambda t: t[0].update(runtimeInSeconds=-1), "runtimeInSeconds must be >= 0"),
        ("runtime type", lambda t: t[0].update(runtimeInSeconds=None, runtime="x"), "a number"),
        ("cores", lambda t: t[0].update(cores=-2), "'mProject_ID01': cores must be > 0"),
        ("link", lambda t: t[0]["files"][0].update(link="sideways"), "link must be"),
        ("cycle", lambda t: t[0].update(parents=["stage_out_ID03"]), "cycle"),
    ]
    for label, mutate, pattern in cases:
        doc = _v14()
        mutate(doc["workflow"]["tasks"])
        with pytest.raises(WorkflowError) as err:
            parse_wfformat(doc, "old.json")
        assert pattern in str(err.value), (label, str(err.value))


def test_wfcommons_generated_instance(tmp_path):
    # wfcommons is a dev dependency: a missing one is an error here, never a silent pass
    generated = WorkflowGenerator(BlastRecipe.from_num_tasks(50)).build_workflow()
    path = tmp_path / "blast.json"
    generated.write_json(path)
    doc = json.loads(path.read_text())
    wf = parse_wfformat(doc, "blast.json")
    assert wf.size == len(generated.tasks)
    assert len(wf.edges) == generated.number_of_edges()
    assert all(t.duration_s > 0 for t in wf.tasks)
