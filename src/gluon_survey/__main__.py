"""`python -m gluon_survey` is `gluon-survey`."""

from gluon_survey.driver.cli import main

raise SystemExit(main())
