"""A failure says where: the launcher's report names the frame of the user's code that raised
a worker's error (`failures[].location`, docs/pod-contract.md "Where an error was raised"),
from real exceptions of scripts in files: the user's line that called into json, torch or an
installed package, the line that raised last in a chain, the bad line of a SyntaxError."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from torchrun_operator.launcher import contract, frames, report, shim

EntryArgs = Callable[[list[str]], list[str]]


def _line(path: Path, text: str) -> int:
    """The number of the one line of `path` that holds `text`."""
    (n,) = [i for i, t in enumerate(path.read_text().splitlines(), 1) if text in t]
    return n


def _run(path: Path) -> BaseException:
    """Run the script at `path` as `python script.py` would (its own file in every frame, as
    __main__) and return what it raised."""
    code = compile(path.read_text(), str(path), "exec", dont_inherit=True)
    try:
        exec(code, {"__name__": "__main__", "__file__": str(path)})  # noqa: S102
    except Exception as e:  # noqa: BLE001 - the point is to catch it
        return e
    raise AssertionError("the script did not raise")


def _record(e: BaseException) -> contract.FailureRecord:
    """The report's failure record of a worker that raised `e`: the error file as the shim
    writes it, read by failure_record as the agent does."""
    tb = "".join(traceback.format_exception(e))
    return report.failure_record(3, 1, 1, shim.error_file_payload(e, tb, 1.7e9), "", 1.7e9)


JSON_SCRIPT = textwrap.dedent(
    """
    import json

    def load_config(text):
        return json.loads(text)

    config = load_config("{'lr': 0.1}")
    """
)


def test_an_error_inside_json_names_the_users_line_that_called_it(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(JSON_SCRIPT)
    record = _record(_run(script))
    assert record["error"].startswith("JSONDecodeError: Expecting property name")
    line = _line(script, "return json.loads(text)")
    assert record["location"] == f"{script}:{line} in load_config"


def test_an_error_inside_an_installed_package_names_the_users_line(tmp_path: Path) -> None:
    site = tmp_path / "venv" / "lib" / "python3.11" / "site-packages"
    site.mkdir(parents=True)
    (site / "fancylib.py").write_text("def check(x):\n    raise KeyError(x)\n")
    script = tmp_path / "train.py"
    script.write_text("import fancylib\n\nfancylib.check('lr')\n")
    sys.path.insert(0, str(site))
    try:
        e = _run(script)
    finally:
        sys.path.remove(str(site))
        sys.modules.pop("fancylib", None)
    assert _record(e)["location"] == f"{script}:3 in <module>"


def test_an_error_inside_torch_names_the_users_line(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    script = tmp_path / "train.py"
    script.write_text(
        "import torch\n\ndef resume(path):\n    return torch.load(path)\n\nresume('/absent.pt')\n"
    )
    e = _run(script)
    assert isinstance(e, FileNotFoundError)
    # torch raised it in its own Python code, frames below the script's.
    assert any("torch" in f.file for f in frames.traceback_frames(e.__traceback__)[-2:])
    assert _record(e)["location"] == f"{script}:4 in resume"


CHAINED = textwrap.dedent(
    """
    import json

    def settings(text):
        try:
            return json.loads(text)
        except ValueError as e:
            raise RuntimeError("bad settings file") from e

    settings("{")
    """
)


def test_a_chained_exception_names_where_the_last_one_was_raised(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(CHAINED)
    e = _run(script)
    where = f"{script}:{_line(script, 'raise RuntimeError')} in settings"
    assert _record(e)["location"] == where
    # The formatted traceback (an error file without our `location`) says the same: the last
    # traceback of the chain, not the first.
    tb = "".join(traceback.format_exception(e))
    assert tb.index("json.loads") < tb.index("raise RuntimeError")
    recorded = {
        "message": {"message": "RuntimeError: bad settings file", "extraInfo": {"py_callstack": tb}}
    }
    assert report.failure_record(0, 0, 1, recorded, "", 1.0)["location"] == where


def test_a_torchelastic_error_file_is_read_from_its_traceback(tmp_path: Path) -> None:
    """An error file torchelastic's own errors.record wrote (a script that uses @record, run by
    a shell the shim does not see into): no `location`, only the formatted traceback, whose
    exception text may quote other tracebacks; those are not frames."""
    script = tmp_path / "train.py"
    script.write_text(JSON_SCRIPT)
    e = _run(script)
    tb = "".join(traceback.format_exception(e))
    quoted = 'ValueError: worker said:\n  File "/elsewhere/evil.py", line 1, in x\n'
    data = {
        "message": {
            "message": f"{type(e).__name__}: {e}",
            "extraInfo": {"py_callstack": tb + quoted, "timestamp": "1700000000"},
        }
    }
    line = _line(script, "return json.loads(text)")
    assert report.failure_record(0, 0, 1, data, "", 1.0)["location"] == (
        f"{script}:{line} in load_config"
    )


def test_no_location_without_a_recorded_error() -> None:
    record = report.failure_record(0, 0, 1, {"message": "<NONE>"}, "", 1.0, stderr="usage: x")
    assert "location" not in record


def test_a_location_is_one_printable_line_of_bounded_length(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 300) / "bad\nname.py"
    place = frames.describe(frames.Frame(str(deep), 9, "step"))
    assert len(place) == contract.LOCATION_LIMIT
    assert place.endswith("d/bad?name.py:9 in step")  # the end is kept: file, line, function
    assert place.isprintable()


def test_a_report_that_must_fit_shortens_locations_too() -> None:
    failures = [
        report.failure_record(
            r,
            r,
            1,
            {
                "message": {
                    "message": f"RuntimeError: {'x' * 600}",
                    "extraInfo": {"location": "/w/" + "p" * 240 + f"/train.py:{r} in main"},
                }
            },
            "",
            1.0,
        )
        for r in range(8)
    ]
    summary = report.build_summary(contract.FAILED, group_rank=0, ranks=range(8), failures=failures)
    fitted = json.loads(report.encode_summary(summary))
    assert len(fitted["failures"]) == 8 and "omitted" not in fitted
    assert all(f["location"].endswith(" in main") for f in fitted["failures"])


# ---- through the shim, as a pod's worker runs ----------------------------------------------


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != contract.ENV_LOCAL_RANK_ARG}
    env.update(
        LOCAL_RANK="0",
        TORCHRUN_OPERATOR_STATE_DIR=str(tmp_path / "state"),
        TORCHELASTIC_ERROR_FILE=str(tmp_path / "error.json"),
        **extra,
    )
    return env


def _worker(tmp_path: Path, entry_args: EntryArgs, cmd: list[str], **env: str) -> dict[str, Any]:
    """Run `cmd` as torchrun's agent starts a worker in a pod; its error file's record."""
    res = subprocess.run(
        [sys.executable, *entry_args(cmd)],
        env=_env(tmp_path, **env),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 1, res.stderr
    data = json.loads((tmp_path / "error.json").read_text())
    out: dict[str, Any] = data["message"]
    return out


def test_a_workers_error_file_names_the_scripts_line(tmp_path: Path, entry_args: EntryArgs) -> None:
    script = tmp_path / "train.py"
    script.write_text(JSON_SCRIPT)
    record = _worker(tmp_path, entry_args, ["python", str(script)])
    line = _line(script, "return json.loads(text)")
    assert record["extraInfo"]["location"] == f"{script}:{line} in load_config"


def test_a_syntax_error_names_the_bad_line(tmp_path: Path, entry_args: EntryArgs) -> None:
    script = tmp_path / "train.py"
    script.write_text("import os\n\nlr = = 0.1\n")
    record = _worker(tmp_path, entry_args, ["python", str(script)])
    assert record["message"].startswith("SyntaxError")
    assert record["extraInfo"]["location"] == f"{script}:3"


def test_an_installed_module_run_as_main_is_the_users(
    tmp_path: Path, entry_args: EntryArgs
) -> None:
    """`python -m trainer.main` of a package installed into site-packages: the module run as
    __main__ is the user's code, though it lies where installed packages do."""
    pkg = tmp_path / "site-packages" / "trainer"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "main.py").write_text("import json\n\njson.loads('{')\n")
    record = _worker(
        tmp_path,
        entry_args,
        ["python", "-m", "trainer.main"],
        PYTHONPATH=str(tmp_path / "site-packages"),
    )
    assert record["extraInfo"]["location"] == f"{pkg / 'main.py'}:3 in <module>"
