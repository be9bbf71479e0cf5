"""Tests of scripts/ (not a package: each script is imported by name)."""

import sys

from tests.conftest import REPO


def script(name: str):
    """Import ``scripts/<name>.py`` as a module (scripts/ on sys.path only while importing)."""
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        return __import__(name)
    finally:
        sys.path.remove(str(REPO / "scripts"))
