"""How the CLI prints an assembly: a human-readable view, or JSON.

Both read the client's ``AssembleResult``; a client-side fallback shows as a
pass-through with the client's reason, as the proxy would see it.
"""

from __future__ import annotations

import json

from google.protobuf import json_format
from ibex_context_client import AssembleResult
from ibex_context_client.proto.ibex.context.v1 import context_pb2 as pb

from ibex_context.pipeline.outcome import Stage


def result_metadata(result: AssembleResult) -> pb.InjectionMetadata:
    """The service's metadata, or (on a client fallback) a pass-through naming the client's reason."""
    metadata = pb.InjectionMetadata()
    if result.metadata is not None:
        metadata.CopyFrom(result.metadata)
    if not result.from_service:
        metadata.fallback_reason = result.fallback_reason
        metadata.degradation_level = pb.DEGRADATION_LEVEL_PASS_THROUGH
    return metadata


def result_json(result: AssembleResult) -> str:
    """The result in AssembleContextResponse's JSON form (what ``assemble --json`` prints)."""
    messages = [{k: v for k, v in (("role", m.role), ("content", m.content)) if v} for m in result.messages]
    document: dict[str, object] = {"messages": messages}
    metadata = json_format.MessageToDict(result_metadata(result))
    if metadata:
        document["metadata"] = metadata
    return json.dumps(document, indent=2, ensure_ascii=False)


def render_result(result: AssembleResult) -> str:
    """A human-readable view of a result: messages, then what was injected and why."""
    lines = []
    for m in result.messages:
        lines.append(f"── {m.role} " + "─" * max(0, 60 - len(m.role)))
        lines.append(m.content)
    md = result_metadata(result)
    level = pb.DegradationLevel.Name(md.degradation_level).removeprefix("DEGRADATION_LEVEL_")
    lines.append("── metadata " + "─" * 52)
    lines.append(
        f"level={level} directive_injected={md.directive_injected} memories={md.memories_injected}/"
        f"{md.memories_available} tokens_injected={md.total_tokens_injected} "
        f"window_used={md.context_window_used}% "
        f"truncated={md.was_truncated} profile={md.profile}"
    )
    if md.fallback_reason:
        lines.append(f"fallback_reason={md.fallback_reason} reasons={list(md.degradation_reasons)}")
    t = md.tokens
    lines.append(
        f"encoding={t.encoding} exact={t.exact} budget={t.memory_budget} used={t.memory_tokens_used} "
        f"window={t.context_window} reserve={t.response_reserve} safety={t.safety_buffer}"
    )
    for mem in md.memories:
        lines.append(
            f"  #{mem.handle:<3} {mem.id} {mem.category:<10} score={mem.score:.3f} "
            f"rel={mem.relevance:.3f} (semantic={mem.semantic:.3f} lexical={mem.lexical:.3f}) "
            f"rec={mem.recency:.3f} use={mem.usefulness:.2f} conf={mem.confidence:.2f} "
            f"freq={mem.frequency:.2f} tokens={mem.tokens}"
        )
    tm = md.timings
    # Every stage on the wire, in the pipeline's order (the send is timed after the response).
    stages = " ".join(
        f"{stage.value}={getattr(tm, f'{stage.value}_us')}" for stage in Stage if stage is not Stage.SERIALIZE
    )
    lines.append(f"timings µs: total={tm.total_us} {stages}")
    return "\n".join(lines)
