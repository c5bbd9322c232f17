"""docs/operations.md's commands run as written, against a real run (issue 34).

How the page marks what it shows, and what each kind of block gets here:

- ```` ```bash runbook ````: commands a user runs against their cluster. They need the chart
  installed and a run with pods, so they are not test_docs.py's (that test runs the blocks fenced
  exactly ```` ```bash ```` or ```` ```sh ````, before the session's cluster starts; it never sees
  these, and :func:`test_runbook_blocks_are_not_run_by_test_docs` keeps it so). Each block runs in
  ``bash -euo pipefail`` from the repository root, one command after the other, and fails the
  test when a command exits non-zero; :data:`EXPECTED` checks the output where the page says what
  it shows.
- A line ``NAME=value  # ...`` of a runbook block that sets one of :data:`PLACEHOLDERS` is a
  setting the user writes once (the Troubleshooting section sets ``NS``, ``RUN``, ``POD``,
  ``OPERATOR_NS``, ``OPERATOR``): the test drops it and sets the variable to the real run's.
- A few commands cannot run against a healthy run as written: :data:`REWRITTEN` runs them in a way
  that proves them (``--dry-run=server``), :data:`NOT_RUN` lists the rest with the reason.
- ```` ```promql ````: one query a line, the run written in as ``"NS"`` and ``"RUN"``. Every query
  must parse (``promtool check rules`` on a rules file made of them) and every ``payloadrun_*``
  name on the page must be a metric the code exports.
- ```` ```console ````: a transcript (a command and what it printed), not run here. The page's one
  (the client-side apply of the CRD, refused) is checked by test_templates_api.py.

Where the commands run: test_e2e.py's module, which has what they need and already paid for it
(the chart installed as ``payloadrun`` in ``payloadrun-system`` with two operator pods, a run by
handle with its pods on the local node), calls :func:`run_the_runbook` between its tests: after
its writer was killed and restarted (so ``--previous`` has a container to show) and after a batch
was consumed (so the policy step is one the trainer has read).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from payloadrun_devkit import required

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "operations.md"
FENCE = re.compile(r"^```(.*?)\n(.*?)^```\s*$", re.S | re.M)
RUNBOOK, PROMQL = "bash runbook", "promql"
# the variables a user sets once; the test sets them to the real run's
PLACEHOLDERS = ("NS", "RUN", "POD", "OPERATOR_NS", "OPERATOR", "STEP")
SETTING = re.compile(rf"^({'|'.join(PLACEHOLDERS)})=\S*\s*(#.*)?$")

# Commands that would change a healthy install, run so that the API server checks them whole and
# changes nothing.
REWRITTEN = {
    # test_e2e.py installed the release: the same install, checked by the API server, not applied
    "helm install payloadrun charts/payloadrun --namespace payloadrun-system --create-namespace "
    "--set operator.watchNamespaces='{ml-team}'": "--dry-run=server",
    # it would take the CRD's fields from the release's manager
    "kubectl apply --server-side --force-conflicts -f crds/": "--dry-run=server",
}
# Commands not run here, and why. Keep it short: a command belongs here only when no run of the
# session can show it.
NOT_RUN = {
    'kubectl -n "$NS" logs job/"$RUN"-cleanup': "the cleanup Job exists only once a run has "
    "ended; its name is checked against the operator's in test_the_names_are_the_operators",
    "kubectl get podmonitor -A": "the session's cluster has no Prometheus Operator CRDs",
    "kubectl get servicemonitor -A": "the session's cluster has no Prometheus Operator CRDs",
}


STATUS_KEYS = {"policy_step", "recorded_step", "pending_steps", "pending_files", "queue_files"}
STATUS_KEYS |= {"directory", "journal_bytes", "journal_fenced"}


def _json(output: str) -> dict:
    return json.loads(output.strip().splitlines()[-1])


# What the page says a command shows: a command's text (a part of it) -> a check of its output.
EXPECTED: dict[str, Callable[[str, dict[str, str]], bool]] = {
    # the keys the page lists
    "/v1/status": lambda out, v: (
        set(_json(out)) >= STATUS_KEYS and {"bytes", "files"} <= set(_json(out)["directory"])
    ),
    "custom-columns=NAMESPACE": lambda out, v: (
        re.search(rf"^{v['NS']}\s+{v['RUN']}\s+(?!<none>)\S+$", out, re.M) is not None
    ),
    # the volume's figures at the run's payload root (status.payloadRoot: where the run mounts
    # its volume, /payloads or its run directory): a filesystem line with its mount point
    'df -h "$ROOT"': lambda out, v: (
        out.splitlines()[0].startswith("Filesystem")
        and re.search(r"\s\d+%\s+/\S*$", out.rstrip()) is not None
    ),
    "policy_updated($STEP)": lambda out, v: out.strip() != "",
    "journal.jsonl": lambda out, v: "/.retention/journal.jsonl" in out,
    "/readyz": lambda out, v: "payload_root" in _json(out),
    "--previous": lambda out, v: "listening" in out,
    "get deploy,pods": lambda out, v: f"deployment.apps/{v['OPERATOR']} " in out,
    "get lease": lambda out, v: "holderIdentity: payloadrun-operator@" in out,
    "auth can-i": lambda out, v: out.strip() == "yes",
    '@.type=="Applied"': lambda out, v: (
        _json(out)["type"] == "Applied" and _json(out)["status"] == "True"
    ),
    "{.status.failure}": lambda out, v: out.strip() == "",  # a healthy run has none
}


def fenced(info: str, page: Path = PAGE) -> list[tuple[int, str]]:
    """The blocks of ``page`` fenced with ``info``: (line number, text)."""
    text = page.read_text()
    return [
        (text.count("\n", 0, m.start()) + 1, m.group(2))
        for m in FENCE.finditer(text)
        if m.group(1).strip() == info
    ]


def commands(block: str) -> list[str]:
    """A block's commands: lines joined across a trailing backslash, settings and comment lines
    left out, whitespace as written."""
    joined = re.sub(r"\\\n\s*", "", block)
    return [
        line
        for line in joined.splitlines()
        if line.strip() and not line.lstrip().startswith("#") and not SETTING.match(line.strip())
    ]


def normal(command: str) -> str:
    """A command without its trailing comment and runs of spaces (to look it up)."""
    return " ".join(re.sub(r"\s+#[^'\"]*$", "", command).split())


def runnable(command: str) -> str | None:
    """The command as it runs here (rewritten), or None when it is not run."""
    key = normal(command)
    if key in NOT_RUN:
        return None
    return f"{key} {REWRITTEN[key]}" if key in REWRITTEN else command


def expectation(command: str) -> Callable[[str, dict[str, str]], bool] | None:
    found = [check for part, check in EXPECTED.items() if part in command]
    assert len(found) <= 1, f"two EXPECTED entries match {command!r}"
    return found[0] if found else None


def runbook_commands() -> list[tuple[int, str]]:
    return [(line, c) for line, block in fenced(RUNBOOK) for c in commands(block)]


# ---- against a real run (called by test_e2e.py) -----------------------------------------------
def run_the_runbook(
    kubeconfig: str,
    env: dict[str, str],
    values: dict[str, str],
    home: Path,
) -> list[str]:
    """Every runbook command of the page, block by block, with ``values`` for the placeholders;
    returns the commands run. Fails at the first command that exits non-zero or shows what the
    page says it does not."""
    assert set(values) == set(PLACEHOLDERS), values
    env = {**env, **values, "KUBECONFIG": kubeconfig, "HOME": str(home)}
    ran = []
    for line, block in fenced(RUNBOOK):
        steps = [(c, runnable(c)) for c in commands(block)]
        steps = [(c, r) for c, r in steps if r is not None]
        if not steps:
            continue
        # each command's output after a marker line, so the outputs are told apart
        script = "\n".join(f"echo '@@@ {i}'\n{run}" for i, (_, run) in enumerate(steps))
        result = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", script],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        outputs = re.split(r"^@@@ \d+\n", result.stdout, flags=re.M)[1:]
        if result.returncode != 0:
            failed = steps[len(outputs) - 1][1] if outputs else script
            pytest.fail(
                f"docs/operations.md:{line}: `{failed}` exited {result.returncode}\n"
                f"--- stdout\n{outputs[-1] if outputs else result.stdout}"
                f"\n--- stderr\n{result.stderr[-3000:]}",
                pytrace=False,
            )
        for (command, run), output in zip(steps, outputs, strict=True):
            check = expectation(command)
            assert check is None or check(output, values), (
                f"docs/operations.md:{line}: `{run}` does not show what the page says:\n{output}"
            )
            ran.append(run)
    return ran


# ---- the page itself (no cluster) ---------------------------------------------------------------
def test_the_page_has_runbook_commands_and_queries():
    assert len(runbook_commands()) >= 30
    assert len([q for _, b in fenced(PROMQL) for q in b.splitlines() if q.strip()]) >= 20


def test_every_block_is_of_a_known_kind():
    """A command in an unmarked block would be run by nobody."""
    kinds = {m.group(1).strip() for m in FENCE.finditer(PAGE.read_text())}
    assert kinds <= {RUNBOOK, PROMQL, "console", "json", "yaml"}, kinds


def test_runbook_blocks_are_not_run_by_test_docs():
    sys.path.insert(0, str(Path(__file__).parent))
    import test_docs

    theirs = {block for _, block in test_docs.blocks()}
    assert not theirs & {block for _, block in fenced(RUNBOOK)}


def test_every_variable_is_a_placeholder_the_page_sets():
    """A user can run each command after setting the placeholders once; the test sets them all."""
    settings: set[str] = set()
    for _, block in fenced(RUNBOOK):
        settings |= {m.group(1) for line in block.splitlines() if (m := SETTING.match(line))}
    assert settings == set(PLACEHOLDERS)
    for line, block in fenced(RUNBOOK):
        assigned = set(re.findall(r"^([A-Z_]+)=", block, re.M))
        used = set(re.findall(r"\$\{?([A-Z_]+)", block))
        assert used <= set(PLACEHOLDERS) | assigned, f"docs/operations.md:{line}: {used}"


def test_the_lists_of_commands_name_commands_of_the_page():
    """A command edited on the page leaves no stale entry (it would then run unchecked)."""
    on_page = {normal(c) for _, c in runbook_commands()}
    assert set(NOT_RUN) <= on_page and set(REWRITTEN) <= on_page
    for part in EXPECTED:
        assert any(part in c for _, c in runbook_commands()), f"EXPECTED {part!r} matches nothing"
    assert len(NOT_RUN) <= 3, "run a command in a way that proves it rather than skip it"


def test_the_names_are_the_operators():
    """The names the commands build from ``$RUN`` are those the operator gives (names.py), and
    the chart's (release ``payloadrun``: Deployment, Lease, Role)."""
    from payloadrun_operator.api import names

    page = PAGE.read_text()
    for component in (names.INFERENCE, names.ORCHESTRATOR, names.TRAINER, names.CLEANUP):
        assert f'"$RUN"-{component}' in page or f"$RUN-{component}" in page, component
        assert names.child_name("r", component) == f"r-{component}"
    for container in (names.WRITER_CONTAINER, names.RETENTION_CONTAINER):
        assert f"-c {container}" in page
    helpers = (REPO / "charts/payloadrun/templates/_helpers.tpl").read_text()
    assert (
        'PAYLOADRUN_LEASE_NAME\n  value: {{ include "payloadrun.fullname" . | quote }}' in helpers
    )
    assert "`payloadrun-leader-election`" in page and "RELEASE-payloadrun-" not in page


def test_the_log_lines_grepped_are_logged():
    """Each phrase a command greps the logs for is in a log call of the code."""
    code = "\n".join(
        p.read_text() for d in ("sidecars", "operator") for p in (REPO / d).rglob("*.py")
    )
    phrases = []
    for _, command in runbook_commands():
        for match in re.finditer(r'grep -([FE]) "([^"]+)"', command):
            flag, pattern = match.groups()
            phrases += pattern.split("|") if flag == "E" else [pattern]
    assert len(phrases) >= 8
    missing = [p for p in phrases if p not in code]
    assert not missing, f"no log line of the code says {missing}"


def exported_metrics() -> set[str]:
    from prometheus_client import CollectorRegistry

    from payloadrun.retention.metrics import RetentionMetrics
    from payloadrun.writer.metrics import WriterMetrics
    from payloadrun_operator.platform.metrics import OperatorMetrics

    registries = [
        WriterMetrics().registry,
        RetentionMetrics(CollectorRegistry()).registry,
        OperatorMetrics().registry,
    ]
    families = [family for registry in registries for family in registry.collect()]
    return {f.name for f in families} | {s.name for f in families for s in f.samples}


def test_every_metric_the_page_names_is_exported():
    """In its queries and in its prose: a renamed metric leaves a runbook that finds nothing."""
    named = set(re.findall(r"\bpayloadrun_[a-z_]+\b", PAGE.read_text()))
    named.discard("payloadrun_devcluster")  # the local cluster's module, named in the prose
    assert len(named) >= 20
    assert named - exported_metrics() == set()


def test_every_query_parses(tmp_path):
    promtool = required.tool("promtool", "bash hack/prometheus.sh installs Debian's prometheus")
    queries = [q for _, b in fenced(PROMQL) for q in b.splitlines() if q.strip()]
    rules = {
        "groups": [
            {
                "name": "runbook",
                "rules": [
                    {"record": f"runbook:query_{i}", "expr": q} for i, q in enumerate(queries)
                ],
            }
        ]
    }
    path = tmp_path / "runbook.rules.yaml"
    path.write_text(json.dumps(rules))  # JSON is YAML
    result = subprocess.run(
        [promtool, "check", "rules", str(path)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(queries)} rules found" in result.stdout, result.stdout


# flags of other programs the prose names: kubectl, helm, a GlusterFS mount, the dev cluster
OTHERS_FLAGS = {
    "--for", "--force-conflicts", "--set", "--set-string", "--help",
    "--attribute-timeout", "--entry-timeout", "--negative-timeout", "--node",
}  # fmt: skip


def test_every_flag_and_variable_the_prose_names_exists():
    """The sidecars' and the operator's flags and ``PAYLOADRUN_*`` variables the page names are
    theirs (a renamed flag leaves a runbook that says to set nothing)."""
    prose = re.sub(r"^```.*?^```", "", PAGE.read_text(), flags=re.S | re.M)
    # each version's upgrade notes (CHANGELOG.md's, repeated) name flags of that version's past,
    # removed ones too, and of other commands (kubectl annotate --overwrite)
    prose = re.sub(r"^### \d+\.\d+\.\d+.*?(?=^## )", "", prose, flags=re.S | re.M)
    helps = "\n".join(
        subprocess.run(
            [sys.executable, "-m", *program, "--help"],
            capture_output=True, text=True, check=True, timeout=60,
        ).stdout
        for program in (["payloadrun.cli", "writer"], ["payloadrun.cli", "retention"],
                        ["payloadrun_operator"])
    )  # fmt: skip
    flags = set(re.findall(r"(?<![\w-])--[a-z][a-z-]+", prose)) - OTHERS_FLAGS
    assert len(flags) >= 5
    assert {f for f in flags if not re.search(rf"{f}\b", helps)} == set()
    code = "\n".join(
        p.read_text()
        for d in ("sidecars", "operator", "charts")
        for p in (REPO / d).rglob("*")
        if p.suffix in (".py", ".tpl", ".yaml")
    )
    variables = set(re.findall(r"\bPAYLOADRUN_[A-Z_]+[A-Z]\b", prose))
    assert variables and {v for v in variables if v not in code} == set()
