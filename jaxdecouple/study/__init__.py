"""Reproduction studies: named lists of runs, run in pieces, collected into docs/RESULTS.md.

  python -m jaxdecouple.study --study=cpu_fmnist --workdir=studies/cpu_fmnist            # run (resumable)
  python -m jaxdecouple.study --study=cpu_fmnist --workdir=studies/cpu_fmnist --report   # report only

Each run of a study has its own workdir (WORKDIR/runs/NAME). A run that finished is skipped; an
interrupted one resumes from its checkpoints; ``--max_runs``, ``--time_limit_min`` and
``--finish_by_min`` (no run that would end after it, going by that run's own estimate) stop starting
new runs, so a long study proceeds across machines that stop every few minutes (SIGTERM stops the
current run cleanly after a checkpoint). Several processes can share one workdir: a process claims a
run (WORKDIR/runs/NAME/running.json: host and pid) and the others pass over it while that process
lives; ``--jobs=N`` starts N such processes, each pinned to its own share of the CPU cores (one
run alone keeps about 1.4 of 2 cores busy: XLA:CPU runs many of a small ResNet's convolutions on one
thread; two unpinned processes fight over both cores and finish less than one). The helpers share
the first process's process group: stop them all with a signal to the group (``kill -TERM -PGID``,
as a machine's shutdown does); SIGTERM to one process stops only its own run.

The report puts every finished run into a table laid out like the paper's (rows: architecture and K
or S; columns: methods; cells: test error %, median over seeds with the range), the paper's numbers
beside ours, each method's gap to its row's baseline (paired by seed) with the paper's gap, the
study's checks (targets and the papers' findings: met, missed or waiting for runs) and learning curves
per row, a swept setting's figure as the paper draws it (``Study.sweep``: FDG's beta, ResIST's L), with the machine, data, recipe, seeds, dates and the command that regenerates it.

The package: core.py (what a study is), definitions/ (the studies, a short file each), runner.py
(processes, claims, pinning, logs), the report (report.py puts it together from machines.py, gaps.py:
final errors, gaps and checks, curves.py: tables from the learning curves, sweep.py: a swept setting's numbers, and figures.py), left.py (how
many runs are left and about how long they take: ``--left``), cli.py (this command); the papers' numbers come
from jaxdecouple/papers.py.
"""
from jaxdecouple.study.core import SEEDS, Claim, Run, Study, diverged, is_finished, read_record, run_dir
from jaxdecouple.study.definitions import STUDIES
from jaxdecouple.study.gaps import check, gap
from jaxdecouple.study.machines import same_machines_once
from jaxdecouple.study.report import report, write_results
from jaxdecouple.study.runner import _progress_to, claim, machine, pin, release, run_study, whole_run_seconds
from jaxdecouple.study.cli import main

__all__ = ['SEEDS', 'STUDIES', 'Claim', 'Run', 'Study', 'check', 'claim', 'gap', 'diverged', 'is_finished', 'machine', 'main',
           'pin', 'release', 'report', 'run_dir', 'run_study', 'same_machines_once', 'whole_run_seconds',
           'write_results']
