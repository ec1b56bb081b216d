"""kubectl dtj convert on untrusted YAML: bounded loading, a one-line error and exit status 1
for whatever is not a PyTorchJob it can convert, never a traceback (docs/migrating.md).

The bounds are structural (bytes, nesting, values once aliases are expanded), so a test states
them by counting, never by timing."""

from __future__ import annotations

import copy
import io
import sys
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torchrun_operator.cli import convert
from torchrun_operator.cli.main import main


def pytorchjob() -> dict[str, Any]:
    container = {"name": "pytorch", "image": "img", "command": ["torchrun", "train.py"]}
    replica = {
        "replicas": 1,
        "restartPolicy": "ExitCode",
        "template": {"spec": {"containers": [container]}},
    }
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": "job"},
        "spec": {
            "pytorchReplicaSpecs": {
                "Master": replica,
                "Worker": {**copy.deepcopy(replica), "replicas": 3},
            }
        },
    }


def run_cli(
    text: str, capsys: pytest.CaptureFixture[str], mp: pytest.MonkeyPatch
) -> tuple[int, str, str]:
    mp.setattr("sys.stdin", io.StringIO(text))
    status = main(["convert"])
    out, err = capsys.readouterr()
    return status, out, err


def errors(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("error: ")]


def assert_refused(status: int, err: str, *says: str) -> None:
    assert status == 1, err
    assert "Traceback" not in err
    assert all(line.startswith(("error: ", "warning: ")) for line in err.splitlines()), err
    (line,) = errors(err)
    for s in says:
        assert s in line, line


# ---- aliases, size and depth ------------------------------------------------------------------


def alias_bomb(depth: int, width: int = 10) -> str:
    """A PyTorchJob whose trainer's args expand to width**depth strings: about 800 bytes at
    depth 8."""
    lines = [f"a0: &a0 [{', '.join(['x'] * width)}]"]
    for level in range(1, depth + 1):
        refs = ", ".join([f"*a{level - 1}"] * width)
        lines.append(f"a{level}: &a{level} [{refs}]")
    anchors = "\n".join(f"  {line}" for line in lines)
    return f"""apiVersion: kubeflow.org/v1
kind: PyTorchJob
metadata:
  name: bomb
  labels:
    bomb:
{anchors}
spec:
  pytorchReplicaSpecs:
    Worker:
      replicas: 2
      template:
        spec:
          containers:
          - name: pytorch
            image: img
            command: [python, t.py]
            args: *a{depth}
"""


def expanded_size(text: str) -> int:
    """The values of the stream once every alias is expanded, as a loader without a bound
    would build them (counted without building them)."""
    sizes: dict[str, int] = {}
    stack: list[list[Any]] = []
    total = 0
    for event in yaml.parse(text):
        if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            stack.append([1, event.anchor])
            continue
        if isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            n, anchor = stack.pop()
        elif isinstance(event, yaml.ScalarEvent):
            n, anchor = 1, event.anchor
        elif isinstance(event, yaml.AliasEvent):
            n, anchor = sizes[str(event.anchor)], None
        else:
            continue
        if anchor:
            sizes[anchor] = n
        if stack:
            stack[-1][0] += n
        else:
            total += n
    return total


def test_the_bomb_is_small_and_expands_tenfold_per_level() -> None:
    assert len(alias_bomb(8).encode()) < 1000
    assert expanded_size(alias_bomb(3)) > 1000
    assert expanded_size(alias_bomb(8)) > 10**8


@pytest.mark.parametrize("depth", [5, 8])
def test_an_alias_bomb_is_refused_before_it_is_expanded(
    depth: int, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    text = alias_bomb(depth)
    with pytest.raises(convert.ConvertError, match="aliases"):
        convert.documents(text)
    status, out, err = run_cli(text, capsys, monkeypatch)
    assert_refused(status, err, "aliases", str(convert.MAX_VALUES))
    assert out == ""


def test_a_few_aliases_are_fine() -> None:
    """A template shared by Master and Worker through an anchor is ordinary YAML; the job
    printed has no anchors of its own."""
    job = pytorchjob()
    text = yaml.safe_dump(job).replace(
        "  pytorchReplicaSpecs:\n    Master:\n", "  pytorchReplicaSpecs:\n    Master: &r\n"
    )
    text += "    Other: *r\n"
    (doc,) = convert.documents(text)
    assert (
        doc["spec"]["pytorchReplicaSpecs"]["Other"] == job["spec"]["pytorchReplicaSpecs"]["Master"]
    )
    a, b = doc["spec"]["pytorchReplicaSpecs"]["Other"], doc["spec"]["pytorchReplicaSpecs"]["Master"]
    assert a is not b  # plain data: what is printed has no &id001
    result = convert.convert(doc)
    assert "&" not in yaml.safe_dump(result.job)


def test_a_recursive_alias_is_refused() -> None:
    with pytest.raises(convert.ConvertError, match="contains itself"):
        convert.documents("apiVersion: kubeflow.org/v1\nkind: PyTorchJob\nspec: &s {x: *s}\n")


def test_nesting_is_bounded() -> None:
    deep = "a: " + "[" * (convert.MAX_DEPTH + 1) + "]" * (convert.MAX_DEPTH + 1) + "\n"
    with pytest.raises(convert.ConvertError, match="nested"):
        convert.documents(deep)
    # far deeper than Python's recursion limit: refused all the same, not a RecursionError
    with pytest.raises(convert.ConvertError, match="nested"):
        convert.documents("a: " + "[" * 100_000 + "\n")


def test_size_is_bounded() -> None:
    with pytest.raises(convert.ConvertError, match="bytes"):
        convert.documents("#" * (convert.MAX_INPUT_BYTES + 1))


def test_values_are_bounded_without_aliases_too() -> None:
    text = "a: [" + ",".join(["1"] * (convert.MAX_VALUES + 1)) + "]\n"
    assert len(text) < convert.MAX_INPUT_BYTES
    with pytest.raises(convert.ConvertError, match=str(convert.MAX_VALUES)):
        convert.documents(text)


# ---- what YAML has and JSON (a Kubernetes object) does not -----------------------------------


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("{1: a}", "key"),
        ("{? [a, b] : c}", "line 1"),  # unhashable: PyYAML's own error, on one line
        ("a: !!binary aGVsbG8=\n", "a: "),
        ("a: !!set {x}\n", "a: "),
        ("a: .inf\n", "a: "),
        ("a: !!python/object:os.system x\n", "line 1"),
        ("a: " + "9" * 5000 + "\n", "a number"),
        ("a: *nowhere\n", "line 1"),
        ("a: [\n", "line 2"),
    ],
)
def test_what_is_not_json_is_refused_on_one_line(text: str, says: str) -> None:
    with pytest.raises(convert.ConvertError) as info:
        convert.documents(text)
    assert "\n" not in str(info.value) and says in str(info.value), str(info.value)


def test_a_timestamp_stays_the_string_it_was() -> None:
    (doc,) = convert.documents("metadata: {annotations: {since: 2024-01-01}}\n")
    assert doc["metadata"]["annotations"]["since"] == "2024-01-01"


# ---- fields of the wrong type -----------------------------------------------------------------


def _set(doc: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    node: Any = doc
    *parents, leaf = path.split(".")
    for p in parents:
        node = node[int(p)] if p.isdigit() else node.setdefault(p, {})
    node[leaf] = value
    return doc


WORKER = "spec.pytorchReplicaSpecs.Worker"
TRAINER = f"{WORKER}.template.spec.containers.0"


@pytest.mark.parametrize(
    ("path", "value", "says"),
    [
        ("metadata.annotations", ["x"], "metadata.annotations"),
        ("metadata.labels", {"a": 1}, "metadata.labels.a"),
        ("metadata", "job", "metadata"),
        ("spec.elasticPolicy", {"rdzvConf": ["x"]}, "spec.elasticPolicy.rdzvConf[0]"),
        ("spec.elasticPolicy", {"minReplicas": "1"}, "spec.elasticPolicy.minReplicas"),
        ("spec.elasticPolicy", {"maxRestarts": True}, "spec.elasticPolicy.maxRestarts"),
        (f"{WORKER}.replicas", "two", f"{WORKER}.replicas"),
        (f"{WORKER}.restartPolicy", ["Never"], f"{WORKER}.restartPolicy"),
        (f"{WORKER}.template", [], f"{WORKER}.template"),
        (f"{WORKER}.template.spec.containers", {"a": 1}, f"{WORKER}.template.spec.containers"),
        (f"{TRAINER}.command", "python t.py", f"{TRAINER.replace('.0', '[0]')}.command"),
        (f"{TRAINER}.env", [{"name": 3}], "env[0].name"),
        ("spec.runPolicy", {"backoffLimit": "3"}, "spec.runPolicy.backoffLimit"),
        ("spec.runPolicy", {"cleanPodPolicy": {}}, "spec.runPolicy.cleanPodPolicy"),
        ("spec.runPolicy", {"schedulingPolicy": {"queue": 1}}, "schedulingPolicy.queue"),
        ("spec.pytorchReplicaSpecs", ["Worker"], "spec.pytorchReplicaSpecs"),
        ("spec.nprocPerNode", [2], "spec.nprocPerNode"),
    ],
)
def test_a_field_of_the_wrong_type_is_an_error_naming_it(
    path: str,
    value: Any,
    says: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    doc = _set(pytorchjob(), path, value)
    with pytest.raises(convert.ConvertError, match=says.replace("[", r"\[").replace(".", r"\.")):
        convert.convert(doc)
    status, out, err = run_cli(yaml.safe_dump(doc), capsys, monkeypatch)
    assert_refused(status, err, "PyTorchJob " + ("?" if path == "metadata" else "job"), says)
    assert out == ""


def test_a_list_with_something_else_in_it() -> None:
    text = yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": [pytorchjob(), "x"]})
    with pytest.raises(convert.ConvertError, match=r"items\[1\]"):
        convert.documents(text)


def test_a_bad_entrypoint_is_an_error(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO(yaml.safe_dump(pytorchjob())))
    assert main(["convert", "--entrypoint", "python 't.py"]) == 1
    assert_refused(1, capsys.readouterr().err, "--entrypoint")


# ---- a missing command ------------------------------------------------------------------------


def test_a_missing_command_is_an_error_and_exit_1(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    doc = pytorchjob()
    for r in doc["spec"]["pytorchReplicaSpecs"].values():
        c = r["template"]["spec"]["containers"][0]
        del c["command"]
        c["args"] = ["--epochs", "1"]
    status, out, err = run_cli(yaml.safe_dump(doc), capsys, monkeypatch)
    assert_refused(status, err, "command", "--entrypoint")
    # printed all the same, to be edited, as an invalid result is
    job = yaml.safe_load(out)
    assert job["spec"]["template"]["spec"]["containers"][0]["command"] == [convert.TODO_COMMAND]
    monkeypatch.setattr("sys.stdin", io.StringIO(yaml.safe_dump(doc)))
    assert main(["convert", "--entrypoint", "python /t.py"]) == 0


# ---- any input: converted, or one line of error and exit 1 -----------------------------------

YAMLISH = st.text(alphabet="ab:-[]{},&*!?|>'\"#%@ \n\t0123456789.~", max_size=120)


def _json() -> st.SearchStrategy[Any]:
    scalars = st.one_of(
        st.none(), st.booleans(), st.integers(-3, 10**6), st.text(max_size=8), st.floats()
    )
    return st.recursive(
        scalars,
        lambda inner: st.one_of(
            st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=6), inner, max_size=3)
        ),
        max_leaves=8,
    )


PATHS = [
    "metadata",
    "metadata.name",
    "metadata.labels",
    "metadata.annotations",
    "spec",
    "spec.nprocPerNode",
    "spec.elasticPolicy",
    "spec.elasticPolicy.rdzvConf",
    "spec.elasticPolicy.minReplicas",
    "spec.runPolicy",
    "spec.runPolicy.schedulingPolicy",
    "spec.runPolicy.cleanPodPolicy",
    "spec.pytorchReplicaSpecs",
    f"{WORKER}",
    f"{WORKER}.replicas",
    f"{WORKER}.restartPolicy",
    f"{WORKER}.template",
    f"{WORKER}.template.spec",
    f"{WORKER}.template.spec.containers",
    f"{TRAINER}",
    f"{TRAINER}.command",
    f"{TRAINER}.args",
    f"{TRAINER}.env",
    f"{TRAINER}.resources",
    f"{TRAINER}.resources.limits",
]


def check_any_input(text: str) -> None:
    """Either it converts, or it fails with one line of error per failure; no traceback;
    and whatever it loads is within the bounds, counted."""
    out, err = io.StringIO(), io.StringIO()
    stdin = io.StringIO(text)
    saved = sys.stdin, sys.stdout, sys.stderr
    sys.stdin, sys.stdout, sys.stderr = stdin, out, err
    try:
        status = main(["convert"])
    finally:
        sys.stdin, sys.stdout, sys.stderr = saved
    lines = err.getvalue().splitlines()
    assert status in (0, 1)
    assert all(line.startswith(("error: ", "warning: ")) for line in lines), lines
    assert (status == 1) == any(line.startswith("error: ") for line in lines), lines
    try:
        docs = convert.documents(text)
    except convert.ConvertError:
        assert status == 1
        return
    assert sum(_count(d) for d in docs) <= convert.MAX_VALUES


def _count(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + sum(1 + _count(v) for v in value.values())
    if isinstance(value, list):
        return 1 + sum(_count(v) for v in value)
    return 1


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(YAMLISH)
def test_any_yamlish_text(text: str) -> None:
    check_any_input(text)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(PATHS), _json()), min_size=1, max_size=3))
def test_a_pytorchjob_with_anything_anywhere(changes: list[tuple[str, Any]]) -> None:
    doc = pytorchjob()
    for path, value in changes:
        try:
            _set(doc, path, value)
        except (TypeError, KeyError, IndexError, AttributeError):
            continue  # a parent was replaced by a scalar or a short list: nothing to set
    check_any_input(yaml.safe_dump(doc))


@settings(max_examples=50, deadline=None)
@given(st.integers(1, 12), st.integers(2, 12))
def test_alias_bombs_of_any_shape(depth: int, width: int) -> None:
    text = alias_bomb(depth, width)
    if expanded_size(text) > convert.MAX_VALUES:
        with pytest.raises(convert.ConvertError, match="aliases"):
            convert.documents(text)
    check_any_input(text)
