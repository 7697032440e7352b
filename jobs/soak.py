"""`make soak`: the SIGKILL crash loop and the codec fuzz, with the figures for the README.

    python jobs/soak.py [--kills 200] [--seed N] [--fuzz 100000] [--output soak-output]

Prints the figures as a table on stdout and writes OUTPUT/latest.json. Progress goes to stderr.
Exit code 0 when nothing was lost, repeated or half applied and the fuzz found nothing; 1 when
a check failed (the message says which version, vbucket and keys); 2 on bad flags.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

try:
    import replicator  # noqa: F401
except ImportError:
    # Run from a source checkout without the package installed: the repo root holds it.
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from replicator.errors import ReplicatorError


def main(argv: Sequence[str] | None = None) -> int:
    """Run the soak with `argv` (default: the command line); returns the exit code."""
    from replicator.dcp.protocol.fuzz import fuzz_frames
    from replicator.runtime.spark import build_session
    from replicator.soak import CrashLoopSettings, run_crash_loop
    from replicator.soak.report import write_report

    parser = argparse.ArgumentParser(prog="soak.py", description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--kills", type=int, default=200, help="SIGKILLs of the replicator")
    parser.add_argument("--seed", type=int, default=0, help="seed of data, workload and kills")
    parser.add_argument("--fuzz", type=int, default=100_000, help="fuzzed codec inputs (0: none)")
    parser.add_argument("--output", default="soak-output", help="directory of latest.json")
    parser.add_argument("--work-dir", default=None, help="mirror and run logs (default: temp)")
    args = parser.parse_args(argv)
    if args.kills < 1 or args.fuzz < 0:
        parser.error("--kills must be at least 1 and --fuzz must not be negative")
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)

    def announce(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    try:
        # A long soak injects more faults: one failover per 40 kills, one purge per 80.
        settings = CrashLoopSettings(
            work_dir=Path("."), kills=args.kills, seed=args.seed,
            failovers=max(1, args.kills // 40),
            purges=min(max(1, args.kills // 80), args.kills - 1),
        )
    except ValueError as exc:
        parser.error(str(exc))
    work = Path(args.work_dir) if args.work_dir else Path(tempfile.mkdtemp(prefix="soak-"))
    settings = dataclasses.replace(settings, work_dir=work)
    started = time.monotonic()
    fuzz = fuzz_frames(args.fuzz, args.seed)
    announce(f"fuzz: {fuzz.inputs} inputs, {fuzz.frames} frames, {fuzz.decoded} decoded, "
             f"{fuzz.rejected} rejected with ProtocolError, nothing else raised")
    spark = build_session("replicator-soak")
    try:
        report = run_crash_loop(
            settings,
            spark,
            on_cycle=lambda cycle, phase: announce(
                f"kill {cycle + 1}/{args.kills} ({phase}) checked, "
                f"{time.monotonic() - started:.0f}s"
            ),
        )
    except ReplicatorError as exc:
        print(f"soak.py: FAILED: {exc}\n(work directory kept: {work})", file=sys.stderr)
        return 1
    finally:
        spark.stop()
    if not args.work_dir:
        shutil.rmtree(work, ignore_errors=True)
    print(report.render())
    print(f"{'codec fuzz inputs':<30}  {fuzz.inputs} ({fuzz.frames} frames), 0 stray exceptions")
    output = Path(args.output)
    output.mkdir(parents=True, exist_ok=True)
    write_report(
        report,
        {"codec_fuzz": {"inputs": fuzz.inputs, "frames": fuzz.frames, "decoded": fuzz.decoded,
                        "rejected": fuzz.rejected, "seed": args.seed}},
        str(output / "latest.json"),
    )
    print(f"\nwrote {output / 'latest.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
