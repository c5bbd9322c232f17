"""Check Grafana dashboards against Grafana's own published schema, offline.

    python hack/dashboard-schema/check_dashboards.py                 # the chart's dashboards
    python hack/dashboard-schema/check_dashboards.py FILE.json ...   # these

Grafana publishes its dashboard model as TypeScript types (npm ``@grafana/schema``); no JSON Schema
of it is published. So each dashboard becomes ``const dashboard: CheckedDashboard = <its JSON>;``
(``dashboard.ts`` beside this file says what CheckedDashboard adds to Grafana's types) and the
TypeScript compiler checks them all in one ``tsc --noEmit --strict`` run: unknown keys at any
depth, wrong value types, values outside an enum, missing required keys. Each problem is reported
as ``file:line: json.path: message``. tsc reports the first problem of an object and may hide the
others in that object behind it: fix, then run again.

``bash hack/dashboard-schema.sh`` installs the pinned packages (``make dashboard-schema``; ``make
test`` does it first) into the cache outside the repository; this script never installs.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
DASHBOARDS = REPO / "charts" / "payloadrun" / "dashboards"
INSTALLER = REPO / "hack" / "dashboard-schema.sh"

TSCONFIG = {
    "compilerOptions": {
        "strict": True,
        "noEmit": True,
        "module": "esnext",
        "moduleResolution": "bundler",
        "target": "es2022",
        "types": [],
        # Grafana's own .d.ts files are not ours to check; every dashboard is.
        "skipLibCheck": True,
    }
}
# the JSON starts on the first line, so the .ts file's line numbers are the JSON text's
PREFIX = "const dashboard: CheckedDashboard = "
SUFFIX = ";\nimport type { CheckedDashboard } from './dashboard';\nexport {};\n"
# tsc spells out the expected object type in full (our exact types have no short names): the
# JSON path already says which object, so a long type is cut to {...}
LONG_TYPE = re.compile(r"'\{ [^']{40,}'")
TSC_LINE = re.compile(r"^(?P<file>[^(]+)\((?P<line>\d+),(?P<col>\d+)\): error (?P<code>TS\d+): ")


class NotInstalled(RuntimeError):
    """The pinned packages are not in the cache (or node is missing)."""


@dataclass(frozen=True)
class Problem:
    file: Path
    line: int | None  # None when the file is not laid out as json.dumps(indent=2) writes it
    path: str  # where in the JSON, e.g. panels[0].gridPos
    message: str

    def __str__(self) -> str:
        where = display(self.file) + (f":{self.line}" if self.line else "")
        return f"{where}: {self.path}: {self.message}"


def display(path: Path) -> str:
    try:
        return str(path.relative_to(REPO))
    except ValueError:
        return str(path)


def installed() -> Path:
    """The directory with node_modules that hack/dashboard-schema.sh installed, without
    installing anything (so no network): NotInstalled says what to run when it is missing."""
    if not shutil.which("node"):
        raise NotInstalled("node is not installed: bash hack/dashboard-schema.sh installs it")
    result = subprocess.run(
        ["bash", str(INSTALLER), "--installed"], capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        raise NotInstalled(result.stderr.strip())
    return Path(result.stdout.strip())


def json_lines(value: Any, path: str = "", indent: int = 0) -> list[tuple[str, str]]:
    """``json.dumps(value, indent=2)`` line by line, each line with the JSON path it belongs to,
    so a compiler error at a line names the key."""
    pad = "  " * indent
    if isinstance(value, dict) and value:
        items = list(value.items())
        out = [("{", path)]
        for i, (key, item) in enumerate(items):
            child = f"{path}.{key}" if path else str(key)
            lines = json_lines(item, child, indent + 1)
            first, rest = lines[0], lines[1:]
            lines = [(f"{pad}  {json.dumps(key)}: {first[0]}", child), *rest]
            if i < len(items) - 1:
                lines[-1] = (lines[-1][0] + ",", lines[-1][1])
            out += lines
        return [*out, (f"{pad}}}", path)]
    if isinstance(value, list) and value:
        out = [("[", path)]
        for i, item in enumerate(value):
            lines = json_lines(item, f"{path}[{i}]", indent + 1)
            lines[0] = (f"{pad}  {lines[0][0]}", lines[0][1])
            if i < len(value) - 1:
                lines[-1] = (lines[-1][0] + ",", lines[-1][1])
            out += lines
        return [*out, (f"{pad}]", path)]
    return [(json.dumps(value), path)]


def check(files: list[Path], env: Path | None = None) -> list[Problem]:
    """Every schema problem of these dashboard files, from one compiler run."""
    env = env or installed()
    problems: list[Problem] = []
    with tempfile.TemporaryDirectory(prefix="dashboard-schema-") as tmp:
        work = Path(tmp)
        (work / "node_modules").symlink_to(env / "node_modules")
        (work / "dashboard.ts").write_text((HERE / "dashboard.ts").read_text())
        sources: dict[str, tuple[Path, list[str], bool]] = {}
        for i, file in enumerate(files):
            original = file.read_text()
            try:
                board = json.loads(original)
            except json.JSONDecodeError as exc:
                problems.append(Problem(file, exc.lineno, "(not JSON)", exc.msg))
                continue
            lines = json_lines(board)
            text = "\n".join(line for line, _ in lines)
            name = f"d{i}.ts"
            (work / name).write_text(PREFIX + text + SUFFIX)
            # Line numbers are the file's own when it is laid out as json.dumps(indent=2) writes
            # it (hack/dashboards.py does); otherwise only the JSON path tells where.
            canonical = original.rstrip("\n") == text
            sources[name] = (file, [p for _, p in lines], canonical)
        if not sources:
            return problems
        (work / "tsconfig.json").write_text(json.dumps({**TSCONFIG, "files": sorted(sources)}))
        tsc = env / "node_modules" / "typescript" / "bin" / "tsc"
        result = subprocess.run(
            ["node", str(tsc), "-p", str(work), "--pretty", "false"],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
            cwd=work,
        )
        output = result.stdout + result.stderr
        problems += parse(output, sources)
        if result.returncode != 0 and not problems:
            raise RuntimeError(f"tsc failed without a dashboard error:\n{output}")
    return problems


def parse(output: str, sources: dict[str, tuple[Path, list[str], bool]]) -> list[Problem]:
    """tsc's errors (``dN.ts(line,col): error TSnnnn: message``) as Problems of the JSON files."""
    problems: list[Problem] = []
    for raw in output.splitlines():
        match = TSC_LINE.match(raw)
        if not match:
            if problems and raw.startswith(" "):  # a message continued on the next line
                last = problems[-1]
                problems[-1] = replace(last, message=f"{last.message} {raw.strip()}")
            continue
        name = Path(match["file"]).name
        message = LONG_TYPE.sub("'{...}'", raw[match.end() :].strip())
        if name not in sources:  # an error in dashboard.ts itself: show it as it is
            problems.append(Problem(HERE / name, int(match["line"]), "(types)", message))
            continue
        file, paths, canonical = sources[name]
        line = int(match["line"])
        path = paths[line - 1] if line <= len(paths) else ""
        problems.append(Problem(file, line if canonical else None, path or "(top level)", message))
    return problems


def main(argv: list[str] | None = None) -> int:
    args = argv if argv is not None else sys.argv[1:]
    files = [Path(a).resolve() for a in args] or sorted(DASHBOARDS.glob("*.json"))
    try:
        problems = check(files)
    except NotInstalled as exc:
        print(exc, file=sys.stderr)
        return 2
    for problem in problems:
        print(problem)
    if problems:
        print(f"{len(problems)} schema problem(s) in {len({p.file for p in problems})} file(s)")
        return 1
    print(f"{len(files)} dashboard(s) match Grafana's schema")
    return 0


if __name__ == "__main__":
    sys.exit(main())
