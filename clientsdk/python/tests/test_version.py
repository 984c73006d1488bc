"""__version__ is the installed distribution's version: one source. The
distribution is polygate-sdk (PyPI's polygate is someone else's); the import
package is polygate."""

from importlib.metadata import packages_distributions, version

import polygate


def test_version_is_the_distributions() -> None:
    assert polygate.__version__ == version("polygate-sdk")


def test_the_import_package_comes_from_polygate_sdk() -> None:
    assert packages_distributions()["polygate"] == ["polygate-sdk"]
