"""A sweep worker whose providers are the fakes of `fakes.py` (CPU, crash, hang): the real worker
loop, `gluon_survey.driver.worker.main`, with another provider factory. Run as a script."""

from fakes import fake_provider
from gluon_survey.driver import worker

if __name__ == "__main__":
    worker.main(make_provider=fake_provider)
