"""The READMEs' Python examples run, as chispa runs its README: a block that breaks is a bug.

Every ```python block of a README.md (the repository's and its folders') runs, top to bottom, in
a namespace of its own, against a small mirror of the demo's shape standing in for the table
`make demo` leaves at `demo-output/mirror`: the examples' `demo-output/` paths are pointed at it
(Spark resolves a relative path against its JVM's folder, not the test's). A block preceded by a
`<!-- not run: REASON -->` line is illustrative and is not run.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from replicator.cli.demo import demo_config
from replicator.pipeline.runner import run_replication
from replicator.sim.bucket import SimBucket
from replicator.sim.cluster import SimCluster
from replicator.sim.workload import WorkloadMix, initial_load

pytestmark = pytest.mark.spark

REPO = Path(__file__).resolve().parents[1]
FENCE = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
NOT_RUN = re.compile(r"<!--\s*not run:.*-->\s*$")


@dataclass(frozen=True)
class Example:
    """One ```python block: where it is, its code, and whether a marker says not to run it."""

    readme: Path
    line: int
    code: str
    run: bool

    @property
    def name(self) -> str:
        return f"{self.readme.relative_to(REPO)}:{self.line}"


def readmes() -> list[Path]:
    """README.md at the top and one folder down (not in hidden folders such as .venv)."""
    found = [REPO / "README.md", *sorted(REPO.glob("*/README.md"))]
    return [path for path in found if path.is_file() and not path.parent.name.startswith(".")]


def examples_in(readme: Path) -> list[Example]:
    text = readme.read_text(encoding="utf-8")
    examples = []
    for match in FENCE.finditer(text):
        line = text.count("\n", 0, match.start(1)) + 1  # the block's first line of code
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        examples.append(Example(readme, line, match.group(1), run=not NOT_RUN.search(before)))
    return examples


EXAMPLES = [example for readme in readmes() for example in examples_in(readme)]


def test_the_readmes_have_examples_to_run() -> None:
    assert any(example.run for example in EXAMPLES), [e.name for e in EXAMPLES]


def test_a_block_after_a_not_run_marker_is_only_listed(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text(
        "# T\n\n<!-- not run: needs a cluster -->\n```python\nconnect()\n```\n\n"
        "```python\nx = 1\n```\n"
    )
    assert [(e.line, e.code, e.run) for e in examples_in(readme)] == [
        (5, "connect()\n", False),
        (9, "x = 1\n", True),
    ]


def build_demo_like_mirror(spark: Any, target: Path) -> None:
    """The demo's collections and keys, small, in the shape the examples read: more than 17
    vbuckets (they read vbucket 17), more than 7 table versions (versions 3 to 7), a rollback.

    The load commits in batches of at most 50 rows, so it spreads over several versions; a
    round of changes follows, then the busiest vbucket fails over to a replica that lacked its
    last changes, which the mirror had committed, so the next run rolls it back.
    """
    bucket = SimBucket("shop", num_vbuckets=32, seed=2026)
    mix = WorkloadMix(inserts=0.2, updates=0.6, deletes=0.2, expiries=0.0)
    workload = initial_load(bucket, docs=400, doc_size=200, seed=2026, mix=mix)
    with SimCluster(bucket, nodes=1) as cluster:
        config = demo_config(
            cluster,
            target,
            until_caught_up=True,
            commit_interval_s=0.2,
            commit_max_rows=50,
            progress="off",
        )
        run_replication(config, spark=spark)
        changed = bucket.apply_batch(workload.next_batch(100))
        run_replication(config, spark=spark)
        victim, count = Counter(item.vbucket for item in changed).most_common(1)[0]
        cluster.failover(victim, lose_last=min(3, count))
        bucket.apply_batch(workload.next_batch(40))
        run_replication(config, spark=spark)


@pytest.fixture(scope="module")
def demo_output(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A `demo-output` folder holding `mirror`, as `make demo` leaves it."""
    output = tmp_path_factory.mktemp("readme") / "demo-output"
    build_demo_like_mirror(spark, output / "mirror")
    versions = len(list((output / "mirror" / "_delta_log").glob("*.json")))
    assert versions > 7, f"the examples read versions up to 7; the mirror has {versions}"
    return output


@pytest.mark.parametrize("example", [e for e in EXAMPLES if e.run], ids=lambda e: e.name)
def test_readme_example_runs(example: Example, demo_output: Path) -> None:
    code = example.code.replace("demo-output/", f"{demo_output}/")
    # Padded so that a traceback names the README's own line numbers.
    source = "\n" * (example.line - 1) + code
    exec(compile(source, str(example.readme), "exec"), {"__name__": "readme_example"})
