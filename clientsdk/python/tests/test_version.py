"""__version__ is the installed distribution's version: one source."""

from importlib.metadata import version

import polygate


def test_version_is_the_distributions() -> None:
    assert polygate.__version__ == version("polygate")
