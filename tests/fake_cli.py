"""`gluon-survey` with the fake modes of `fakes.py` installed in this process: the whole CLI in a
subprocess of a test (e.g. one that sends it Ctrl-C). Run as a script, with the CLI's arguments."""

import sys

import fakes
from gluon_survey.driver import cli

if __name__ == "__main__":
    fakes.install(setattr)
    sys.exit(cli.main())
