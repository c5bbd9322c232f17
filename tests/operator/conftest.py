import pytest

from builders import run_spec


@pytest.fixture
def spec_dict():
    """A multi-node router-replay run (builders.SPEC); tests change what they study."""
    return run_spec()
