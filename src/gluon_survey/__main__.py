"""`python -m gluon_survey` is `gluon-survey`."""

from gluon_survey.cli import main

raise SystemExit(main())
