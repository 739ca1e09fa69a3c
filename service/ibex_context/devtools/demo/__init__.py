"""Demo data for ``ibex-context dev``: two tenants whose agents share nothing."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class DemoAgent:
    label: str
    org_id: str
    agent_id: str
    directive: str
    memories: tuple[tuple[str, str], ...]  # (category, content)


ACME_SUPPORT = DemoAgent(
    label="Acme Travel / support agent",
    org_id="0b6f7a4e-8f1c-4b53-9a51-5b1a3c7c2d01",
    agent_id="5d2e9c1a-3b4f-4e6a-8c7d-9f0a1b2c3d11",
    directive=(
        "You are Acme Travel's support assistant. Be concise and friendly. "
        "Never promise refunds; offer to open a ticket instead."
    ),
    memories=(
        ("preference", "The customer prefers aisle seats on every flight longer than two hours."),
        ("factual", "The customer's name is Priya Raman and she is a Gold tier member since 2021."),
        ("factual", "Priya's home airport is Lisbon (LIS); she usually flies to Berlin for work."),
        ("preference", "Priya is vegetarian and always asks for a vegetarian meal on long-haul flights."),
        ("procedural", "To change a booking: look up the PNR, check the fare rules, then quote the fee."),
        (
            "episodic",
            "On 3 March Priya's bag was delayed in Frankfurt for two days; it was delivered to her hotel.",
        ),
        ("behavioral", "Priya gets frustrated by long answers; keep replies under five sentences."),
        ("factual", "Priya travels with her service dog, Miso, a small labrador mix."),
        ("procedural", "Pets in cabin need a carrier under 8 kg and must be booked 48 hours in advance."),
        ("episodic", "Last week Priya asked about upgrading her Berlin flight with miles but did not book."),
    ),
)

GLOBEX_TUTOR = DemoAgent(
    label="Globex Learning / maths tutor",
    org_id="7c1d2e3f-4a5b-4c6d-8e9f-0a1b2c3d4e02",
    agent_id="5d2e9c1a-3b4f-4e6a-8c7d-9f0a1b2c3d11",  # the same agent id in another org: must stay separate
    directive="You are a patient maths tutor for secondary-school students. Use step-by-step explanations.",
    memories=(
        ("factual", "The student, Tomás, is in year 10 and preparing for his GCSE exams in June."),
        ("preference", "Tomás learns best from worked examples followed by one practice problem."),
        (
            "episodic",
            "In the last session Tomás struggled with factorising quadratics with a leading coefficient.",
        ),
        ("procedural", "When Tomás gets stuck, ask him to explain the first step in his own words."),
        ("behavioral", "Tomás loses focus after about twenty minutes; suggest a short break."),
        ("factual", "Tomás's favourite subject is physics; relate maths to motion when possible."),
    ),
)

AGENTS: tuple[DemoAgent, ...] = (ACME_SUPPORT, GLOBEX_TUTOR)

# Paraphrased: shares almost no words with the memory it should find (the dog).
DEMO_QUESTION = "Can my furry companion come on board with me to Berlin next month?"
