def test_a_failed_source_gives_its_own_reason_and_an_answered_or_skipped_one_none() -> None:
    from ibex_context.pipeline.report import Reason, SourceName, SourceStatus

    assert Reason.of_source(SourceName.COLD, SourceStatus.TIMEOUT) is Reason.COLD_TIMEOUT
    assert Reason.of_source(SourceName.LEXICAL, SourceStatus.ERROR) is Reason.LEXICAL_ERROR
    assert Reason.of_source(SourceName.HOT, SourceStatus.OK) is None
    assert Reason.of_source(SourceName.HOT, SourceStatus.SKIPPED) is None
    assert Reason.COLD_TIMEOUT.source is SourceName.COLD
    assert Reason.DEADLINE_EXCEEDED.source is None
    # Every source can fail both ways, each with a reason of its own.
    assert (
        len({Reason.of_source(s, k) for s in SourceName for k in (SourceStatus.TIMEOUT, SourceStatus.ERROR)})
        == 10
    )


def test_reasons_order_most_severe_first() -> None:
    from ibex_context.pipeline.report import Reason

    given = [Reason.LEXICAL_TIMEOUT, Reason.HOT_ERROR, Reason.DEADLINE_EXCEEDED, Reason.COLD_ERROR]
    assert Reason.ordered(given) == [
        Reason.DEADLINE_EXCEEDED,
        Reason.HOT_ERROR,
        Reason.COLD_ERROR,
        Reason.LEXICAL_TIMEOUT,
    ]
    # The values are what the wire and the metrics carry.
    assert Reason.DIRECTIVE_EXCEEDS_WINDOW == "directive_exceeds_window"
