"""What every benchmark prints the same way: the machine's load, and its goals with "met"/"NO".

The benchmarks are scripts (``python bench/<name>.py``), so this module is imported as ``report``
from the script's own directory. A goal is judged on a ratio or a figure measured in the same
run; the load at the start and at the end says how much to trust it on a shared machine.
"""

from __future__ import annotations

import os
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass


def machine_load() -> str:
    """The 1/5/15-minute load averages and the CPU count, e.g. ``load 0.68 0.80 0.76 (2 CPUs)``."""
    one, five, fifteen = os.getloadavg()
    return f"load {one:.2f} {five:.2f} {fifteen:.2f} ({os.cpu_count()} CPUs)"


def print_load(when: str) -> str:
    """Print and return the machine's load, labelled ``when`` ("start", "end")."""
    line = machine_load()
    print(f"machine at {when}: {line}", flush=True)
    return line


@dataclass(frozen=True)
class Goal:
    """One measured figure against its goal: ``met`` is decided by the caller's comparison (None:
    a figure reported beside the goals, with no goal of its own); ``ratio``, the figure over its
    goal's bound (at most 1 meets an upper bound, at least 1 a lower one)."""

    measure: str
    value: float
    goal: str
    met: bool | None
    ratio: float | None = None

    @classmethod
    def figure(cls, measure: str, value: float) -> Goal:
        return cls(measure, value, "(figure)", None)

    @classmethod
    def at_least(cls, measure: str, value: float, floor: float) -> Goal:
        return cls(measure, value, f">= {floor:g}", value >= floor, _ratio(value, floor))

    @classmethod
    def at_most(cls, measure: str, value: float, ceiling: float) -> Goal:
        return cls(measure, value, f"<= {ceiling:g}", value <= ceiling, _ratio(value, ceiling))


def _ratio(value: float, bound: float) -> float | None:
    return value / bound if bound else None


def print_goals(goals: Sequence[Goal], fmt: Callable[[float], str] = "{:.2f}".format) -> dict:
    """A table of the goals (measure, value, goal, the value's ratio to the goal's bound,
    met/NO); returns them as JSON-ready dicts."""
    width = max([len(g.measure) for g in goals] + [len("measure")]) + 2
    head = f"{'measure':<{width}}{'value':>10}  {'goal':<10}{'/ goal':>7}{'met':>5}"
    print(head)
    print("-" * len(head))
    for g in goals:
        met = "" if g.met is None else "met" if g.met else "NO"
        ratio = "" if g.ratio is None else f"{g.ratio:.2f}"
        print(f"{g.measure:<{width}}{fmt(g.value):>10}  {g.goal:<10}{ratio:>7}{met:>5}")
    return {g.measure: asdict(g) for g in goals}


def scrape(url: str, timeout: float = 30) -> dict[tuple[str, tuple], float]:
    """(sample name, sorted labels) -> value of every sample on a /metrics page."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url, timeout=timeout) as resp:
        text = resp.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(m: dict, name: str, **labels: str) -> float:
    """One sample of a :func:`scrape`, 0 when the page has none."""
    return m.get((name, tuple(sorted(labels.items()))), 0.0)
