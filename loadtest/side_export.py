"""An export running beside the load (``loadtest/run --export-during``): does
ExportMemories, rate-bounded by the service, starve the assembly path?

It runs ``ibex-context export`` once per org of the seeded data set (the whole
data set: 100 agents x 1k = 100k memories for the baseline), one after the
other, from the start of the measured window, on the load generator's CPU.
It records how many memories came out and how long that took.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path


def orgs_of(agents_file: Path) -> list[str]:
    agents = json.loads(agents_file.read_text())["agents"]
    return sorted({a["org_id"] for a in agents})


@dataclass
class SideExport:
    command: Sequence[str]  # ibex-context, possibly behind taskset
    target: str
    orgs: Sequence[str]
    out_dir: Path
    memories: int = 0
    seconds: float = 0.0
    errors: list[str] = field(default_factory=list)
    finished: bool = False
    _thread: threading.Thread | None = None
    _stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="side-export", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        started = time.monotonic()
        for org in self.orgs:
            if self._stop.is_set():
                break
            path = self.out_dir / f"export-{org}.jsonl"
            with path.open("wb") as out:
                done = subprocess.run(
                    [*self.command, "export", "--target", self.target, "--org", org],
                    stdout=out,
                    stderr=subprocess.PIPE,
                    check=False,
                    timeout=600,
                )
            if done.returncode != 0:
                self.errors.append(done.stderr.decode(errors="replace")[-300:])
                break
            with path.open("rb") as exported:
                self.memories += sum(1 for _ in exported)
            path.unlink()
        self.seconds = time.monotonic() - started
        self.finished = not self.errors and not self._stop.is_set()

    def join(self, timeout: float) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def summary(self) -> dict[str, object]:
        rate = self.memories / self.seconds if self.seconds else 0.0
        return {
            "memories": self.memories,
            "seconds": round(self.seconds, 1),
            "memories_per_second": round(rate, 1),
            "finished": self.finished,
            "errors": self.errors,
        }
