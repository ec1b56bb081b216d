"""cluster/build.sh is quiet: one line as each component starts and one as it ends, Go's
output in a log file, and that log's tail when a build fails. Run against a stand-in `go` that
prints what a cold build prints and makes the binaries it is asked for."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

FAKE_GO = r"""#!/usr/bin/env bash
# A stand-in for go: noise like a cold build's, then the binaries asked for.
for i in $(seq 1 120); do echo "go: downloading example.com/mod$i v1.0.$i" >&2; done
if [ -n "${FAIL_ON:-}" ] && [[ "$*" == *"$FAIL_ON"* ]]; then
  echo "compile error: $FAIL_ON" >&2
  exit 1
fi
case "$1" in
  mod)
    if [ "$2" = download ]; then
      d=$(mktemp -d); printf '\tk8s.io/api => ./staging/src/k8s.io/api\n' >"$d/go.mod"
      printf '{"GoMod": "%s/go.mod", "Dir": "%s"}\n' "$d" "$d"
    fi ;;
  build)
    out="" pkgs=()
    shift
    while (($#)); do
      case "$1" in
        -o) out=$2; shift ;;
        -ldflags) shift ;;
        -trimpath) ;;
        *) pkgs+=("$1") ;;
      esac
      shift
    done
    for p in "${pkgs[@]}"; do
      if [[ "$out" == */ ]]; then f="$out$(basename "$p")"; else f=$out; fi
      printf '#!/bin/sh\n' >"$f"; chmod +x "$f"
    done ;;
  install)
    for a in "$@"; do
      case "$a" in
        *@*) n=$(basename "${a%@*}"); printf '#!/bin/sh\n' >"$GOBIN/$n"; chmod +x "$GOBIN/$n" ;;
      esac
    done ;;
esac
exit 0
"""


def build(tmp: Path, **env: str) -> subprocess.CompletedProcess[str]:
    fake = tmp / "fakebin"
    fake.mkdir(exist_ok=True)
    go = fake / "go"
    go.write_text(FAKE_GO)
    go.chmod(go.stat().st_mode | stat.S_IEXEC)
    return subprocess.run(
        ["bash", str(REPO / "cluster/build.sh"), "core"],
        capture_output=True,
        text=True,
        env={
            **os.environ,
            "PATH": f"{fake}:{os.environ['PATH']}",
            "LOCALKUBE_CACHE": str(tmp / "cache"),
            **env,
        },
        timeout=120,
    )


def test_a_cold_build_says_one_line_per_component_start_and_end_and_logs_the_rest(
    tmp_path: Path,
) -> None:
    res = build(tmp_path)
    assert res.returncode == 0, res.stderr
    lines = res.stderr.splitlines()
    assert "go: downloading" not in res.stderr
    # The plan, then a start and an end for each of the four components, then the total.
    assert lines[0].startswith("[build] core: building kube-apiserver")
    assert sum(" ..." in line for line in lines) == 4
    ends = [line for line in lines if ": done in " in line and "left:" in line]
    assert len(ends) == 4
    assert ends[-1].endswith("left: nothing")
    assert "left: etcd coredns helm" in ends[0]
    assert lines[-1].startswith("[build] core: done in ")
    assert len(lines) == 10
    log = (tmp_path / "cache/build.log").read_text()
    assert log.count("go: downloading") >= 4 * 120
    bin_dir = Path(res.stdout.strip())
    assert sorted(p.name for p in bin_dir.iterdir()) == sorted(
        ["kube-apiserver", "kube-controller-manager", "kube-scheduler", "etcd", "coredns", "helm"]
    )

    # Warm: nothing to say, the folder on stdout, the last build's log kept.
    again = build(tmp_path)
    assert again.returncode == 0
    assert again.stderr == ""
    assert again.stdout.strip() == str(bin_dir)
    assert (tmp_path / "cache/build.log").read_text() == log


def test_a_failed_build_names_the_component_and_prints_the_logs_tail(tmp_path: Path) -> None:
    res = build(tmp_path, FAIL_ON="helm.sh/helm")
    assert res.returncode != 0
    assert "[build] helm.sh/helm/v3/cmd/helm@" in res.stderr
    assert "FAILED" in res.stderr
    assert "compile error: helm.sh/helm" in res.stderr.splitlines()[-1]
    assert len(res.stderr.splitlines()) < 60


def test_verbose_prints_gos_output(tmp_path: Path) -> None:
    res = build(tmp_path, BUILD_VERBOSE="1")
    assert res.returncode == 0
    assert res.stderr.count("go: downloading") >= 4 * 120
