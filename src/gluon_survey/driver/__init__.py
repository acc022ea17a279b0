"""The benchmark driver: the `gluon-survey` command (cli), the sweep (runner, worker), the timer
(timing), correctness (check), results files and reports (results, report), machine facts
(hardware), problem sizes (shapes) and the GPU-less compiler report (inspect). It sits on top of
the library (`gluon_survey.api`, `gluon_survey.registry`); nothing in the library imports it."""
