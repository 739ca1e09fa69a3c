"""`ibex-context dev --once`: the README's first command, end to end in a subprocess —
embedded Redis and PostgreSQL, migrations, demo data through the write API, and a
paraphrased question that finds the right memory."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from ibex_context.demo import ACME_SUPPORT, GLOBEX_TUTOR


def test_dev_once_answers_the_paraphrased_demo_question_with_the_right_memory(tmp_path: Path) -> None:
    env = dict(os.environ, IBEX_GRPC_PORT="0", IBEX_METRICS_PORT="0", IBEX_LOG_FORMAT="text")
    env.pop("IBEX_EMBEDDER", None)
    result = subprocess.run(
        [sys.executable, "-m", "ibex_context", "dev", "--once", "--data-dir", str(tmp_path / "data")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    assert "embedder: minilm" in out
    system = out.split("── system", 1)[1].split("── user", 1)[0]
    assert "service dog, Miso" in system
    assert ACME_SUPPORT.directive in system
    assert "directive_injected=True" in out
    # The other tenant shares the agent id and nothing else.
    assert all(content not in out for _, content in GLOBEX_TUTOR.memories)
