"""The load-test runner's command line and the machine figures it reports."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml
from ibex_context.settings import Settings

from loadtest.generator import locust_command
from loadtest.machine import stolen_seconds
from loadtest.measure import RunResult
from loadtest.options import MINILM_SEED_MAX, SCENARIOS, dataset_key, parse_args
from loadtest.server import secure_settings, server_environment


def test_the_stores_share_the_load_generators_cpus_unless_told_otherwise() -> None:
    assert parse_args(["--scenario", "baseline"]).stores_cpus == "1"
    assert parse_args(["--locust-cpus", "0", "--server-cpus", "1"]).stores_cpus == "0"
    assert parse_args(["--stores-cpus", "any"]).stores_cpus is None
    assert parse_args(["--stores-cpus", "0,1"]).stores_cpus == "0,1"


def test_a_scenario_fills_what_the_command_line_leaves_out() -> None:
    args = parse_args(["--scenario", "baseline", "--rps", "50"])
    assert args.rps == 50
    assert (args.agents, args.memories) == (SCENARIOS["baseline"].agents, SCENARIOS["baseline"].memories)
    assert args.label == "baseline"


def test_stolen_cpu_time_is_read_per_cpu() -> None:
    stolen = stolen_seconds()
    assert "0" in stolen and len(stolen) <= (os.cpu_count() or 1)
    assert all(seconds >= 0 for seconds in stolen.values())


def test_the_real_embedder_is_the_default_and_small_data_is_seeded_with_it() -> None:
    args = parse_args(["--scenario", "smoke"])  # 5 x 200 memories
    assert (args.embedder, args.seed_embedder) == ("minilm", "minilm")
    assert "the service's embedder" in args.seed_embedder_why
    toy = parse_args(["--scenario", "baseline", "--embedder", "hashing"])
    assert (toy.embedder, toy.seed_embedder) == ("hashing", "hashing")


def test_large_data_gets_vectors_drawn_like_minilms_unless_asked_otherwise_and_the_report_says_why() -> None:
    args = parse_args(["--scenario", "baseline"])  # 100 x 1,000 memories
    assert args.agents * args.memories > MINILM_SEED_MAX
    assert (args.embedder, args.seed_embedder, args.vectors) == ("minilm", "minilm", "shaped")
    assert "drawn from the model of minilm's vectors" in args.seed_embedder_why
    forced = parse_args(["--scenario", "baseline", "--seed-embedder", "minilm"])
    assert (forced.seed_embedder, forced.vectors) == ("minilm", "embedder")
    toy = parse_args(["--scenario", "baseline", "--embedder", "hashing"])
    assert (toy.seed_embedder, toy.vectors) == ("hashing", "embedder")
    random_vectors = parse_args(["--scenario", "large-agent"])
    assert random_vectors.vectors == "random"


def test_drawn_vectors_are_a_data_set_of_their_own() -> None:
    assert dataset_key(parse_args(["--scenario", "baseline"])) != dataset_key(
        parse_args(["--scenario", "baseline", "--seed-embedder", "minilm"])
    )


def test_the_data_seeded_for_one_embedder_is_not_reused_for_another() -> None:
    assert dataset_key(parse_args(["--scenario", "smoke"])) != dataset_key(
        parse_args(["--scenario", "smoke", "--embedder", "hashing"])
    )


def test_the_agent_loop_scenario_sends_agent_loops_on_the_baselines_data() -> None:
    args = parse_args(["--scenario", "agent-loop"])
    assert args.scenario_weights == "agent_loop=1"
    assert dataset_key(args) == dataset_key(parse_args(["--scenario", "baseline"]))
    assert parse_args(
        ["--scenario", "agent-loop", "--scenario-weights", "new_session=1"]
    ).scenario_weights == ("new_session=1")
    assert parse_args(["--scenario", "baseline"]).scenario_weights == ""


def test_the_help_text_labels_the_hashing_embedder_a_toy(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_args(["--help"])
    assert "TOY for isolating costs" in " ".join(capsys.readouterr().out.split())


def test_the_cache_hit_rate_counts_lookups_served_without_an_embedding_of_their_own() -> None:
    result = RunResult(
        summary={}, locust_rc=0, stages={}, assembly={}, fallbacks_server={}, degradation_server={},
        server_cpu_s=1.0, server_runqueue_wait_s=0.0, stores_cpu_s=1.0, pg_activity=[],
        load_average=(0.0, 0.0), locust_cpu_s=0.0, wall_s=1.0, seed_output="", setup={},
        embedding_cache={"hit": 70.0, "shared": 10.0, "miss": 20.0},
    )  # fmt: skip
    assert result.embedding_cache_hit_rate == pytest.approx(0.8)
    result.embedding_cache = {}
    assert result.embedding_cache_hit_rate is None


def test_the_noisy_neighbour_scenario_runs_two_orgs_with_their_own_tokens_and_gates_the_quiet_one(
    tmp_path: Path,
) -> None:
    args = parse_args(["--scenario", "noisy-neighbour", "--quiet-rps", "5"])
    assert args.secure and args.tenants
    assert (args.rps, args.p99_ms, args.max_fallback_rate) == (150, 45.0, 0.01)
    assert dataset_key(args) == dataset_key(parse_args(["--scenario", "baseline"]))
    args.tenant_orgs = {"noisy": "org-a", "quiet": "org-b"}
    env, secrets = secure_settings(tmp_path / "secure", args.tenant_orgs)
    credentials = yaml.safe_load(Path(env["IBEX_AUTH_CREDENTIALS_FILE"]).read_text())
    bound = {p["name"]: p.get("org_id") for p in credentials["principals"]}
    assert bound == {"loadtest": None, "loadtest-noisy": "org-a", "loadtest-quiet": "org-b"}

    load = locust_command(args, 50051, tmp_path / "agents.json", tmp_path / "run", secrets)

    assert load.argv[-2:] == ["NoisyTenant", "QuietTenant"] and load.users == 16
    tenants = json.loads(Path(load.argv[load.argv.index("--tenants-file") + 1]).read_text())
    assert tenants["noisy"]["users"] == 15 and tenants["noisy"]["rps_per_user"] == 10
    assert tenants["quiet"] == {
        "users": 1,
        "rps_per_user": 5.0,
        "gated": True,
        "org_id": "org-b",
        "token_file": str(secrets.tenant_tokens["quiet"]),
    }
    assert not tenants["noisy"]["gated"]


def test_a_rate_limit_for_the_flooding_org_needs_the_two_org_scenario() -> None:
    with pytest.raises(SystemExit):
        parse_args(["--scenario", "baseline", "--noisy-rate-limit", "30"])


def _chart_config() -> dict[str, object]:
    values = yaml.safe_load((Path(__file__).parents[2] / "charts/ibex-context/values.yaml").read_text())
    config: dict[str, object] = values["config"]
    return config


def test_a_server_with_its_cpus_to_itself_runs_its_inference_as_the_chart_deploys_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("IBEX_EMBEDDING_WORKER_NICE", raising=False)
    args = parse_args(["--scenario", "baseline"])  # server on CPU 0, stores and locust on CPU 1
    assert args.worker_nice == _chart_config()["embeddingWorkerNice"]
    assert "chart" in args.worker_nice_why


@pytest.mark.parametrize(
    "cpus",
    [
        ["--server-cpus", "0,1"],
        ["--server-cpus", "0-1", "--locust-cpus", "1"],
        ["--stores-cpus", "any"],
        ["--server-cpus", ""],
        ["--locust-cpus", "0", "--stores-cpus", "1"],
    ],
)
def test_a_server_sharing_cpus_with_the_stores_or_locust_runs_its_inference_at_the_services_default(
    cpus: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A niced worker would yield to PostgreSQL and locust too, which no pod's does.
    monkeypatch.delenv("IBEX_EMBEDDING_WORKER_NICE", raising=False)
    args = parse_args(["--scenario", "baseline", *cpus])
    default = Settings.model_fields["embedding_worker_nice"].default
    assert (args.worker_nice, "shares CPUs" in args.worker_nice_why) == (default, True)


def test_the_inference_priority_asked_for_wins_over_the_chart(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("IBEX_EMBEDDING_WORKER_NICE", "3")
    assert parse_args(["--scenario", "baseline"]).worker_nice == 3
    assert parse_args(["--scenario", "baseline", "--worker-nice", "0"]).worker_nice == 0
    assert parse_args(["--scenario", "baseline", "--server-cpus", "0,1"]).worker_nice == 3


def test_the_server_is_started_with_the_runs_inference_priority() -> None:
    args = parse_args(["--scenario", "baseline", "--worker-nice", "7"])
    env = server_environment(args, "postgresql://x", "redis://x", 50051, 9464)
    assert env["IBEX_EMBEDDING_WORKER_NICE"] == "7"
