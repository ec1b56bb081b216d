"""Fault-injection campaign: real jobs under seeded random fault schedules, on the real
local cluster (docs/reliability.md).

Each scenario (tests/integration/campaign_scenarios.py: a job that succeeds, one whose rank
raises, an infrastructure failure healed by a gang restart, suspend and resume, a TTL, an
8-pod job, an elastic job's lost pod replaced, a hang detected and restarted, a Kueue
eviction and re-admission, `gang: Native`, a pod answering hostile status bodies, a hang on
nodes with skewed clocks) first runs once without faults and under one operator: its outcome
is the reference. Then it runs again and again, each
time with operators (scoped to the run's namespace) whose own API requests fail as the
schedule says (kube/faults.py: 500, 409, 429, a timeout, a response lost after the write, a
write held up past the client's bound, a write that lands after the client gave up, SIGKILL
right before or after a request, a dropped watch, a storm of 410 Gone on a watch), and,
on a cluster of its own, with the apiserver stopped (SIGSTOP) for 20 s mid-run. A killed
operator is started again at once, with the faults that did not fire yet. Faults are
counted from the seam's own log (those that fired), never from the schedule.

Once the job finished and its pods were cleaned up, the operator is stopped; whatever did
not fire by then is reported as not fired. An operator without faults is started once more,
and once it has reconciled the job (its metrics say so) the run is judged
(tests/campaign_invariants.py, each invariant unit-tested to fail on a record that breaks it):

- the job finished, and its outcome (phase, attempt, root cause, counters, restart records)
  equals the reference;
- no pod of an attempt was created while a pod of an earlier attempt existed, and a pod of
  an earlier attempt that turned up late was deleted (a pod watch records every event);
- no attempt created more pods than its nodes plus the replacements its status counts;
- no pod outlived the job except as cleanPodPolicy keeps, and a TTL deleted the job;
- no "Traceback" in any operator's log;
- every operator exit was a SIGKILL the fault seam sent.

    python tests/integration/faultrun.py --faults 200 --seed 1 --table docs/reliability.md

starts its own local cluster (LOCALKUBE_BIN: cluster/build.sh all) and prints the tables;
tests/integration/test_fault_injection.py runs a small seeded campaign in every CI run, and
tests/integration/test_campaign_plants.py proves that each invariant catches a bug planted in
the operator (TORCHRUN_OPERATOR_TEST_PLANT, operator/torchrun_operator/testplant.py).

This file is the campaign (schedules, reference runs, judging, the tally and its table) and
its command line; the other parts are beside it:
- campaign_faults.py: the fault catalogue (where a fault strikes, the kinds, which fit where);
- campaign_scenarios.py: the scenarios, and what each needs of the cluster;
- campaign_run.py: one run (namespace, operators restarted, faults, its own invariants);
- campaign_operator.py: an operator process, with its log, fault log and metrics;
- campaign_monitor.py: the pod watch whose events the invariants are checked on;
- campaign_cluster.py: the cluster (a local one of its own, apiserver outages, the client);
- campaign_evidence.py: what a run leaves for explaining a violation.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
# Runs the harness could not finish fail the campaign already; past this many (and a tenth of
# the runs) the harness itself is broken and no new run is started. Without it, a campaign
# that still wants faults drew runs that could never fire one until something killed it (on
# kind, 2026-11-28: a dozen runs in 14 minutes, then the test's timeout, leaving their jobs).
HARNESS_ERRORS_MAX = 3
# As pytest's rootdir conftest does: the shared test helpers (tests/jobs.py) and our packages.
sys.path[:0] = [str(HERE), str(HERE.parent), str(REPO / "operator"), str(REPO / "cluster")]

import campaign_invariants as inv  # noqa: E402
from campaign_cluster import Apiserver, cluster_for  # noqa: E402
from campaign_faults import KINDS, KINDS_OF, TARGETS  # noqa: E402
from campaign_run import Run, Runner  # noqa: E402
from campaign_scenarios import BY_NAME, SCENARIOS, Scenario, expectation_missed  # noqa: E402


@dataclass
class Tally:
    runs: int = 0
    fired: Counter[str] = field(default_factory=Counter)
    unfired: Counter[str] = field(default_factory=Counter)
    kills: int = 0
    violations: list[str] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)  # each run's wall time
    # Runs the driver could not carry through (its own request to the cluster failed, e.g.
    # a namespace that got no ServiceAccount in time): not judged, but counted and failing.
    harness: list[str] = field(default_factory=list)


def faults_fired(tally: dict[str, Tally]) -> int:
    return sum(sum(t.fired.values()) for t in tally.values())


def unjudged(tally: dict[str, Tally]) -> int:
    """Runs the harness could not finish."""
    return sum(len(t.harness) for t in tally.values())


class Campaign(Runner):
    def __init__(
        self,
        kubeconfig: Path,
        workdir: Path,
        seed: int,
        scenarios: list[Scenario] | None = None,
        plant: str | None = None,
        apiserver: Apiserver | None = None,
        kinds: frozenset[str] = frozenset(),
    ) -> None:
        # Only these fault kinds are scheduled (all when empty).
        unknown = set(kinds) - set(KINDS)
        if unknown:
            raise ValueError(f"unknown fault kinds {sorted(unknown)}: {sorted(KINDS)}")
        super().__init__(kubeconfig, workdir, plant, apiserver)
        self.rng = random.Random(seed)
        self.scenarios = scenarios or SCENARIOS
        self.kinds = kinds
        self.reference: dict[str, dict[str, Any]] = {}
        self.tally: dict[str, Tally] = {s.name: Tally() for s in self.scenarios}
        self.drawn = 0  # runs drawn from the seed so far (earlier parts' included)

    def skip(self, runs: int, per_run: int) -> None:
        """Draws `runs` runs' schedules without running them: a campaign resumed after
        `runs` runs goes on with the schedule an unbroken one would have drawn next."""
        for _ in range(runs):
            self.schedule(self.scenarios[self.drawn % len(self.scenarios)], per_run)
            self.drawn += 1

    def load_tally(self, saved: dict[str, Any]) -> None:
        """Adds an earlier part's tally (as dump_tally wrote it) to this one."""
        for name, t in saved.items():
            mine = self.tally[name]
            for f in fields(Tally):
                ours = getattr(mine, f.name)
                setattr(mine, f.name, ours + type(ours)(t[f.name]))

    def dump_tally(self) -> dict[str, Any]:
        # Not dataclasses.asdict: it rebuilds a Counter from its (key, count) pairs.
        return {
            n: {f.name: getattr(t, f.name) for f in fields(Tally)} for n, t in self.tally.items()
        }

    def schedule(self, scenario: Scenario, count: int) -> list[tuple[str, dict[str, Any]]]:
        """(kind, rule) pairs, only where they can fire: a job is deleted only by a TTL; of
        the kinds in `self.kinds` only, when it names some."""
        targets = [t for t in TARGETS if t != "job-delete" or scenario.ttl]
        if self.apiserver is not None:
            targets.append("apiserver")

        def kinds(target: str) -> list[str]:
            return [k for k in KINDS_OF[target] if not self.kinds or k in self.kinds]

        targets = [t for t in targets if kinds(t)]
        rules = []
        for _ in range(count if targets else 0):
            target = self.rng.choice(targets)
            if target == "apiserver":
                kind = self.rng.choice(kinds(target))
                rules.append((kind, {**KINDS[kind], "after": self.rng.uniform(1, 10)}))
                continue
            method, path = TARGETS[target]
            if target.endswith("-watch"):
                nth = 1  # a watch is opened again only after it broke
            elif target == "lease":
                nth = self.rng.randint(1, 3)  # a renewal every 4 s: from 4-12 s into the term
            else:
                nth = self.rng.randint(1, 6 if target == "status-write" else 2)
            kind = self.rng.choice(kinds(target))
            rules.append((kind, {"method": method, "path": path, "nth": nth, **KINDS[kind]}))
        return rules

    def references(self, parallel: int = 1) -> None:
        with ThreadPoolExecutor(parallel) as pool:
            refs = [
                (s, pool.submit(self.run, s, [], True, self.next_index())) for s in self.scenarios
            ]
            for s, future in refs:
                ref = future.result()
                self.reference[s.name] = ref.outcome
                missed = ref.violations + expectation_missed(s, ref.outcome)
                self.tally[s.name].violations += [f"reference run: {v}" for v in missed]
                print(f"reference {s.name} ({ref.seconds:.0f} s): {ref.outcome}", flush=True)

    def judge(self, scenario: Scenario, got: Run) -> Run:
        """A run's own violations, and an outcome other than the reference's; tallied."""
        if got.outcome:
            got.violations += inv.outcome_differs(self.reference[scenario.name], got.outcome)
        with self._lock:
            t = self.tally[scenario.name]
            t.runs += 1
            t.fired.update(got.fired)
            t.unfired.update(got.unfired)
            t.kills += got.kills
            t.violations += got.violations
            t.seconds.append(got.seconds)
        return got

    def campaign(
        self,
        faults_wanted: int,
        per_run: int,
        runs_wanted: int = 0,
        minutes: float = 0,
        parallel: int = 1,
    ) -> bool:
        """Runs until enough faults fired in enough runs, or (`minutes` > 0) no run starts
        after that many minutes: the tally then says how far it got. `parallel` runs at once,
        each in a namespace of its own with operators of its own; every run's scenario, name
        and faults are drawn here, in order, so the schedule is the seed's whatever the
        timing (how many runs it takes to fire enough faults is not)."""
        stop = time.monotonic() + minutes * 60 if minutes > 0 else float("inf")
        self.references(parallel)
        # An earlier part's runs and faults count towards what is wanted (--resume).
        total = faults_fired(self.tally)
        runs = sum(t.runs + len(t.harness) for t in self.tally.values())
        stopped = False
        running: dict[Future[Run], Scenario] = {}
        with ThreadPoolExecutor(parallel) as pool, _aborting(self._abort):
            while True:
                while (
                    not stopped
                    and len(running) < parallel
                    and (total < faults_wanted or runs + len(running) < runs_wanted)
                ):
                    if time.monotonic() >= stop:
                        print(f"stopped after {minutes:g} minutes", flush=True)
                        stopped = True
                        break
                    s = self.scenarios[self.drawn % len(self.scenarios)]
                    self.drawn += 1
                    rules = self.schedule(s, per_run)
                    running[pool.submit(self.run, s, rules, False, self.next_index())] = s
                if not running:
                    break
                finished, _ = wait(running, return_when=FIRST_COMPLETED)
                for future in finished:
                    s = running.pop(future)
                    try:
                        got = self.judge(s, future.result())
                    except Exception as e:  # noqa: BLE001 - one run's harness, not the campaign
                        if self._abort.is_set():
                            raise
                        with self._lock:
                            self.tally[s.name].harness.append(f"{type(e).__name__}: {e}"[:300])
                        print(f"{s.name}: HARNESS ERROR (not judged): {e!r}"[:400], flush=True)
                        runs += 1  # started: an always-failing harness must still end
                        errors = unjudged(self.tally)
                        if not stopped and errors >= max(HARNESS_ERRORS_MAX, runs // 10):
                            print(f"{errors} runs the harness could not finish: stopping")
                            stopped = True
                        continue
                    total += sum(got.fired.values())
                    runs += 1
                    print(
                        f"{s.name} ({got.seconds:.0f} s): fired {dict(got.fired)}, not fired "
                        f"{dict(got.unfired)}, {got.kills} kills, {len(got.violations)} "
                        f"violations {got.violations}",
                        flush=True,
                    )
        return not any(t.violations or t.harness for t in self.tally.values())

    def table(self) -> str:
        names = [s.name for s in self.scenarios]
        rows = [
            "| fault kind (fired) | " + " | ".join(names) + " | all |",
            "|---|" + "---|" * (len(names) + 1),
        ]
        kinds = sorted({k for t in self.tally.values() for k in t.fired}, key=list(KINDS).index)
        for kind in kinds:
            cells = [self.tally[n].fired[kind] for n in names]
            rows.append(f"| {kind} | " + " | ".join(map(str, cells)) + f" | {sum(cells)} |")

        def line(label: str, value: Callable[[Tally], int]) -> str:
            cells = [value(self.tally[n]) for n in names]
            return f"| {label} | " + " | ".join(map(str, cells)) + f" | {sum(cells)} |"

        rows += [
            line("**faults fired**", lambda t: sum(t.fired.values())),
            line("scheduled, not fired", lambda t: sum(t.unfired.values())),
            line("operator kills survived", lambda t: t.kills),
            line("runs", lambda t: t.runs),
            line("**invariant violations**", lambda t: len(t.violations)),
            line("runs the harness could not finish", lambda t: len(t.harness)),
        ]
        every = [x for n in names for x in self.tally[n].seconds]
        cells = [round(_mean(self.tally[n].seconds)) for n in names]
        rows.append(
            "| wall time per run, mean (s) | "
            + " | ".join(map(str, cells))
            + f" | {round(_mean(every))} |"
        )
        return "\n".join(rows)


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


@contextmanager
def _aborting(abort: threading.Event) -> Iterator[None]:
    """An error or ^C in the campaign's thread stops the runs in flight (the pool waits for
    them as it closes)."""
    try:
        yield
    except BaseException:
        abort.set()
        raise


TABLE_BEGIN = "<!-- fault-table:begin -->"
TABLE_END = "<!-- fault-table:end -->"


def write_table(path: Path, table: str, header: str) -> None:
    text = path.read_text()
    start, end = text.index(TABLE_BEGIN) + len(TABLE_BEGIN), text.index(TABLE_END)
    path.write_text(text[:start] + f"\n{header}\n\n{table}\n" + text[end:])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--faults", type=int, default=200, help="until this many faults fired")
    p.add_argument("--runs", type=int, default=0, help="... and at least this many runs")
    p.add_argument("--per-run", type=int, default=4, help="faults scheduled per run")
    p.add_argument("--minutes", type=float, default=0, help="start no run after this long")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--parallel", type=int, default=1, help="this many runs at once")
    p.add_argument("--kinds", default="", help="comma-separated fault kinds: only these")
    p.add_argument("--scenarios", help="comma-separated: only these", default="")
    p.add_argument("--kubeconfig", type=Path, help="use this cluster instead of starting one")
    p.add_argument("--json", type=Path, help="write the tally here")
    p.add_argument("--table", type=Path, help="replace the table in this Markdown file")
    p.add_argument(
        "--resume",
        action="store_true",
        help="go on with the campaign --json holds (same seed, scenarios, kinds and commit): "
        "its runs count, and the schedule continues where it stopped",
    )
    args = p.parse_args(argv)
    earlier = resumed(args) if args.resume else None
    scenarios = [BY_NAME[n] for n in args.scenarios.split(",") if n] or SCENARIOS
    workdir = Path(tempfile.mkdtemp(prefix="faultrun-"))
    started = time.monotonic()
    try:
        with cluster_for(args.kubeconfig, workdir, scenarios) as (kubeconfig, apiserver):
            kinds = frozenset(k for k in args.kinds.split(",") if k)
            c = Campaign(
                kubeconfig, workdir, args.seed, scenarios, apiserver=apiserver, kinds=kinds
            )
            if earlier is not None:
                c.load_tally(earlier["tally"])
                c.skip(earlier["meta"]["drawn"], args.per_run)
            try:
                ok = c.campaign(
                    args.faults, args.per_run, args.runs, args.minutes, max(args.parallel, 1)
                )
            finally:
                report(c, args, started, earlier)
        return 0 if ok else 1
    finally:
        if os.environ.get("FAULTRUN_KEEP") != "1":
            shutil.rmtree(workdir, ignore_errors=True)


def commit() -> str:
    """The checkout's commit, `-dirty` when its tracked files differ from it."""
    out = subprocess.run(
        ["git", "-C", str(REPO), "describe", "--always", "--dirty", "--abbrev=12"],
        capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    return out or "unknown"


def meta(args: argparse.Namespace, drawn: int, parts: list[dict[str, Any]]) -> dict[str, Any]:
    """What a campaign is: a resumed part must be the same campaign on the same code."""
    return {
        "seed": args.seed, "per_run": args.per_run, "scenarios": args.scenarios,
        "kinds": args.kinds, "commit": commit(), "drawn": drawn, "parts": parts,
    }  # fmt: skip


def resumed(args: argparse.Namespace) -> dict[str, Any]:
    """The earlier parts --json holds, refused unless this part is the same campaign on the
    same commit (a campaign's 0 violations are a claim about one version of the code)."""
    if args.json is None or not args.json.exists():
        raise SystemExit("--resume needs --json FILE written by an earlier part")
    saved: dict[str, Any] = json.loads(args.json.read_text())
    if "meta" not in saved:
        raise SystemExit(f"{args.json}: no campaign to resume (written before --resume)")
    want = meta(args, saved["meta"]["drawn"], saved["meta"]["parts"])
    differs = [k for k in ("seed", "per_run", "scenarios", "kinds", "commit")
               if saved["meta"][k] != want[k]]  # fmt: skip
    if differs or want["commit"].endswith("-dirty"):
        got = {k: saved["meta"][k] for k in differs}
        raise SystemExit(
            f"--resume: not the same campaign: {got} then, now "
            f"{ {k: want[k] for k in differs} } (commit {want['commit']})"
        )
    return saved


def report(
    c: Campaign, args: argparse.Namespace, started: float, earlier: dict[str, Any] | None = None
) -> None:
    """The table and every violation, also when the campaign was cut short."""
    table = c.table()
    print(table)
    for n, t in c.tally.items():
        if t.seconds:
            print(
                f"{n}: {t.runs} runs, wall time per run {_mean(t.seconds):.0f} s mean, "
                f"{max(t.seconds):.0f} s longest"
            )
    every = [x for t in c.tally.values() for x in t.seconds]
    minutes = (time.monotonic() - started) / 60
    parts = [*(earlier["meta"]["parts"] if earlier else []),
             {"ended": time.strftime("%Y-%m-%d %H:%M %Z"), "minutes": round(minutes, 1),
              "parallel": args.parallel}]  # fmt: skip
    print(
        f"{len(every)} runs ({args.parallel} at once) in {minutes:.1f} minutes"
        + (f" ({len(parts)} parts)" if len(parts) > 1 else "")
        + f", {_mean(every):.0f} s per run"
    )
    for t in c.tally.values():
        for v in t.violations:
            print("VIOLATION:", v)
        for h in t.harness:
            print("HARNESS ERROR:", h)
    if args.json:
        saved = {"meta": meta(args, c.drawn, parts), "tally": c.dump_tally()}
        args.json.write_text(json.dumps(saved, indent=1))
    if args.table:
        header = table_header(c.tally, args, parts, time.strftime("%Y-%m-%d %H:%M %Z"), commit())
        write_table(args.table, table, header)


def table_header(
    tally: dict[str, Tally],
    args: argparse.Namespace,
    parts: list[dict[str, Any]],
    when: str,
    rev: str,
) -> str:
    """The line above the table: what ran, on which code, and whether it fell short."""
    minutes = sum(part["minutes"] for part in parts)
    runs = sum(t.runs for t in tally.values())
    fired = faults_fired(tally)
    errors = unjudged(tally)
    # Short: cut by --minutes, or by runs the harness could not finish (they count as started,
    # so that a harness that always fails still ends, but are not judged).
    short = runs < args.runs or fired < args.faults
    return (
        f"Last full run: {when}, commit {rev}, seed {args.seed}, {args.per_run} faults "
        f"scheduled per run, {runs} runs, {fired} faults fired, {minutes:.0f} minutes on the "
        "2-core development machine"
        + (f" in {len(parts)} parts (--resume)" if len(parts) > 1 else "")
        + (f"; {errors} more runs not judged (harness errors)" if errors else "")
        + (
            f" (short of the {args.runs} runs and {args.faults} faults asked for)."
            if short
            else "."
        )
    )


if __name__ == "__main__":
    sys.exit(main())
