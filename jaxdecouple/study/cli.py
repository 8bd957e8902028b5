"""The command line: run a study (resumable, in pieces, several processes) and write its report."""
from __future__ import annotations

import argparse
import dataclasses
import fnmatch
import os
import subprocess
import sys

from jaxdecouple.study.core import is_finished
from jaxdecouple.study.definitions import STUDIES
from jaxdecouple.study.left import left_line
from jaxdecouple.study.report import finished_runs_shown, report, sections_in_page, write_results
from jaxdecouple.study.runner import pin, run_study


def main(argv=None) -> int:
  import jaxdecouple.study as package
  p = argparse.ArgumentParser(prog='python -m jaxdecouple.study', description=package.__doc__.split('\n\n')[0],
                              epilog=package.__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument('--study', required=True, choices=sorted(STUDIES))
  p.add_argument('--workdir', required=True, help='where the study keeps its runs (resumable)')
  p.add_argument('--data_path', default='', help='the .npz data file for studies that need one')
  p.add_argument('--max_runs', type=int, default=0, help='start at most this many runs per process (0: all)')
  p.add_argument('--runs', default='',
                 help="only the runs whose names match one of these comma-separated patterns (fnmatch: "
                      "'*fdg-predict*,*seed1'), in the definition's order; the report still covers every run")
  p.add_argument('--time_limit_min', type=float, default=0.0,
                 help='start no new run after this many minutes (0: no limit)')
  p.add_argument('--finish_by_min', type=float, default=0.0,
                 help='start no run that would not end within this many minutes, judged by its own estimate '
                      '(as --left makes it: its own pace if under way, else the finished runs of its cell, row, '
                      'column or study, on the machines that ran them, scaled by this machine\'s pace once a run '
                      'whose cell\'s other seeds finished has run here, whole or at least a quarter of it; it leaves '
                      'out a resumed run\'s start-up: leave a margin); a '
                      'run that would not fit is passed over for a shorter one after it (0: no limit); for machines '
                      'that stop at a fixed time or are replaced between sessions')
  p.add_argument('--keep_checkpoints', action='store_true',
                 help="keep a finished run's checkpoints (default: deleted; the report needs only metrics)")
  p.add_argument('--jobs', type=int, default=1,
                 help='run this many processes at once on the same workdir, each taking the next free run')
  p.add_argument('--pin', default='', help=argparse.SUPPRESS)  # J/N: a --jobs helper's share of the cores
  p.add_argument('--left', action='store_true',
                 help='only say how many runs are left and about how long they take, from the finished runs')
  p.add_argument('--report', action='store_true', help='only write the report from finished runs')
  p.add_argument('--no_report', action='store_true', help='run, but leave the report to another call')
  p.add_argument('--results', default='docs/RESULTS.md', help='the results page to update')
  p.add_argument('--figures', default='docs/figures', help='where the learning-curve PNGs go')
  args = p.parse_args(argv)
  study = STUDIES[args.study]()
  if args.jobs < 1:
    p.error(f'--jobs must be at least 1, got {args.jobs}')
  if args.left:
    print(left_line(study, args.workdir))
    return 0
  if not args.report and study.needs_data_path and not args.data_path:
    p.error(f'study {args.study} needs {study.needs}: pass --data_path=FILE.npz (docs/DATA.md, '
            '"CIFAR-10 and CIFAR-100 as one file", says how to make it)')
  if not args.report and args.data_path and not os.path.isfile(args.data_path):
    p.error(f'--data_path={args.data_path}: no such file')
  chosen = study
  if args.runs:
    patterns = [x.strip() for x in args.runs.split(',') if x.strip()]
    chosen = dataclasses.replace(study, runs=tuple(r for r in study.runs
                                                   if any(fnmatch.fnmatchcase(r.name, x) for x in patterns)))
    if not chosen.runs:
      p.error(f"--runs={args.runs} matches none of study {args.study}'s {len(study.runs)} runs (names look like "
              f"{study.runs[0].name}; patterns are fnmatch's, e.g. '*{study.runs[0].name.split('__')[1]}*')")
  if not args.report:
    helper = [sys.executable, '-m', 'jaxdecouple.study', f'--study={args.study}', f'--workdir={args.workdir}',
              f'--data_path={args.data_path}', f'--max_runs={args.max_runs}',
              f'--time_limit_min={args.time_limit_min}', f'--finish_by_min={args.finish_by_min}', '--no_report',
              f'--runs={args.runs}',
              *(['--keep_checkpoints'] if args.keep_checkpoints else [])]
    if not args.pin:
      print(left_line(study, args.workdir), flush=True)
    helpers = [subprocess.Popen([*helper, f'--pin={j}/{args.jobs}']) for j in range(1, args.jobs)]
    cpus = os.sched_getaffinity(0) if hasattr(os, 'sched_getaffinity') else None
    if args.pin:
      pin(*map(int, args.pin.split('/')))
    elif helpers:
      pin(0, args.jobs)
    try:
      status = run_study(chosen, args.workdir, args.data_path, args.max_runs, args.time_limit_min * 60,
                         keep_checkpoints=args.keep_checkpoints, console=not args.pin,
                         finish_by_s=args.finish_by_min * 60, estimate_from=study)
    finally:
      if cpus is not None:
        os.sched_setaffinity(0, cpus)  # when called in-process (tests, notebooks)
    if any(h.wait() for h in helpers):
      print('a helper process failed; see its output above', file=sys.stderr)
    done = sum(is_finished(args.workdir, r) for r in study.runs)
    print(f"{done} of {len(study.runs)} runs finished ({status['ran']} run now by this process, "
          f"{len(study.runs) - done} left)")
    if args.runs:
      mine = sum(is_finished(args.workdir, r) for r in chosen.runs)
      print(f'--runs={args.runs}: {mine} of the {len(chosen.runs)} runs it matches finished')
    if args.no_report:
      return 0
  shown = finished_runs_shown(sections_in_page(args.results).get(study.name, ''))
  done = sum(is_finished(args.workdir, r) for r in study.runs)
  if shown is not None and done < shown:  # the records behind the page are elsewhere: keep the page's section
    print(f"{'error' if args.report else 'note'}: {args.results}'s {args.study} section was made from {shown} "
          f"finished runs and {args.workdir} holds {done}: writing it would lose them, so it is left as it is. Pass "
          f"the workdir that holds the records, or --results=OTHER.md for a page of your own", file=sys.stderr)
    return 2 if args.report else 0
  command = (f'python -m jaxdecouple.study --study={args.study} --workdir={args.workdir} --report')
  write_results({study.name: report(study, args.workdir, args.results, args.figures, command)}, args.results)
  print(f'wrote {args.results} and figures in {args.figures}')
  return 0


def _console_logging() -> None:
  """Progress lines on the console in absl's format, as main.py shows them (a --jobs helper's runs keep
  theirs off it: see run_study's ``console``)."""
  from absl import flags, logging
  from jaxdecouple.writers import quiet_library_logs
  if not flags.FLAGS.is_parsed():
    flags.FLAGS.mark_as_parsed()  # absl's defaults; else every line is preceded by a warning that they are not
  logging.use_absl_handler()
  quiet_library_logs()
