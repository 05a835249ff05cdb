"""The server tests' fixtures."""
import pytest


@pytest.fixture
def server(tts_server):
    """The shared server (tests/conftest.py), by its short name."""
    return tts_server
