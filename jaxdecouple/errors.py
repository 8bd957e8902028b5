"""Errors that stop a run with one clear line: what is wrong and how to fix it."""


class JaxDecoupleError(Exception):
  """Base class: main.py prints these as one line and exits with status 2."""


class ConfigError(JaxDecoupleError, ValueError):
  """A config field is unknown, has the wrong type or an invalid value."""


class DataError(JaxDecoupleError):
  """No source could provide the data set, or the data found is malformed."""


class CheckpointError(JaxDecoupleError):
  """No checkpoint in the work directory can be restored for this config."""


class CheckpointWriteError(CheckpointError):
  """A checkpoint could not be written (the disk full, the folder not writable): unlike a damaged checkpoint,
  something every later run would meet too, so a study stops on it."""


class DivergenceError(JaxDecoupleError):
  """The loss or the parameters stopped being finite: the run stops, its last finite checkpoint kept."""


class ProcessError(JaxDecoupleError):
  """Another process of a multi-process run did not answer in time (it died or hangs)."""


class InterruptedWhileWaiting(JaxDecoupleError):
  """Ctrl-C while a process waited for the others at start-up: one line, exit status 130 (as for SIGINT)."""
  exit_code = 130


class WorkdirError(JaxDecoupleError):
  """The work directory cannot be used: not a writable folder, or in use by another run."""


class WorkdirInUseError(WorkdirError):
  """Another live run holds the work directory's lock."""


def fail(field: str, message: str):
  """Stops with one line naming the config field and the fix: ``config.FIELD: message``."""
  raise ConfigError(f'config.{field}: {message}')
