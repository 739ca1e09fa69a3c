"""How long migration 0010 (the HNSW graphs rebuilt with m 32) takes on a copy of a data set.

    python -m benchmarks.migration_0010 loadtest/out/data/<a copy of a data set at 0008 or 0009>

As ``benchmarks.migration_0008``: starts that data set's PostgreSQL, applies the pending
migrations with the service's migrator (timed) and checks that every memory, posting and
count is still there. Point it at a copy: the data set is migrated in place.
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from benchmarks.migration_0008 import run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("data_dir", type=Path)
    args = parser.parse_args()
    report = asyncio.run(run(args.data_dir.resolve(), "0010", "migration_0010"))
    path = Path(__file__).parent / "results" / f"migration_0010-{args.data_dir.name.split('-')[0]}.md"
    path.write_text(report)
    print(report)
    print(f"written: {path}")


if __name__ == "__main__":
    main()
