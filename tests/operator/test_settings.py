import pytest

from payloadrun_operator.platform.settings import (
    DEFAULT_SIDECAR_IMAGE,
    OperatorSettings,
    SettingsError,
)


def test_defaults():
    s = OperatorSettings.from_env({})
    assert s.sidecar_image == DEFAULT_SIDECAR_IMAGE and s.namespaces == ()
    assert s.watch_server_timeout < s.watch_client_timeout


def test_from_env():
    s = OperatorSettings.from_env(
        {
            "PAYLOADRUN_SIDECAR_IMAGE": "r/p:1",
            "PAYLOADRUN_NAMESPACES": "a, b,,",
            "PAYLOADRUN_WRITER_RESOURCES": '{"limits": {"memory": "1Gi"}}',
            "PAYLOADRUN_METRICS_PORT": "0",
        }
    )
    assert s.sidecar_image == "r/p:1"
    assert s.namespaces == ("a", "b")
    assert s.writer_resources == {"limits": {"memory": "1Gi"}}
    assert s.metrics_port == 0


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"PAYLOADRUN_METRICS_PORT": "x"}, "PAYLOADRUN_METRICS_PORT='x': not an integer"),
        ({"PAYLOADRUN_HEALTH_PORT": "70000"}, "PAYLOADRUN_HEALTH_PORT.* must be at most 65535"),
        ({"PAYLOADRUN_WRITER_RESOURCES": "{"}, "not valid JSON"),
        ({"PAYLOADRUN_RETENTION_RESOURCES": "[]"}, "must be a JSON object"),
        (
            {"PAYLOADRUN_SIDECAR_IMAGE_PULL_POLICY": "Sometimes"},
            "must be one of Always, IfNotPresent, Never",
        ),
    ],
)
def test_bad_env(env, message):
    with pytest.raises(SettingsError, match=message):
        OperatorSettings.from_env(env)
