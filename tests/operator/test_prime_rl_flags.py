"""The prime-rl examples speak prime-rl 559b447's command lines and configs, and vLLM's arguments.

prime-rl's config package (packages/prime-rl-configs) is not on PyPI, so what its commands take
is transcribed here from its config classes at the commit the docs cite (CLIs built with
prime-pydantic-config 0.4.3: a field ``foo_bar`` of group ``baz`` is ``--baz.foo-bar``; an
unknown flag's dashes become underscores, so ``--weight_broadcast.host`` is
``weight_broadcast.host``), and from its launch templates (multi_node_rl.sbatch.j2,
_launch_rank.sh.j2, _launch_router.sh.j2). Every ``--vllm.*`` key and every key of a config's
``vllm`` table passes through to vLLM verbatim (``VllmConfig`` has ``extra="allow"``): those are
checked against the arguments of the vLLM this suite installs (``hack/vllm.sh``).
"""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from payloadrun_devkit.required import skip_or_fail

PRIME_RL_COMMIT = "559b44772e471d1538537b8805cc77f3824a5e64"
REPO = Path(__file__).resolve().parents[2]
EXAMPLES = ["prime-rl-moe-multinode.yaml", "prime-rl.yaml"]

# packages/prime-rl-configs/src/prime_rl/configs/inference.py at PRIME_RL_COMMIT: InferenceConfig
INFERENCE_KEYS = {"router", "backend_port", "env_vars", "use_deep_gemm", "kv_cache_offload",
                  "use_pd_kv_transfer", "enable_fp32_lm_head", "enable_fp32_router_logits",
                  "output_dir", "dry_run", "server", "vllm", "log", "weight_broadcast",
                  "deployment", "slurm"}  # fmt: skip
INFERENCE_FLAGS = {"--server.host", "--server.port", "--server.liveness-timeout-seconds",
                   "--backend-port", "--output-dir", "--router", "--router.type",
                   "--router.policy", "--weight-broadcast.type", "--log.level",
                   "--vllm"}  # fmt: skip
# configs/orchestrator.py: OrchestratorConfig, its model (ModelConfig) and the client
# (configs/shared.py: ClientConfig)
ORCHESTRATOR_KEYS = {"env_vars", "collect_inference_metrics", "inference_metrics_roles",
                     "output_dir", "tasks_per_minute", "env_server_base_port", "batch_size",
                     "token_batch_size", "group_size", "seq_len", "num_train_workers",
                     "pad_to_multiple_of", "max_steps", "max_off_policy_steps", "model", "algo",
                     "train", "tokenizer", "renderer", "eval", "log", "monitors", "ckpt",
                     "resume", "weight_broadcast", "rollout_transport", "concurrency",
                     "heartbeat"}  # fmt: skip
MODEL_KEYS = {"name", "trust_remote_code", "vlm", "lora", "client"}
ORCHESTRATOR_FLAGS = {"--output-dir", "--max-steps", "--max-off-policy-steps", "--model.name",
                      "--model.client.base-url", "--model.client.admin-base-url",
                      "--model.client.wait-for-ready-timeout", "--model.client.api-key-var",
                      "--model.client.skip-model-check", "--weight_broadcast.host",
                      "--weight-broadcast.host", "--rollout_transport.host",
                      "--rollout-transport.host"}  # fmt: skip
# configs/trainer.py: TrainerConfig
TRAINER_KEYS = {"model", "tokenizer", "data", "loss", "optim", "scheduler", "ckpt", "resume",
                "weight_broadcast", "rollout_transport", "log", "monitors", "output_dir",
                "matmul_precision", "max_steps", "enable_router_replay", "memory_profiler_path",
                "gc", "trace_path", "dist_timeout_seconds", "heartbeat", "metrics_server",
                "enable_token_export", "env_vars"}  # fmt: skip
TRAINER_FLAGS = {"--output-dir", "--max-steps", "--enable-router-replay", "--model.name",
                 "--rollout_transport.host", "--rollout-transport.host"}  # fmt: skip
# weight_broadcast variants with a host (nccl, nixl); filesystem has none
HOSTED_BROADCASTS = {"nccl", "nixl"}
# multi_node_rl.sbatch.j2's torchrun line, and torchrun's own flags the chart uses
TORCHRUN_FLAGS = {"--role", "--nnodes", "--nproc-per-node", "--node-rank", "--rdzv-endpoint",
                  "--rdzv-id", "--log-dir", "--tee", "--redirects", "--local-ranks-filter",
                  "--rdzv-backend", "--master-addr", "--master-port"}  # fmt: skip
# _launch_router.sh.j2's vllm-router line
ROUTER_FLAGS = {"--policy", "--host", "--port", "--request-id-headers", "--prometheus-port",
                "--worker-startup-timeout-secs", "--log-level", "--worker-urls"}  # fmt: skip
# what prime-rl removed before PRIME_RL_COMMIT (d1046b8, 7c8755d): never in the examples or docs
REMOVED = ("--student.client", "--parallel.dp", "--vllm-extra", "01496f7")
TOP_LEVEL_RPC_PORT = re.compile(r"(?<![.\w])--data-parallel-rpc-port")


def documents(name: str) -> list[dict]:
    return [d for d in yaml.safe_load_all((REPO / "examples" / name).read_text()) if d]


def commands(name: str) -> list[str]:
    """Every shell command of the example's containers, continuation lines joined."""
    found = []
    for doc in documents(name):
        if doc.get("kind") != "PayloadRun":
            continue
        for role in ("inference", "orchestrator", "trainer"):
            for key in ("template", "workerTemplate"):
                pod = (doc["spec"][role].get(key) or {}).get("spec") or {}
                for container in [*pod.get("containers", []), *pod.get("initContainers", [])]:
                    for arg in container.get("args") or []:
                        found += re.split(r"[;&|\n]", arg.replace("\\\n", " "))
    return [c for c in found if c.strip()]


def flags_after(command: str, program: str, stop: str | None = None) -> set[str]:
    words = command.split()
    if program not in words:
        return set()
    words = words[words.index(program) + 1 :]
    if stop is not None and stop in words:
        words = words[: words.index(stop)]
    return {w.split("=", 1)[0] for w in words if w.startswith("--")}


def config(name: str, key: str) -> dict:
    (cm,) = [d for d in documents(name) if d.get("kind") == "ConfigMap"]
    return json.loads(cm["data"][key])


@pytest.fixture(scope="module")
def vllm_arguments() -> set[str]:
    """The destinations of the installed vLLM's ``vllm serve`` arguments (engine and server)."""
    found = subprocess.run(["bash", str(REPO / "hack" / "vllm.sh"), "--installed"],
                           capture_output=True, text=True, check=False)  # fmt: skip
    if found.returncode:
        skip_or_fail(f"no vLLM to check the --vllm.* keys against: {found.stderr.strip()}")
    python = Path(found.stdout.strip()) / "venv" / "bin" / "python"
    probe = (
        "from vllm.entrypoints.launchers.cli_args import make_arg_parser\n"
        "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
        "import json; p = make_arg_parser(FlexibleArgumentParser())\n"
        "print(json.dumps(sorted({a.dest for a in p._actions})))"
    )
    out = subprocess.run([str(python), "-c", probe], capture_output=True, text=True,
                         env={"VLLM_TARGET_DEVICE": "cpu", "HF_HUB_OFFLINE": "1"},
                         timeout=300, check=True)  # fmt: skip
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


def vllm_keys(name: str) -> set[str]:
    """Every key the example hands vLLM: ``--vllm.*`` flags, the inference config's ``vllm``
    table and the per-rank ``--vllm @ file`` JSON the command writes."""
    keys = set()
    for command in commands(name):
        for flag in flags_after(command, "inference"):
            if flag.startswith("--vllm."):
                keys.add(flag.removeprefix("--vllm.").replace("-", "_"))
        keys |= set(re.findall(r'"(\w+)": "?%', command))  # printf's JSON of a rank's keys
    with contextlib.suppress(ValueError, KeyError):  # an example without the config
        keys |= set(config(name, "inference.json").get("vllm", {}))
    return keys


def test_the_moe_example_runs_each_rank_as_launch_rank_does():
    inference = [c for c in commands("prime-rl-moe-multinode.yaml") if "inference" in c.split()]
    (command,) = inference
    assert flags_after(command, "inference") == {
        "--server.host", "--server.port", "--vllm.data-parallel-size",
        "--vllm.data-parallel-size-local", "--vllm.api-server-count",
        "--vllm.data-parallel-rpc-port", "--vllm"}  # fmt: skip
    assert "--vllm @ $RPC_BASE/vllm-overrides.json" in command
    assert vllm_keys("prime-rl-moe-multinode.yaml") >= {"data_parallel_rank",
                                                          "data_parallel_address"}  # fmt: skip


@pytest.mark.parametrize("name", EXAMPLES)
def test_every_flag_is_one_prime_rl_559b447_takes(name):
    seen = set()
    for command in commands(name):
        words = command.split()
        if "inference" in words:
            flags = flags_after(command, "inference")
            assert {f for f in flags if not f.startswith("--vllm.")} <= INFERENCE_FLAGS, flags
        if "orchestrator" in words:
            assert flags_after(command, "orchestrator") <= ORCHESTRATOR_FLAGS
        if "torchrun" in words:
            assert flags_after(command, "torchrun", stop="-m") <= TORCHRUN_FLAGS
            assert flags_after(command, "prime_rl.trainer.rl.train") <= TRAINER_FLAGS
        if "trainer" in words and "torchrun" not in words:
            assert flags_after(command, "trainer") <= TRAINER_FLAGS
        if "vllm-router" in words:
            assert flags_after(command, "vllm-router") <= ROUTER_FLAGS
            assert "--request-id-headers x-session-id" in command  # what prime-rl hashes
        seen |= set(words)
    assert {"orchestrator", "inference"} <= seen or {"orchestrator", "trainer"} <= seen


def test_the_configs_hold_only_prime_rl_559b447s_fields():
    name = "prime-rl-moe-multinode.yaml"
    inference = config(name, "inference.json")
    orchestrator = config(name, "orchestrator.json")
    trainer = config(name, "trainer.json")
    assert set(inference) <= INFERENCE_KEYS
    assert inference["router"] is None  # each rank serves itself: the router is apart
    assert set(orchestrator) <= ORCHESTRATOR_KEYS and set(orchestrator["model"]) <= MODEL_KEYS
    assert set(trainer) <= TRAINER_KEYS and set(trainer["model"]) <= MODEL_KEYS
    assert trainer["enable_router_replay"] and inference["vllm"]["enable_return_routed_experts"]
    # --weight_broadcast.host parses only for a variant with a host
    assert orchestrator["weight_broadcast"]["type"] in HOSTED_BROADCASTS


def test_every_key_handed_to_vllm_is_one_of_its_arguments(vllm_arguments):
    keys = vllm_keys("prime-rl-moe-multinode.yaml")
    assert keys and keys <= vllm_arguments, sorted(keys - vllm_arguments)


@pytest.mark.parametrize("path", ["docs/prime-rl.md", *(f"examples/{n}" for n in EXAMPLES)])
def test_nothing_of_an_older_prime_rl_is_left(path):
    text = (REPO / path).read_text()
    for removed in REMOVED:
        assert removed not in text, f"{path} still says {removed}"
    assert not TOP_LEVEL_RPC_PORT.search(text), f"{path}: --data-parallel-rpc-port is --vllm.'s"
    assert PRIME_RL_COMMIT[:7] in text
