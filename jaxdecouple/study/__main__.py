"""python -m jaxdecouple.study: see jaxdecouple/study/__init__.py."""
import sys

from jaxdecouple.study.cli import _console_logging, main

_console_logging()
sys.exit(main())
