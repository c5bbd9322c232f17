import copy

import pytest

BASE_SPEC = {
    "deploymentType": "MultiNode",
    "routerReplay": True,
    "samplingMaskCapture": False,
    "inference": {"image": "vllm/vllm-openai:v0.33.0", "replicas": 2},
    "orchestrator": {"image": "example/orchestrator:1"},
    "trainer": {"image": "example/trainer:1", "replicas": 4},
}


@pytest.fixture
def spec_dict():
    """A multi-node router-replay run; tests change what they study."""
    return copy.deepcopy(BASE_SPEC)
