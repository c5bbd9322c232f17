"""Where the operator meets the sidecars: the names and defaults both sides must agree on.

A pod the operator builds starts a sidecar with its subcommand and the environment the operator
set; these tests run that command line and environment through the sidecars' own parsers, and
hold the probes the builders write to the paths the sidecars' apps serve.
"""

from __future__ import annotations

import argparse

import pytest
from prometheus_client import CollectorRegistry

from builders import context
from payloadrun import serving, settings, wipe
from payloadrun.retention import client as retention_client
from payloadrun.retention.cli import RetentionListen
from payloadrun.retention.cli import register as register_retention
from payloadrun.retention.config import RetentionConfig
from payloadrun.settings import Env
from payloadrun.testing.fakevllm import build_parser as fake_vllm_parser
from payloadrun.writer.cli import configs as writer_configs
from payloadrun.writer.cli import register as register_writer
from payloadrun.writer.config import WriterConfig, WriterListen, deprecated_in_use, listen_from
from payloadrun.writer.server import build_app as build_writer_app
from payloadrun_operator.api import names
from payloadrun_operator.api.kinds import CHILD_KINDS, PLURALS
from payloadrun_operator.api.models import (
    GROUP,
    KIND,
    PLURAL,
    VERSION,
    Inference,
    PayloadRunSpec,
    Retention,
    Writer,
)
from payloadrun_operator.desired.builders import build_children
from payloadrun_operator.desired.cleanup import build_cleanup
from payloadrun_operator.desired.context import RunContext
from payloadrun_operator.platform.settings import OperatorSettings


def _children(spec_dict: dict) -> tuple[RunContext, list[dict]]:
    ctx = context(spec_dict, OperatorSettings(), name="r", namespace="ns", uid="uid-1")
    return ctx, build_children(ctx)


def _container(children: list[dict], name: str) -> dict:
    for child in children:
        if child["kind"] in ("StatefulSet", "Job"):
            pod = child["spec"]["template"]["spec"]
            for c in pod["containers"] + pod.get("initContainers", []):
                if c["name"] == name:
                    return c
    raise AssertionError(f"no container {name}")


def _env(container: dict) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container["env"]}


def _ports(container: dict) -> dict[str, int]:
    return {p["name"]: p["containerPort"] for p in container["ports"]}


def _parse(register, argv: list[str]) -> argparse.Namespace:
    """``argv`` through the subcommand's own parser (a SystemExit if it is not its command)."""
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    return parser.parse_args(argv)


def _routes(app) -> set[str]:
    return {r.resource.canonical for r in app.router.routes() if r.method == "GET"}


def _probe_paths(container: dict) -> set[str]:
    return {
        container[probe]["httpGet"]["path"]
        for probe in ("startupProbe", "readinessProbe", "livenessProbe")
    }


def test_the_crd_defaults_are_the_sidecars_defaults():
    writer = listen_from(None, {})
    assert writer.address == ("127.0.0.1", Writer().port)
    assert writer.metrics_port == Writer().metrics_port
    retention = settings.from_args(RetentionListen, None, {})
    assert (retention.port, retention.metrics_port) == (Retention().port, Retention().metrics_port)
    config = RetentionConfig(root="/p", run_id="r")
    assert config.scan_interval_s == Retention().scan_interval_seconds == 60
    assert config.workers == Retention().workers
    assert (
        config.max_off_policy_steps == PayloadRunSpec.model_fields["max_off_policy_steps"].default
    )
    assert WriterConfig().upstream == f"http://127.0.0.1:{Inference.model_fields['port'].default}"
    assert retention_client.DEFAULT_URL.endswith(f":{Retention().port}")


@pytest.mark.parametrize("ports", [{}, {"writer": 8101, "retention": 8202}])
def test_a_pod_and_its_sidecars_started_with_no_flags_agree_on_ports(spec_dict, ports):
    if ports:
        spec_dict["inference"]["port"] = 8500
        spec_dict["inference"]["writer"] = {"port": ports["writer"], "metricsPort": 9501}
        spec_dict["orchestrator"]["retention"] = {"port": ports["retention"], "metricsPort": 9502}
    ctx, children = _children(spec_dict)

    writer = _container(children, names.WRITER_CONTAINER)
    args = _parse(register_writer, writer["args"])
    config, where = writer_configs(args, _env(writer))
    served = _ports(writer)
    assert (
        where.address[1]
        == served[names.WRITER_PORT_NAME]
        == writer["readinessProbe"]["httpGet"]["port"]
    )
    assert where.metrics_port == served[names.WRITER_METRICS_PORT_NAME]
    vllm = _container(children, names.VLLM_CONTAINER)
    assert config.upstream == f"http://127.0.0.1:{vllm['ports'][0]['containerPort']}"
    assert config.payload_root == ctx.root
    service = next(
        c for c in children if c["kind"] == "Service" and c["metadata"]["name"] == "r-inference"
    )
    assert service["spec"]["ports"][0]["targetPort"] == where.address[1]

    retention = _container(children, names.RETENTION_CONTAINER)
    args = _parse(register_retention, retention["args"])
    env = _env(retention)
    listen = settings.from_args(RetentionListen, args, env)
    rconfig = settings.from_args(RetentionConfig, args, env)
    assert listen.metrics_port == _ports(retention)[names.RETENTION_METRICS_PORT_NAME]
    assert listen.metrics_port == retention["readinessProbe"]["httpGet"]["port"]
    assert (rconfig.run_id, str(rconfig.root)) == ("uid-1", ctx.root)
    assert rconfig.scan_interval_s == ctx.spec.orchestrator.retention.scan_interval_seconds
    orchestrator = _env(_container(children, names.ORCHESTRATOR_CONTAINER))
    assert orchestrator[Env.RETENTION_URL] == f"http://127.0.0.1:{listen.port}"


def test_the_probes_are_the_paths_the_sidecars_serve(spec_dict):
    """The kubelet's probes hit what the sidecars' apps route: the writer's proxy app, and
    the retention sidecar's metrics app (its API listens on the pod's loopback)."""
    _, children = _children(spec_dict)
    probes = {serving.HEALTH_PATH, serving.READY_PATH}
    assert _probe_paths(_container(children, names.WRITER_CONTAINER)) == probes
    assert _probe_paths(_container(children, names.RETENTION_CONTAINER)) == probes
    assert probes <= _routes(build_writer_app(WriterConfig()))
    assert probes <= _routes(serving.metrics_app(CollectorRegistry(), lambda: True))


def test_the_cleanup_job_runs_wipe_as_its_parser_reads_it(spec_dict):
    ctx, _ = _children(spec_dict)
    (container,) = build_cleanup(ctx)["spec"]["template"]["spec"]["containers"]
    args = _parse(wipe.register, container["args"])
    assert str(settings.from_args(wipe.WipeConfig, args, {}).root) == ctx.root
    assert args.json is True


def test_every_server_takes_the_same_listen_flags():
    flags = {
        serving.HOST_FLAG: "127.0.0.1",
        serving.PORT_FLAG: "0",
    }
    argv = [x for pair in flags.items() for x in pair]
    writer = _parse(register_writer, ["writer", *argv])
    assert listen_from(writer, {}).address == ("127.0.0.1", 0)
    retention = _parse(register_retention, ["retention", *argv])
    assert (retention.host, retention.port) == ("127.0.0.1", 0)
    fake = fake_vllm_parser().parse_args(argv)
    assert (fake.host, fake.port) == ("127.0.0.1", 0)
    metrics = [serving.METRICS_HOST_FLAG, "0.0.0.0", serving.METRICS_PORT_FLAG, "0"]
    for register, command in ((register_writer, "writer"), (register_retention, "retention")):
        args = _parse(register, [command, *metrics])
        assert (args.metrics_host, args.metrics_port) == ("0.0.0.0", 0)


def test_the_writers_deprecated_listen_still_works_and_warns():
    old = _parse(register_writer, ["writer", "--listen", "0.0.0.0:9000"])
    assert listen_from(old, {}).address == ("0.0.0.0", 9000)
    assert listen_from(None, {Env.WRITER_LISTEN: "0.0.0.0:9001"}).address == ("0.0.0.0", 9001)
    # the new names win at the same level; a flag, old or new, wins over any variable
    env = {Env.WRITER_LISTEN: "0.0.0.0:9001", Env.WRITER_PORT: "9002"}
    assert listen_from(None, env).address == ("0.0.0.0", 9002)
    assert listen_from(old, {Env.WRITER_PORT: "9002"}).address == ("0.0.0.0", 9000)
    assert deprecated_in_use(old, {Env.WRITER_LISTEN: "x:1"}) == [
        "--listen is deprecated: use --host and --port",
        f"{Env.WRITER_LISTEN} is deprecated: set {Env.WRITER_HOST} and {Env.WRITER_PORT}",
    ]


def test_every_variable_the_operator_sets_is_a_declared_name(spec_dict):
    declared = {v for k, v in vars(Env).items() if k.isupper()}
    assert len(declared) == len([k for k in vars(Env) if k.isupper()]), "two names, one variable"
    _, children = _children(spec_dict | {"maxSteps": 10})
    for child in children:
        if child["kind"] in ("StatefulSet", "Job"):
            pod = child["spec"]["template"]["spec"]
            for c in pod["containers"] + pod.get("initContainers", []):
                assert {e["name"] for e in c["env"]} <= declared, c["name"]


def test_one_log_level_variable_for_both_sidecars():
    for cls in (WriterListen, RetentionListen):
        assert settings.settings_of(cls)["log_level"][0].env == Env.LOG_LEVEL
    old = Env.WRITER_LOG_LEVEL_DEPRECATED
    assert settings.from_args(WriterListen, None, {old: "DEBUG"}).log_level == "DEBUG"
    assert settings.deprecated_in_use(WriterListen, {old: "DEBUG"}) == [
        f"{old} is deprecated: set {Env.LOG_LEVEL} instead"
    ]
    both = {old: "DEBUG", Env.LOG_LEVEL: "ERROR"}
    assert settings.from_args(WriterListen, None, both).log_level == "ERROR"
    assert settings.deprecated_in_use(WriterListen, both) == []


def test_one_log_format_setting_from_the_operator_to_both_sidecars(spec_dict):
    """The operator's sidecar log format reaches both sidecars (json unless set), a run's args
    override it for that run, and the operator reads the same flag and variable itself."""
    for cls in (WriterListen, RetentionListen, OperatorSettings):
        (s, _) = settings.settings_of(cls)["log_format"]
        assert (s.flag, s.env, s.choices) == ("--log-format", Env.LOG_FORMAT, ("plain", "json"))
    for chosen in ("json", "plain"):
        ops = OperatorSettings(sidecar_log_format=chosen)
        children = build_children(context(spec_dict, ops, name="r", namespace="ns", uid="u"))
        for name, cls in (
            (names.WRITER_CONTAINER, WriterListen),
            (names.RETENTION_CONTAINER, RetentionListen),
        ):
            env = _env(_container(children, name))
            assert settings.from_args(cls, None, env).log_format == chosen, name
    assert OperatorSettings().sidecar_log_format == "json"
    assert OperatorSettings().log_format == "plain"
    spec_dict["inference"]["writer"] = {"args": ["--log-format", "plain"]}
    _, children = _children(spec_dict)
    writer = _container(children, names.WRITER_CONTAINER)
    args = _parse(register_writer, writer["args"])
    assert listen_from(args, _env(writer)).log_format == "plain"


def test_readiness_finds_the_children_the_builders_name(spec_dict):
    ctx, children = _children(spec_dict)
    built = {(c["apiVersion"], c["kind"], c["metadata"]["name"]) for c in children}
    for api, kind, component in names.WORKLOADS:
        assert (api, kind, names.child_name(ctx.name, component)) in built
    for child in children:
        labels = child["metadata"]["labels"]
        assert labels[names.LABEL_MANAGED_BY] == names.FIELD_MANAGER
        assert (
            f"{names.LABEL_MANAGED_BY}={labels[names.LABEL_MANAGED_BY]}" == names.MANAGED_SELECTOR
        )
        if child["kind"] in ("StatefulSet", "Job"):
            assert (child["apiVersion"], child["kind"]) in CHILD_KINDS
        owner = child["metadata"].get("ownerReferences", [{}])[0]
        assert owner.get("apiVersion", names.API_VERSION) == names.API_VERSION


def test_the_api_version_comes_from_the_models():
    assert f"{GROUP}/{VERSION}" == names.API_VERSION
    assert PLURALS[(names.API_VERSION, KIND)] == PLURAL


def test_sidecar_config_fields_carry_their_variables():
    """Every setting with a variable names a declared one."""
    declared = {v for k, v in vars(Env).items() if k.isupper()}
    for cls in (WriterConfig, WriterListen, RetentionConfig, RetentionListen):
        for name, (s, _) in settings.settings_of(cls).items():
            if s.env is not None:
                assert s.env in declared, (cls.__name__, name)
