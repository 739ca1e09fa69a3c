import datetime

from google.protobuf import descriptor_pb2 as _descriptor_pb2
from google.protobuf import struct_pb2 as _struct_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Role(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ROLE_UNSPECIFIED: _ClassVar[Role]
    ROLE_ASSEMBLE: _ClassVar[Role]
    ROLE_WRITE: _ClassVar[Role]
    ROLE_READ: _ClassVar[Role]
    ROLE_ADMIN: _ClassVar[Role]

class DegradationLevel(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DEGRADATION_LEVEL_UNSPECIFIED: _ClassVar[DegradationLevel]
    DEGRADATION_LEVEL_FULL: _ClassVar[DegradationLevel]
    DEGRADATION_LEVEL_HOT_ONLY: _ClassVar[DegradationLevel]
    DEGRADATION_LEVEL_DIRECTIVE_ONLY: _ClassVar[DegradationLevel]
    DEGRADATION_LEVEL_PASS_THROUGH: _ClassVar[DegradationLevel]
    DEGRADATION_LEVEL_COLD_ONLY: _ClassVar[DegradationLevel]
    DEGRADATION_LEVEL_PARTIAL: _ClassVar[DegradationLevel]

class MemorySource(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MEMORY_SOURCE_UNSPECIFIED: _ClassVar[MemorySource]
    MEMORY_SOURCE_HOT: _ClassVar[MemorySource]
    MEMORY_SOURCE_COLD: _ClassVar[MemorySource]
    MEMORY_SOURCE_HOT_AND_COLD: _ClassVar[MemorySource]

class SourceStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SOURCE_STATUS_UNSPECIFIED: _ClassVar[SourceStatus]
    SOURCE_STATUS_OK: _ClassVar[SourceStatus]
    SOURCE_STATUS_TIMEOUT: _ClassVar[SourceStatus]
    SOURCE_STATUS_ERROR: _ClassVar[SourceStatus]
    SOURCE_STATUS_SKIPPED: _ClassVar[SourceStatus]

class UpsertOutcome(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    UPSERT_OUTCOME_UNSPECIFIED: _ClassVar[UpsertOutcome]
    UPSERT_OUTCOME_CREATED: _ClassVar[UpsertOutcome]
    UPSERT_OUTCOME_UPDATED: _ClassVar[UpsertOutcome]
    UPSERT_OUTCOME_UNCHANGED: _ClassVar[UpsertOutcome]

class Feedback(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FEEDBACK_UNSPECIFIED: _ClassVar[Feedback]
    FEEDBACK_POSITIVE: _ClassVar[Feedback]
    FEEDBACK_NEGATIVE: _ClassVar[Feedback]
    FEEDBACK_NEUTRAL: _ClassVar[Feedback]

class MemoryOrder(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MEMORY_ORDER_UNSPECIFIED: _ClassVar[MemoryOrder]
    MEMORY_ORDER_CREATED_DESC: _ClassVar[MemoryOrder]
    MEMORY_ORDER_CREATED_ASC: _ClassVar[MemoryOrder]
    MEMORY_ORDER_OCCURRED_DESC: _ClassVar[MemoryOrder]
    MEMORY_ORDER_OCCURRED_ASC: _ClassVar[MemoryOrder]
ROLE_UNSPECIFIED: Role
ROLE_ASSEMBLE: Role
ROLE_WRITE: Role
ROLE_READ: Role
ROLE_ADMIN: Role
DEGRADATION_LEVEL_UNSPECIFIED: DegradationLevel
DEGRADATION_LEVEL_FULL: DegradationLevel
DEGRADATION_LEVEL_HOT_ONLY: DegradationLevel
DEGRADATION_LEVEL_DIRECTIVE_ONLY: DegradationLevel
DEGRADATION_LEVEL_PASS_THROUGH: DegradationLevel
DEGRADATION_LEVEL_COLD_ONLY: DegradationLevel
DEGRADATION_LEVEL_PARTIAL: DegradationLevel
MEMORY_SOURCE_UNSPECIFIED: MemorySource
MEMORY_SOURCE_HOT: MemorySource
MEMORY_SOURCE_COLD: MemorySource
MEMORY_SOURCE_HOT_AND_COLD: MemorySource
SOURCE_STATUS_UNSPECIFIED: SourceStatus
SOURCE_STATUS_OK: SourceStatus
SOURCE_STATUS_TIMEOUT: SourceStatus
SOURCE_STATUS_ERROR: SourceStatus
SOURCE_STATUS_SKIPPED: SourceStatus
UPSERT_OUTCOME_UNSPECIFIED: UpsertOutcome
UPSERT_OUTCOME_CREATED: UpsertOutcome
UPSERT_OUTCOME_UPDATED: UpsertOutcome
UPSERT_OUTCOME_UNCHANGED: UpsertOutcome
FEEDBACK_UNSPECIFIED: Feedback
FEEDBACK_POSITIVE: Feedback
FEEDBACK_NEGATIVE: Feedback
FEEDBACK_NEUTRAL: Feedback
MEMORY_ORDER_UNSPECIFIED: MemoryOrder
MEMORY_ORDER_CREATED_DESC: MemoryOrder
MEMORY_ORDER_CREATED_ASC: MemoryOrder
MEMORY_ORDER_OCCURRED_DESC: MemoryOrder
MEMORY_ORDER_OCCURRED_ASC: MemoryOrder
REQUIRED_ROLE_FIELD_NUMBER: _ClassVar[int]
required_role: _descriptor.FieldDescriptor

class AssembleContextRequest(_message.Message):
    __slots__ = ("org_id", "agent_id", "session_id", "model", "request_id", "messages")
    ORG_ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    org_id: str
    agent_id: str
    session_id: str
    model: str
    request_id: str
    messages: _containers.RepeatedCompositeFieldContainer[Message]
    def __init__(self, org_id: _Optional[str] = ..., agent_id: _Optional[str] = ..., session_id: _Optional[str] = ..., model: _Optional[str] = ..., request_id: _Optional[str] = ..., messages: _Optional[_Iterable[_Union[Message, _Mapping]]] = ...) -> None: ...

class AssembleContextResponse(_message.Message):
    __slots__ = ("messages", "metadata")
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[Message]
    metadata: InjectionMetadata
    def __init__(self, messages: _Optional[_Iterable[_Union[Message, _Mapping]]] = ..., metadata: _Optional[_Union[InjectionMetadata, _Mapping]] = ...) -> None: ...

class Message(_message.Message):
    __slots__ = ("role", "content")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    role: str
    content: str
    def __init__(self, role: _Optional[str] = ..., content: _Optional[str] = ...) -> None: ...

class InjectionMetadata(_message.Message):
    __slots__ = ("directive_injected", "memories_injected", "memories_available", "total_tokens_injected", "context_window_used", "was_truncated", "fallback_reason", "memory_ids", "degradation_level", "timings", "memories", "tokens", "sources", "degradation_reasons", "profile", "request_id")
    DIRECTIVE_INJECTED_FIELD_NUMBER: _ClassVar[int]
    MEMORIES_INJECTED_FIELD_NUMBER: _ClassVar[int]
    MEMORIES_AVAILABLE_FIELD_NUMBER: _ClassVar[int]
    TOTAL_TOKENS_INJECTED_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_WINDOW_USED_FIELD_NUMBER: _ClassVar[int]
    WAS_TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    FALLBACK_REASON_FIELD_NUMBER: _ClassVar[int]
    MEMORY_IDS_FIELD_NUMBER: _ClassVar[int]
    DEGRADATION_LEVEL_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_FIELD_NUMBER: _ClassVar[int]
    MEMORIES_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    SOURCES_FIELD_NUMBER: _ClassVar[int]
    DEGRADATION_REASONS_FIELD_NUMBER: _ClassVar[int]
    PROFILE_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    directive_injected: bool
    memories_injected: int
    memories_available: int
    total_tokens_injected: int
    context_window_used: int
    was_truncated: bool
    fallback_reason: str
    memory_ids: _containers.RepeatedScalarFieldContainer[str]
    degradation_level: DegradationLevel
    timings: StageTimings
    memories: _containers.RepeatedCompositeFieldContainer[InjectedMemory]
    tokens: TokenAccounting
    sources: _containers.RepeatedCompositeFieldContainer[SourceOutcome]
    degradation_reasons: _containers.RepeatedScalarFieldContainer[str]
    profile: str
    request_id: str
    def __init__(self, directive_injected: _Optional[bool] = ..., memories_injected: _Optional[int] = ..., memories_available: _Optional[int] = ..., total_tokens_injected: _Optional[int] = ..., context_window_used: _Optional[int] = ..., was_truncated: _Optional[bool] = ..., fallback_reason: _Optional[str] = ..., memory_ids: _Optional[_Iterable[str]] = ..., degradation_level: _Optional[_Union[DegradationLevel, str]] = ..., timings: _Optional[_Union[StageTimings, _Mapping]] = ..., memories: _Optional[_Iterable[_Union[InjectedMemory, _Mapping]]] = ..., tokens: _Optional[_Union[TokenAccounting, _Mapping]] = ..., sources: _Optional[_Iterable[_Union[SourceOutcome, _Mapping]]] = ..., degradation_reasons: _Optional[_Iterable[str]] = ..., profile: _Optional[str] = ..., request_id: _Optional[str] = ...) -> None: ...

class StageTimings(_message.Message):
    __slots__ = ("budget_us", "directive_us", "hot_us", "embed_us", "cold_us", "score_us", "pack_us", "format_us", "total_us", "retrieval_us", "lexical_us")
    BUDGET_US_FIELD_NUMBER: _ClassVar[int]
    DIRECTIVE_US_FIELD_NUMBER: _ClassVar[int]
    HOT_US_FIELD_NUMBER: _ClassVar[int]
    EMBED_US_FIELD_NUMBER: _ClassVar[int]
    COLD_US_FIELD_NUMBER: _ClassVar[int]
    SCORE_US_FIELD_NUMBER: _ClassVar[int]
    PACK_US_FIELD_NUMBER: _ClassVar[int]
    FORMAT_US_FIELD_NUMBER: _ClassVar[int]
    TOTAL_US_FIELD_NUMBER: _ClassVar[int]
    RETRIEVAL_US_FIELD_NUMBER: _ClassVar[int]
    LEXICAL_US_FIELD_NUMBER: _ClassVar[int]
    budget_us: int
    directive_us: int
    hot_us: int
    embed_us: int
    cold_us: int
    score_us: int
    pack_us: int
    format_us: int
    total_us: int
    retrieval_us: int
    lexical_us: int
    def __init__(self, budget_us: _Optional[int] = ..., directive_us: _Optional[int] = ..., hot_us: _Optional[int] = ..., embed_us: _Optional[int] = ..., cold_us: _Optional[int] = ..., score_us: _Optional[int] = ..., pack_us: _Optional[int] = ..., format_us: _Optional[int] = ..., total_us: _Optional[int] = ..., retrieval_us: _Optional[int] = ..., lexical_us: _Optional[int] = ...) -> None: ...

class InjectedMemory(_message.Message):
    __slots__ = ("id", "category", "tokens", "score", "relevance", "recency", "usefulness", "confidence", "frequency", "source", "semantic", "lexical", "handle")
    ID_FIELD_NUMBER: _ClassVar[int]
    CATEGORY_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    RELEVANCE_FIELD_NUMBER: _ClassVar[int]
    RECENCY_FIELD_NUMBER: _ClassVar[int]
    USEFULNESS_FIELD_NUMBER: _ClassVar[int]
    CONFIDENCE_FIELD_NUMBER: _ClassVar[int]
    FREQUENCY_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    SEMANTIC_FIELD_NUMBER: _ClassVar[int]
    LEXICAL_FIELD_NUMBER: _ClassVar[int]
    HANDLE_FIELD_NUMBER: _ClassVar[int]
    id: str
    category: str
    tokens: int
    score: float
    relevance: float
    recency: float
    usefulness: float
    confidence: float
    frequency: float
    source: MemorySource
    semantic: float
    lexical: float
    handle: int
    def __init__(self, id: _Optional[str] = ..., category: _Optional[str] = ..., tokens: _Optional[int] = ..., score: _Optional[float] = ..., relevance: _Optional[float] = ..., recency: _Optional[float] = ..., usefulness: _Optional[float] = ..., confidence: _Optional[float] = ..., frequency: _Optional[float] = ..., source: _Optional[_Union[MemorySource, str]] = ..., semantic: _Optional[float] = ..., lexical: _Optional[float] = ..., handle: _Optional[int] = ...) -> None: ...

class TokenAccounting(_message.Message):
    __slots__ = ("encoding", "exact", "context_window", "messages_tokens", "directive_tokens", "response_reserve", "safety_buffer", "memory_budget", "memory_tokens_used", "constrained", "approximation_reason")
    ENCODING_FIELD_NUMBER: _ClassVar[int]
    EXACT_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_WINDOW_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_TOKENS_FIELD_NUMBER: _ClassVar[int]
    DIRECTIVE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_RESERVE_FIELD_NUMBER: _ClassVar[int]
    SAFETY_BUFFER_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BUDGET_FIELD_NUMBER: _ClassVar[int]
    MEMORY_TOKENS_USED_FIELD_NUMBER: _ClassVar[int]
    CONSTRAINED_FIELD_NUMBER: _ClassVar[int]
    APPROXIMATION_REASON_FIELD_NUMBER: _ClassVar[int]
    encoding: str
    exact: bool
    context_window: int
    messages_tokens: int
    directive_tokens: int
    response_reserve: int
    safety_buffer: int
    memory_budget: int
    memory_tokens_used: int
    constrained: bool
    approximation_reason: str
    def __init__(self, encoding: _Optional[str] = ..., exact: _Optional[bool] = ..., context_window: _Optional[int] = ..., messages_tokens: _Optional[int] = ..., directive_tokens: _Optional[int] = ..., response_reserve: _Optional[int] = ..., safety_buffer: _Optional[int] = ..., memory_budget: _Optional[int] = ..., memory_tokens_used: _Optional[int] = ..., constrained: _Optional[bool] = ..., approximation_reason: _Optional[str] = ...) -> None: ...

class SourceOutcome(_message.Message):
    __slots__ = ("source", "status", "duration_us", "count", "detail")
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    DURATION_US_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    source: str
    status: SourceStatus
    duration_us: int
    count: int
    detail: str
    def __init__(self, source: _Optional[str] = ..., status: _Optional[_Union[SourceStatus, str]] = ..., duration_us: _Optional[int] = ..., count: _Optional[int] = ..., detail: _Optional[str] = ...) -> None: ...

class MemoryInput(_message.Message):
    __slots__ = ("id", "content", "category", "confidence", "usefulness", "metadata", "embedding", "occurred_at")
    ID_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    CATEGORY_FIELD_NUMBER: _ClassVar[int]
    CONFIDENCE_FIELD_NUMBER: _ClassVar[int]
    USEFULNESS_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    EMBEDDING_FIELD_NUMBER: _ClassVar[int]
    OCCURRED_AT_FIELD_NUMBER: _ClassVar[int]
    id: str
    content: str
    category: str
    confidence: float
    usefulness: float
    metadata: _struct_pb2.Struct
    embedding: _containers.RepeatedScalarFieldContainer[float]
    occurred_at: _timestamp_pb2.Timestamp
    def __init__(self, id: _Optional[str] = ..., content: _Optional[str] = ..., category: _Optional[str] = ..., confidence: _Optional[float] = ..., usefulness: _Optional[float] = ..., metadata: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., embedding: _Optional[_Iterable[float]] = ..., occurred_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class UpsertMemoriesRequest(_message.Message):
    __slots__ = ("org_id", "agent_id", "memories")
    ORG_ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    MEMORIES_FIELD_NUMBER: _ClassVar[int]
    org_id: str
    agent_id: str
    memories: _containers.RepeatedCompositeFieldContainer[MemoryInput]
    def __init__(self, org_id: _Optional[str] = ..., agent_id: _Optional[str] = ..., memories: _Optional[_Iterable[_Union[MemoryInput, _Mapping]]] = ...) -> None: ...

class UpsertResult(_message.Message):
    __slots__ = ("id", "outcome")
    ID_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    id: str
    outcome: UpsertOutcome
    def __init__(self, id: _Optional[str] = ..., outcome: _Optional[_Union[UpsertOutcome, str]] = ...) -> None: ...

class UpsertMemoriesResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[UpsertResult]
    def __init__(self, results: _Optional[_Iterable[_Union[UpsertResult, _Mapping]]] = ...) -> None: ...

class DeleteMemoriesRequest(_message.Message):
    __slots__ = ("org_id", "agent_id", "ids")
    ORG_ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    IDS_FIELD_NUMBER: _ClassVar[int]
    org_id: str
    agent_id: str
    ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, org_id: _Optional[str] = ..., agent_id: _Optional[str] = ..., ids: _Optional[_Iterable[str]] = ...) -> None: ...

class DeleteMemoriesResponse(_message.Message):
    __slots__ = ("deleted",)
    DELETED_FIELD_NUMBER: _ClassVar[int]
    deleted: int
    def __init__(self, deleted: _Optional[int] = ...) -> None: ...

class SetDirectiveRequest(_message.Message):
    __slots__ = ("org_id", "agent_id", "content")
    ORG_ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    org_id: str
    agent_id: str
    content: str
    def __init__(self, org_id: _Optional[str] = ..., agent_id: _Optional[str] = ..., content: _Optional[str] = ...) -> None: ...

class SetDirectiveResponse(_message.Message):
    __slots__ = ("version",)
    VERSION_FIELD_NUMBER: _ClassVar[int]
    version: int
    def __init__(self, version: _Optional[int] = ...) -> None: ...

class ClearDirectiveRequest(_message.Message):
    __slots__ = ("org_id", "agent_id")
    ORG_ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    org_id: str
    agent_id: str
    def __init__(self, org_id: _Optional[str] = ..., agent_id: _Optional[str] = ...) -> None: ...

class ClearDirectiveResponse(_message.Message):
    __slots__ = ("cleared",)
    CLEARED_FIELD_NUMBER: _ClassVar[int]
    cleared: bool
    def __init__(self, cleared: _Optional[bool] = ...) -> None: ...

class MemoryFeedback(_message.Message):
    __slots__ = ("memory_id", "feedback")
    MEMORY_ID_FIELD_NUMBER: _ClassVar[int]
    FEEDBACK_FIELD_NUMBER: _ClassVar[int]
    memory_id: str
    feedback: Feedback
    def __init__(self, memory_id: _Optional[str] = ..., feedback: _Optional[_Union[Feedback, str]] = ...) -> None: ...

class RecordFeedbackRequest(_message.Message):
    __slots__ = ("org_id", "agent_id", "session_id", "feedback")
    ORG_ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    FEEDBACK_FIELD_NUMBER: _ClassVar[int]
    org_id: str
    agent_id: str
    session_id: str
    feedback: _containers.RepeatedCompositeFieldContainer[MemoryFeedback]
    def __init__(self, org_id: _Optional[str] = ..., agent_id: _Optional[str] = ..., session_id: _Optional[str] = ..., feedback: _Optional[_Iterable[_Union[MemoryFeedback, _Mapping]]] = ...) -> None: ...

class MemoryScoreUpdate(_message.Message):
    __slots__ = ("memory_id", "previous_usefulness", "new_usefulness")
    MEMORY_ID_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_USEFULNESS_FIELD_NUMBER: _ClassVar[int]
    NEW_USEFULNESS_FIELD_NUMBER: _ClassVar[int]
    memory_id: str
    previous_usefulness: float
    new_usefulness: float
    def __init__(self, memory_id: _Optional[str] = ..., previous_usefulness: _Optional[float] = ..., new_usefulness: _Optional[float] = ...) -> None: ...

class RecordFeedbackResponse(_message.Message):
    __slots__ = ("updates",)
    UPDATES_FIELD_NUMBER: _ClassVar[int]
    updates: _containers.RepeatedCompositeFieldContainer[MemoryScoreUpdate]
    def __init__(self, updates: _Optional[_Iterable[_Union[MemoryScoreUpdate, _Mapping]]] = ...) -> None: ...

class StoredMemory(_message.Message):
    __slots__ = ("id", "content", "category", "confidence", "usefulness", "metadata", "occurred_at", "created_at", "updated_at", "retrieval_count", "last_injected_at", "embedding", "agent_id")
    ID_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    CATEGORY_FIELD_NUMBER: _ClassVar[int]
    CONFIDENCE_FIELD_NUMBER: _ClassVar[int]
    USEFULNESS_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    OCCURRED_AT_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_FIELD_NUMBER: _ClassVar[int]
    RETRIEVAL_COUNT_FIELD_NUMBER: _ClassVar[int]
    LAST_INJECTED_AT_FIELD_NUMBER: _ClassVar[int]
    EMBEDDING_FIELD_NUMBER: _ClassVar[int]
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    content: str
    category: str
    confidence: float
    usefulness: float
    metadata: _struct_pb2.Struct
    occurred_at: _timestamp_pb2.Timestamp
    created_at: _timestamp_pb2.Timestamp
    updated_at: _timestamp_pb2.Timestamp
    retrieval_count: int
    last_injected_at: _timestamp_pb2.Timestamp
    embedding: _containers.RepeatedScalarFieldContainer[float]
    agent_id: str
    def __init__(self, id: _Optional[str] = ..., content: _Optional[str] = ..., category: _Optional[str] = ..., confidence: _Optional[float] = ..., usefulness: _Optional[float] = ..., metadata: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., occurred_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., updated_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., retrieval_count: _Optional[int] = ..., last_injected_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., embedding: _Optional[_Iterable[float]] = ..., agent_id: _Optional[str] = ...) -> None: ...

class GetMemoriesRequest(_message.Message):
    __slots__ = ("org_id", "agent_id", "ids", "include_embedding")
    ORG_ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    IDS_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_EMBEDDING_FIELD_NUMBER: _ClassVar[int]
    org_id: str
    agent_id: str
    ids: _containers.RepeatedScalarFieldContainer[str]
    include_embedding: bool
    def __init__(self, org_id: _Optional[str] = ..., agent_id: _Optional[str] = ..., ids: _Optional[_Iterable[str]] = ..., include_embedding: _Optional[bool] = ...) -> None: ...

class GetMemoriesResponse(_message.Message):
    __slots__ = ("memories",)
    MEMORIES_FIELD_NUMBER: _ClassVar[int]
    memories: _containers.RepeatedCompositeFieldContainer[StoredMemory]
    def __init__(self, memories: _Optional[_Iterable[_Union[StoredMemory, _Mapping]]] = ...) -> None: ...

class ListMemoriesRequest(_message.Message):
    __slots__ = ("org_id", "agent_id", "page_size", "page_token", "categories", "created_after", "created_before", "occurred_after", "occurred_before", "order", "include_embedding")
    ORG_ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    CATEGORIES_FIELD_NUMBER: _ClassVar[int]
    CREATED_AFTER_FIELD_NUMBER: _ClassVar[int]
    CREATED_BEFORE_FIELD_NUMBER: _ClassVar[int]
    OCCURRED_AFTER_FIELD_NUMBER: _ClassVar[int]
    OCCURRED_BEFORE_FIELD_NUMBER: _ClassVar[int]
    ORDER_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_EMBEDDING_FIELD_NUMBER: _ClassVar[int]
    org_id: str
    agent_id: str
    page_size: int
    page_token: str
    categories: _containers.RepeatedScalarFieldContainer[str]
    created_after: _timestamp_pb2.Timestamp
    created_before: _timestamp_pb2.Timestamp
    occurred_after: _timestamp_pb2.Timestamp
    occurred_before: _timestamp_pb2.Timestamp
    order: MemoryOrder
    include_embedding: bool
    def __init__(self, org_id: _Optional[str] = ..., agent_id: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., categories: _Optional[_Iterable[str]] = ..., created_after: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., created_before: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., occurred_after: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., occurred_before: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., order: _Optional[_Union[MemoryOrder, str]] = ..., include_embedding: _Optional[bool] = ...) -> None: ...

class ListMemoriesResponse(_message.Message):
    __slots__ = ("memories", "next_page_token")
    MEMORIES_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    memories: _containers.RepeatedCompositeFieldContainer[StoredMemory]
    next_page_token: str
    def __init__(self, memories: _Optional[_Iterable[_Union[StoredMemory, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class SearchMemoriesRequest(_message.Message):
    __slots__ = ("org_id", "agent_id", "query", "query_embedding", "top_k")
    ORG_ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    QUERY_FIELD_NUMBER: _ClassVar[int]
    QUERY_EMBEDDING_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    org_id: str
    agent_id: str
    query: str
    query_embedding: _containers.RepeatedScalarFieldContainer[float]
    top_k: int
    def __init__(self, org_id: _Optional[str] = ..., agent_id: _Optional[str] = ..., query: _Optional[str] = ..., query_embedding: _Optional[_Iterable[float]] = ..., top_k: _Optional[int] = ...) -> None: ...

class SearchHit(_message.Message):
    __slots__ = ("memory", "similarity", "lexical_score", "relevance")
    MEMORY_FIELD_NUMBER: _ClassVar[int]
    SIMILARITY_FIELD_NUMBER: _ClassVar[int]
    LEXICAL_SCORE_FIELD_NUMBER: _ClassVar[int]
    RELEVANCE_FIELD_NUMBER: _ClassVar[int]
    memory: StoredMemory
    similarity: float
    lexical_score: float
    relevance: float
    def __init__(self, memory: _Optional[_Union[StoredMemory, _Mapping]] = ..., similarity: _Optional[float] = ..., lexical_score: _Optional[float] = ..., relevance: _Optional[float] = ...) -> None: ...

class SearchMemoriesResponse(_message.Message):
    __slots__ = ("hits",)
    HITS_FIELD_NUMBER: _ClassVar[int]
    hits: _containers.RepeatedCompositeFieldContainer[SearchHit]
    def __init__(self, hits: _Optional[_Iterable[_Union[SearchHit, _Mapping]]] = ...) -> None: ...

class GetDirectiveRequest(_message.Message):
    __slots__ = ("org_id", "agent_id")
    ORG_ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    org_id: str
    agent_id: str
    def __init__(self, org_id: _Optional[str] = ..., agent_id: _Optional[str] = ...) -> None: ...

class GetDirectiveResponse(_message.Message):
    __slots__ = ("exists", "content", "version", "updated_at")
    EXISTS_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_FIELD_NUMBER: _ClassVar[int]
    exists: bool
    content: str
    version: int
    updated_at: _timestamp_pb2.Timestamp
    def __init__(self, exists: _Optional[bool] = ..., content: _Optional[str] = ..., version: _Optional[int] = ..., updated_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class ExportMemoriesRequest(_message.Message):
    __slots__ = ("org_id", "agent_id", "page_size", "page_token", "include_embedding")
    ORG_ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_EMBEDDING_FIELD_NUMBER: _ClassVar[int]
    org_id: str
    agent_id: str
    page_size: int
    page_token: str
    include_embedding: bool
    def __init__(self, org_id: _Optional[str] = ..., agent_id: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., include_embedding: _Optional[bool] = ...) -> None: ...

class ExportMemoriesResponse(_message.Message):
    __slots__ = ("memories", "next_page_token")
    MEMORIES_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    memories: _containers.RepeatedCompositeFieldContainer[StoredMemory]
    next_page_token: str
    def __init__(self, memories: _Optional[_Iterable[_Union[StoredMemory, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class PurgeAgentRequest(_message.Message):
    __slots__ = ("org_id", "agent_id")
    ORG_ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    org_id: str
    agent_id: str
    def __init__(self, org_id: _Optional[str] = ..., agent_id: _Optional[str] = ...) -> None: ...

class PurgeOrgRequest(_message.Message):
    __slots__ = ("org_id",)
    ORG_ID_FIELD_NUMBER: _ClassVar[int]
    org_id: str
    def __init__(self, org_id: _Optional[str] = ...) -> None: ...

class PurgeAgentResponse(_message.Message):
    __slots__ = ("memories_deleted", "directives_deleted", "agents_purged", "cache_keys_deleted", "complete")
    MEMORIES_DELETED_FIELD_NUMBER: _ClassVar[int]
    DIRECTIVES_DELETED_FIELD_NUMBER: _ClassVar[int]
    AGENTS_PURGED_FIELD_NUMBER: _ClassVar[int]
    CACHE_KEYS_DELETED_FIELD_NUMBER: _ClassVar[int]
    COMPLETE_FIELD_NUMBER: _ClassVar[int]
    memories_deleted: int
    directives_deleted: int
    agents_purged: int
    cache_keys_deleted: int
    complete: bool
    def __init__(self, memories_deleted: _Optional[int] = ..., directives_deleted: _Optional[int] = ..., agents_purged: _Optional[int] = ..., cache_keys_deleted: _Optional[int] = ..., complete: _Optional[bool] = ...) -> None: ...

class PurgeOrgResponse(_message.Message):
    __slots__ = ("memories_deleted", "directives_deleted", "agents_purged", "cache_keys_deleted", "complete")
    MEMORIES_DELETED_FIELD_NUMBER: _ClassVar[int]
    DIRECTIVES_DELETED_FIELD_NUMBER: _ClassVar[int]
    AGENTS_PURGED_FIELD_NUMBER: _ClassVar[int]
    CACHE_KEYS_DELETED_FIELD_NUMBER: _ClassVar[int]
    COMPLETE_FIELD_NUMBER: _ClassVar[int]
    memories_deleted: int
    directives_deleted: int
    agents_purged: int
    cache_keys_deleted: int
    complete: bool
    def __init__(self, memories_deleted: _Optional[int] = ..., directives_deleted: _Optional[int] = ..., agents_purged: _Optional[int] = ..., cache_keys_deleted: _Optional[int] = ..., complete: _Optional[bool] = ...) -> None: ...
