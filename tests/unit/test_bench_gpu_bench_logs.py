"""bench/gpu_bench.py's report of a failed layout: what each process said before it died,
not only torchrun's own traceback."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "operator")]

from bench.gpu_bench import FAILURE_TAIL_LINES, _tail  # noqa: E402


def test_a_workers_last_words_survive_torchruns_long_report(tmp_path: Path) -> None:
    torchrun_report = [f"E torchrun traceback line {i}" for i in range(60)]
    log = tmp_path / "output.log"
    log.write_text(
        "\n".join(
            ["terminate called after throwing an instance of 'gloo::IoException'"]
            + ['{"bench": "gpu_ddp_facts", "env": "' + "x" * 5000 + '"}']
            + torchrun_report
        )
    )
    shown = _tail(log).splitlines()
    assert shown[0].startswith("terminate called")
    assert shown[1:] == torchrun_report
    assert len(torchrun_report) < FAILURE_TAIL_LINES


def test_only_the_last_lines_of_a_long_log(tmp_path: Path) -> None:
    log = tmp_path / "output.log"
    log.write_text("\n".join(str(i) for i in range(1000)))
    assert _tail(log, 3) == "997\n998\n999"


def test_a_missing_log_says_so(tmp_path: Path) -> None:
    assert _tail(tmp_path / "absent.log") == "(no output)"
