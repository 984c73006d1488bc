import datetime

from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Outcome(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OUTCOME_UNSPECIFIED: _ClassVar[Outcome]
    OUTCOME_SUCCESS: _ClassVar[Outcome]
    OUTCOME_TRANSIENT: _ClassVar[Outcome]
    OUTCOME_RATE_LIMITED: _ClassVar[Outcome]
    OUTCOME_SOURCE_DEAD: _ClassVar[Outcome]
    OUTCOME_CLIENT_ERROR: _ClassVar[Outcome]
    OUTCOME_CANCELLED: _ClassVar[Outcome]

class Reason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    REASON_UNSPECIFIED: _ClassVar[Reason]
    REASON_COOLDOWN: _ClassVar[Reason]
    REASON_CIRCUIT_OPEN: _ClassVar[Reason]
    REASON_PROBE_IN_FLIGHT: _ClassVar[Reason]
    REASON_FORCED_OPEN: _ClassVar[Reason]
    REASON_ADAPTIVE_PACED: _ClassVar[Reason]
    REASON_RATE_LIMITED: _ClassVar[Reason]
    REASON_QUEUED: _ClassVar[Reason]
    REASON_TENANT_LIMIT: _ClassVar[Reason]
    REASON_TENANT_BUDGET: _ClassVar[Reason]

class ScopeMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SCOPE_MODE_UNSPECIFIED: _ClassVar[ScopeMode]
    SCOPE_MODE_ENFORCE: _ClassVar[ScopeMode]
    SCOPE_MODE_SHADOW: _ClassVar[ScopeMode]

class FailureReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FAILURE_REASON_UNSPECIFIED: _ClassVar[FailureReason]
    FAILURE_REASON_CIRCUIT_OPEN: _ClassVar[FailureReason]
    FAILURE_REASON_QUOTA_EXHAUSTED: _ClassVar[FailureReason]
    FAILURE_REASON_STALLED: _ClassVar[FailureReason]
    FAILURE_REASON_RETRY_EXHAUSTED: _ClassVar[FailureReason]
    FAILURE_REASON_NON_RETRYABLE: _ClassVar[FailureReason]
    FAILURE_REASON_DEADLINE_EXCEEDED: _ClassVar[FailureReason]
    FAILURE_REASON_CANCELLED: _ClassVar[FailureReason]
    FAILURE_REASON_RETRY_AFTER_TOO_LONG: _ClassVar[FailureReason]
    FAILURE_REASON_SOURCE_DEAD: _ClassVar[FailureReason]
    FAILURE_REASON_SCOPE_REMOVED: _ClassVar[FailureReason]
    FAILURE_REASON_BUDGET_EXHAUSTED: _ClassVar[FailureReason]

class BreakerState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    BREAKER_STATE_UNSPECIFIED: _ClassVar[BreakerState]
    BREAKER_STATE_CLOSED: _ClassVar[BreakerState]
    BREAKER_STATE_OPEN: _ClassVar[BreakerState]
    BREAKER_STATE_HALF_OPEN: _ClassVar[BreakerState]

class OpenCause(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OPEN_CAUSE_UNSPECIFIED: _ClassVar[OpenCause]
    OPEN_CAUSE_FAILURES: _ClassVar[OpenCause]
    OPEN_CAUSE_SOURCE_DEAD: _ClassVar[OpenCause]
    OPEN_CAUSE_FORCED: _ClassVar[OpenCause]

class Override(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OVERRIDE_UNSPECIFIED: _ClassVar[Override]
    OVERRIDE_FORCED_OPEN: _ClassVar[Override]
    OVERRIDE_FORCED_CLOSED: _ClassVar[Override]
    OVERRIDE_DISABLED: _ClassVar[Override]

class OverrideAction(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OVERRIDE_ACTION_UNSPECIFIED: _ClassVar[OverrideAction]
    OVERRIDE_ACTION_FORCE_OPEN: _ClassVar[OverrideAction]
    OVERRIDE_ACTION_FORCE_CLOSED: _ClassVar[OverrideAction]
    OVERRIDE_ACTION_DISABLE: _ClassVar[OverrideAction]
    OVERRIDE_ACTION_CLEAR: _ClassVar[OverrideAction]
    OVERRIDE_ACTION_RESET: _ClassVar[OverrideAction]

class OutcomeEffect(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OUTCOME_EFFECT_UNSPECIFIED: _ClassVar[OutcomeEffect]
    OUTCOME_EFFECT_APPLIED: _ClassVar[OutcomeEffect]
    OUTCOME_EFFECT_NO_VERDICT: _ClassVar[OutcomeEffect]
    OUTCOME_EFFECT_STALE: _ClassVar[OutcomeEffect]
    OUTCOME_EFFECT_IGNORED: _ClassVar[OutcomeEffect]

class OnRefusal(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ON_REFUSAL_UNSPECIFIED: _ClassVar[OnRefusal]
    ON_REFUSAL_FAIL_FAST: _ClassVar[OnRefusal]
    ON_REFUSAL_WAIT: _ClassVar[OnRefusal]

class ErrorReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ERROR_REASON_UNSPECIFIED: _ClassVar[ErrorReason]
    ERROR_REASON_INVALID_FIELD: _ClassVar[ErrorReason]
    ERROR_REASON_UNKNOWN_SCOPE: _ClassVar[ErrorReason]
    ERROR_REASON_UNKNOWN_CALL: _ClassVar[ErrorReason]
    ERROR_REASON_UNKNOWN_SOURCE: _ClassVar[ErrorReason]
    ERROR_REASON_CALL_ENDED: _ClassVar[ErrorReason]
    ERROR_REASON_PERMIT_OUTSTANDING: _ClassVar[ErrorReason]
    ERROR_REASON_PERMIT_NOT_OF_CALL: _ClassVar[ErrorReason]
    ERROR_REASON_NO_REFUSAL: _ClassVar[ErrorReason]
    ERROR_REASON_ESTIMATE_TOO_LARGE: _ClassVar[ErrorReason]
    ERROR_REASON_TOO_MANY_CALLS: _ClassVar[ErrorReason]
    ERROR_REASON_BACKEND_UNAVAILABLE: _ClassVar[ErrorReason]
    ERROR_REASON_UNAUTHENTICATED: _ClassVar[ErrorReason]
    ERROR_REASON_INTERNAL: _ClassVar[ErrorReason]
    ERROR_REASON_PERMISSION_DENIED: _ClassVar[ErrorReason]
    ERROR_REASON_TOO_MANY_WATCHERS: _ClassVar[ErrorReason]
    ERROR_REASON_TENANT_MISMATCH: _ClassVar[ErrorReason]
    ERROR_REASON_TENANT_TOO_MANY_CALLS: _ClassVar[ErrorReason]

class TransitionCause(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TRANSITION_CAUSE_UNSPECIFIED: _ClassVar[TransitionCause]
    TRANSITION_CAUSE_CONSECUTIVE_FAILURES: _ClassVar[TransitionCause]
    TRANSITION_CAUSE_FAILURE_RATE: _ClassVar[TransitionCause]
    TRANSITION_CAUSE_SOURCE_DEAD: _ClassVar[TransitionCause]
    TRANSITION_CAUSE_COOLDOWN_ELAPSED: _ClassVar[TransitionCause]
    TRANSITION_CAUSE_PROBE_SUCCEEDED: _ClassVar[TransitionCause]
    TRANSITION_CAUSE_PROBE_FAILED: _ClassVar[TransitionCause]
    TRANSITION_CAUSE_RESET: _ClassVar[TransitionCause]

class ProbeEventKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PROBE_EVENT_KIND_UNSPECIFIED: _ClassVar[ProbeEventKind]
    PROBE_EVENT_KIND_LEASED: _ClassVar[ProbeEventKind]
    PROBE_EVENT_KIND_SETTLED: _ClassVar[ProbeEventKind]
    PROBE_EVENT_KIND_EXPIRED: _ClassVar[ProbeEventKind]
    PROBE_EVENT_KIND_RELEASED: _ClassVar[ProbeEventKind]
OUTCOME_UNSPECIFIED: Outcome
OUTCOME_SUCCESS: Outcome
OUTCOME_TRANSIENT: Outcome
OUTCOME_RATE_LIMITED: Outcome
OUTCOME_SOURCE_DEAD: Outcome
OUTCOME_CLIENT_ERROR: Outcome
OUTCOME_CANCELLED: Outcome
REASON_UNSPECIFIED: Reason
REASON_COOLDOWN: Reason
REASON_CIRCUIT_OPEN: Reason
REASON_PROBE_IN_FLIGHT: Reason
REASON_FORCED_OPEN: Reason
REASON_ADAPTIVE_PACED: Reason
REASON_RATE_LIMITED: Reason
REASON_QUEUED: Reason
REASON_TENANT_LIMIT: Reason
REASON_TENANT_BUDGET: Reason
SCOPE_MODE_UNSPECIFIED: ScopeMode
SCOPE_MODE_ENFORCE: ScopeMode
SCOPE_MODE_SHADOW: ScopeMode
FAILURE_REASON_UNSPECIFIED: FailureReason
FAILURE_REASON_CIRCUIT_OPEN: FailureReason
FAILURE_REASON_QUOTA_EXHAUSTED: FailureReason
FAILURE_REASON_STALLED: FailureReason
FAILURE_REASON_RETRY_EXHAUSTED: FailureReason
FAILURE_REASON_NON_RETRYABLE: FailureReason
FAILURE_REASON_DEADLINE_EXCEEDED: FailureReason
FAILURE_REASON_CANCELLED: FailureReason
FAILURE_REASON_RETRY_AFTER_TOO_LONG: FailureReason
FAILURE_REASON_SOURCE_DEAD: FailureReason
FAILURE_REASON_SCOPE_REMOVED: FailureReason
FAILURE_REASON_BUDGET_EXHAUSTED: FailureReason
BREAKER_STATE_UNSPECIFIED: BreakerState
BREAKER_STATE_CLOSED: BreakerState
BREAKER_STATE_OPEN: BreakerState
BREAKER_STATE_HALF_OPEN: BreakerState
OPEN_CAUSE_UNSPECIFIED: OpenCause
OPEN_CAUSE_FAILURES: OpenCause
OPEN_CAUSE_SOURCE_DEAD: OpenCause
OPEN_CAUSE_FORCED: OpenCause
OVERRIDE_UNSPECIFIED: Override
OVERRIDE_FORCED_OPEN: Override
OVERRIDE_FORCED_CLOSED: Override
OVERRIDE_DISABLED: Override
OVERRIDE_ACTION_UNSPECIFIED: OverrideAction
OVERRIDE_ACTION_FORCE_OPEN: OverrideAction
OVERRIDE_ACTION_FORCE_CLOSED: OverrideAction
OVERRIDE_ACTION_DISABLE: OverrideAction
OVERRIDE_ACTION_CLEAR: OverrideAction
OVERRIDE_ACTION_RESET: OverrideAction
OUTCOME_EFFECT_UNSPECIFIED: OutcomeEffect
OUTCOME_EFFECT_APPLIED: OutcomeEffect
OUTCOME_EFFECT_NO_VERDICT: OutcomeEffect
OUTCOME_EFFECT_STALE: OutcomeEffect
OUTCOME_EFFECT_IGNORED: OutcomeEffect
ON_REFUSAL_UNSPECIFIED: OnRefusal
ON_REFUSAL_FAIL_FAST: OnRefusal
ON_REFUSAL_WAIT: OnRefusal
ERROR_REASON_UNSPECIFIED: ErrorReason
ERROR_REASON_INVALID_FIELD: ErrorReason
ERROR_REASON_UNKNOWN_SCOPE: ErrorReason
ERROR_REASON_UNKNOWN_CALL: ErrorReason
ERROR_REASON_UNKNOWN_SOURCE: ErrorReason
ERROR_REASON_CALL_ENDED: ErrorReason
ERROR_REASON_PERMIT_OUTSTANDING: ErrorReason
ERROR_REASON_PERMIT_NOT_OF_CALL: ErrorReason
ERROR_REASON_NO_REFUSAL: ErrorReason
ERROR_REASON_ESTIMATE_TOO_LARGE: ErrorReason
ERROR_REASON_TOO_MANY_CALLS: ErrorReason
ERROR_REASON_BACKEND_UNAVAILABLE: ErrorReason
ERROR_REASON_UNAUTHENTICATED: ErrorReason
ERROR_REASON_INTERNAL: ErrorReason
ERROR_REASON_PERMISSION_DENIED: ErrorReason
ERROR_REASON_TOO_MANY_WATCHERS: ErrorReason
ERROR_REASON_TENANT_MISMATCH: ErrorReason
ERROR_REASON_TENANT_TOO_MANY_CALLS: ErrorReason
TRANSITION_CAUSE_UNSPECIFIED: TransitionCause
TRANSITION_CAUSE_CONSECUTIVE_FAILURES: TransitionCause
TRANSITION_CAUSE_FAILURE_RATE: TransitionCause
TRANSITION_CAUSE_SOURCE_DEAD: TransitionCause
TRANSITION_CAUSE_COOLDOWN_ELAPSED: TransitionCause
TRANSITION_CAUSE_PROBE_SUCCEEDED: TransitionCause
TRANSITION_CAUSE_PROBE_FAILED: TransitionCause
TRANSITION_CAUSE_RESET: TransitionCause
PROBE_EVENT_KIND_UNSPECIFIED: ProbeEventKind
PROBE_EVENT_KIND_LEASED: ProbeEventKind
PROBE_EVENT_KIND_SETTLED: ProbeEventKind
PROBE_EVENT_KIND_EXPIRED: ProbeEventKind
PROBE_EVENT_KIND_RELEASED: ProbeEventKind

class SourceReason(_message.Message):
    __slots__ = ("source", "reason", "retry_after")
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    RETRY_AFTER_FIELD_NUMBER: _ClassVar[int]
    source: str
    reason: Reason
    retry_after: _duration_pb2.Duration
    def __init__(self, source: _Optional[str] = ..., reason: _Optional[_Union[Reason, str]] = ..., retry_after: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class PickRequest(_message.Message):
    __slots__ = ("scope", "call_id", "estimated_tokens", "deadline", "priority", "tenant")
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    ESTIMATED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    scope: str
    call_id: str
    estimated_tokens: int
    deadline: _duration_pb2.Duration
    priority: int
    tenant: str
    def __init__(self, scope: _Optional[str] = ..., call_id: _Optional[str] = ..., estimated_tokens: _Optional[int] = ..., deadline: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., priority: _Optional[int] = ..., tenant: _Optional[str] = ...) -> None: ...

class PickResponse(_message.Message):
    __slots__ = ("call_id", "grant", "no_runnable", "failure")
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    GRANT_FIELD_NUMBER: _ClassVar[int]
    NO_RUNNABLE_FIELD_NUMBER: _ClassVar[int]
    FAILURE_FIELD_NUMBER: _ClassVar[int]
    call_id: str
    grant: Grant
    no_runnable: NoRunnable
    failure: Failure
    def __init__(self, call_id: _Optional[str] = ..., grant: _Optional[_Union[Grant, _Mapping]] = ..., no_runnable: _Optional[_Union[NoRunnable, _Mapping]] = ..., failure: _Optional[_Union[Failure, _Mapping]] = ...) -> None: ...

class Grant(_message.Message):
    __slots__ = ("source", "attributes", "permit_id", "lease", "timeout", "probe", "epoch", "attempt", "skipped", "shadow", "shadow_refusals", "shadow_error")
    class AttributesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    ATTRIBUTES_FIELD_NUMBER: _ClassVar[int]
    PERMIT_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    PROBE_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    SKIPPED_FIELD_NUMBER: _ClassVar[int]
    SHADOW_FIELD_NUMBER: _ClassVar[int]
    SHADOW_REFUSALS_FIELD_NUMBER: _ClassVar[int]
    SHADOW_ERROR_FIELD_NUMBER: _ClassVar[int]
    source: str
    attributes: _containers.ScalarMap[str, str]
    permit_id: str
    lease: _duration_pb2.Duration
    timeout: _duration_pb2.Duration
    probe: bool
    epoch: int
    attempt: int
    skipped: _containers.RepeatedCompositeFieldContainer[SourceReason]
    shadow: bool
    shadow_refusals: _containers.RepeatedCompositeFieldContainer[SourceReason]
    shadow_error: ErrorReason
    def __init__(self, source: _Optional[str] = ..., attributes: _Optional[_Mapping[str, str]] = ..., permit_id: _Optional[str] = ..., lease: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., timeout: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., probe: _Optional[bool] = ..., epoch: _Optional[int] = ..., attempt: _Optional[int] = ..., skipped: _Optional[_Iterable[_Union[SourceReason, _Mapping]]] = ..., shadow: _Optional[bool] = ..., shadow_refusals: _Optional[_Iterable[_Union[SourceReason, _Mapping]]] = ..., shadow_error: _Optional[_Union[ErrorReason, str]] = ...) -> None: ...

class NoRunnable(_message.Message):
    __slots__ = ("gate_rejections", "per_source_reasons")
    GATE_REJECTIONS_FIELD_NUMBER: _ClassVar[int]
    PER_SOURCE_REASONS_FIELD_NUMBER: _ClassVar[int]
    gate_rejections: int
    per_source_reasons: _containers.RepeatedCompositeFieldContainer[SourceReason]
    def __init__(self, gate_rejections: _Optional[int] = ..., per_source_reasons: _Optional[_Iterable[_Union[SourceReason, _Mapping]]] = ...) -> None: ...

class Failure(_message.Message):
    __slots__ = ("reason", "retry_after", "per_source_reasons")
    REASON_FIELD_NUMBER: _ClassVar[int]
    RETRY_AFTER_FIELD_NUMBER: _ClassVar[int]
    PER_SOURCE_REASONS_FIELD_NUMBER: _ClassVar[int]
    reason: FailureReason
    retry_after: _duration_pb2.Duration
    per_source_reasons: _containers.RepeatedCompositeFieldContainer[SourceReason]
    def __init__(self, reason: _Optional[_Union[FailureReason, str]] = ..., retry_after: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., per_source_reasons: _Optional[_Iterable[_Union[SourceReason, _Mapping]]] = ...) -> None: ...

class OnNoRunnableRequest(_message.Message):
    __slots__ = ("scope", "call_id")
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    scope: str
    call_id: str
    def __init__(self, scope: _Optional[str] = ..., call_id: _Optional[str] = ...) -> None: ...

class OnNoRunnableResponse(_message.Message):
    __slots__ = ("wait", "failure")
    WAIT_FIELD_NUMBER: _ClassVar[int]
    FAILURE_FIELD_NUMBER: _ClassVar[int]
    wait: Wait
    failure: Failure
    def __init__(self, wait: _Optional[_Union[Wait, _Mapping]] = ..., failure: _Optional[_Union[Failure, _Mapping]] = ...) -> None: ...

class Wait(_message.Message):
    __slots__ = ("sleep", "slept", "woken")
    SLEEP_FIELD_NUMBER: _ClassVar[int]
    SLEPT_FIELD_NUMBER: _ClassVar[int]
    WOKEN_FIELD_NUMBER: _ClassVar[int]
    sleep: _duration_pb2.Duration
    slept: _duration_pb2.Duration
    woken: bool
    def __init__(self, sleep: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., slept: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., woken: _Optional[bool] = ...) -> None: ...

class RecordOutcomeRequest(_message.Message):
    __slots__ = ("scope", "call_id", "permit_id", "outcome", "retry_after_hint", "actual_tokens", "http_status", "detail")
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    PERMIT_ID_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    RETRY_AFTER_HINT_FIELD_NUMBER: _ClassVar[int]
    ACTUAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    HTTP_STATUS_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    scope: str
    call_id: str
    permit_id: str
    outcome: Outcome
    retry_after_hint: _duration_pb2.Duration
    actual_tokens: int
    http_status: int
    detail: str
    def __init__(self, scope: _Optional[str] = ..., call_id: _Optional[str] = ..., permit_id: _Optional[str] = ..., outcome: _Optional[_Union[Outcome, str]] = ..., retry_after_hint: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., actual_tokens: _Optional[int] = ..., http_status: _Optional[int] = ..., detail: _Optional[str] = ...) -> None: ...

class RecordOutcomeResponse(_message.Message):
    __slots__ = ("done", "retry", "failure", "effect", "breaker_state")
    DONE_FIELD_NUMBER: _ClassVar[int]
    RETRY_FIELD_NUMBER: _ClassVar[int]
    FAILURE_FIELD_NUMBER: _ClassVar[int]
    EFFECT_FIELD_NUMBER: _ClassVar[int]
    BREAKER_STATE_FIELD_NUMBER: _ClassVar[int]
    done: Done
    retry: Retry
    failure: Failure
    effect: OutcomeEffect
    breaker_state: BreakerState
    def __init__(self, done: _Optional[_Union[Done, _Mapping]] = ..., retry: _Optional[_Union[Retry, _Mapping]] = ..., failure: _Optional[_Union[Failure, _Mapping]] = ..., effect: _Optional[_Union[OutcomeEffect, str]] = ..., breaker_state: _Optional[_Union[BreakerState, str]] = ...) -> None: ...

class Done(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Retry(_message.Message):
    __slots__ = ("backoff",)
    BACKOFF_FIELD_NUMBER: _ClassVar[int]
    backoff: _duration_pb2.Duration
    def __init__(self, backoff: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class CancelCallRequest(_message.Message):
    __slots__ = ("scope", "call_id")
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    scope: str
    call_id: str
    def __init__(self, scope: _Optional[str] = ..., call_id: _Optional[str] = ...) -> None: ...

class CancelCallResponse(_message.Message):
    __slots__ = ("ended_now",)
    ENDED_NOW_FIELD_NUMBER: _ClassVar[int]
    ended_now: bool
    def __init__(self, ended_now: _Optional[bool] = ...) -> None: ...

class RetryAfterRequest(_message.Message):
    __slots__ = ("scope", "sources")
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    SOURCES_FIELD_NUMBER: _ClassVar[int]
    scope: str
    sources: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, scope: _Optional[str] = ..., sources: _Optional[_Iterable[str]] = ...) -> None: ...

class RetryAfterResponse(_message.Message):
    __slots__ = ("retry_after", "sources")
    RETRY_AFTER_FIELD_NUMBER: _ClassVar[int]
    SOURCES_FIELD_NUMBER: _ClassVar[int]
    retry_after: _duration_pb2.Duration
    sources: _containers.RepeatedCompositeFieldContainer[SourceState]
    def __init__(self, retry_after: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., sources: _Optional[_Iterable[_Union[SourceState, _Mapping]]] = ...) -> None: ...

class DescribeScopeRequest(_message.Message):
    __slots__ = ("scope",)
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    scope: str
    def __init__(self, scope: _Optional[str] = ...) -> None: ...

class DescribeScopeResponse(_message.Message):
    __slots__ = ("scope",)
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    scope: ScopeDescription
    def __init__(self, scope: _Optional[_Union[ScopeDescription, _Mapping]] = ...) -> None: ...

class ListScopesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListScopesResponse(_message.Message):
    __slots__ = ("scopes",)
    SCOPES_FIELD_NUMBER: _ClassVar[int]
    scopes: _containers.RepeatedCompositeFieldContainer[ScopeDescription]
    def __init__(self, scopes: _Optional[_Iterable[_Union[ScopeDescription, _Mapping]]] = ...) -> None: ...

class OverrideBreakerRequest(_message.Message):
    __slots__ = ("scope", "source", "action", "actor", "reason")
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    scope: str
    source: str
    action: OverrideAction
    actor: str
    reason: str
    def __init__(self, scope: _Optional[str] = ..., source: _Optional[str] = ..., action: _Optional[_Union[OverrideAction, str]] = ..., actor: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class OverrideBreakerResponse(_message.Message):
    __slots__ = ("source",)
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    source: SourceState
    def __init__(self, source: _Optional[_Union[SourceState, _Mapping]] = ...) -> None: ...

class ScopeDescription(_message.Message):
    __slots__ = ("config", "sources", "progress_age", "live_calls", "backend", "state_loss", "tenants")
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    SOURCES_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_AGE_FIELD_NUMBER: _ClassVar[int]
    LIVE_CALLS_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    STATE_LOSS_FIELD_NUMBER: _ClassVar[int]
    TENANTS_FIELD_NUMBER: _ClassVar[int]
    config: ScopeConfig
    sources: _containers.RepeatedCompositeFieldContainer[SourceState]
    progress_age: _duration_pb2.Duration
    live_calls: int
    backend: str
    state_loss: StateLoss
    tenants: _containers.RepeatedCompositeFieldContainer[TenantState]
    def __init__(self, config: _Optional[_Union[ScopeConfig, _Mapping]] = ..., sources: _Optional[_Iterable[_Union[SourceState, _Mapping]]] = ..., progress_age: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., live_calls: _Optional[int] = ..., backend: _Optional[str] = ..., state_loss: _Optional[_Union[StateLoss, _Mapping]] = ..., tenants: _Optional[_Iterable[_Union[TenantState, _Mapping]]] = ...) -> None: ...

class TenantState(_message.Message):
    __slots__ = ("name", "config", "in_flight", "requests_last_minute", "tokens_last_minute", "budget_used", "live_calls", "reason", "retry_after")
    NAME_FIELD_NUMBER: _ClassVar[int]
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_LAST_MINUTE_FIELD_NUMBER: _ClassVar[int]
    TOKENS_LAST_MINUTE_FIELD_NUMBER: _ClassVar[int]
    BUDGET_USED_FIELD_NUMBER: _ClassVar[int]
    LIVE_CALLS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    RETRY_AFTER_FIELD_NUMBER: _ClassVar[int]
    name: str
    config: TenantConfig
    in_flight: int
    requests_last_minute: int
    tokens_last_minute: int
    budget_used: int
    live_calls: int
    reason: Reason
    retry_after: _duration_pb2.Duration
    def __init__(self, name: _Optional[str] = ..., config: _Optional[_Union[TenantConfig, _Mapping]] = ..., in_flight: _Optional[int] = ..., requests_last_minute: _Optional[int] = ..., tokens_last_minute: _Optional[int] = ..., budget_used: _Optional[int] = ..., live_calls: _Optional[int] = ..., reason: _Optional[_Union[Reason, str]] = ..., retry_after: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class TenantConfig(_message.Message):
    __slots__ = ("weight", "max_priority", "rpm", "tpm", "max_concurrency", "max_live_calls", "budget_tokens", "budget_per")
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    MAX_PRIORITY_FIELD_NUMBER: _ClassVar[int]
    RPM_FIELD_NUMBER: _ClassVar[int]
    TPM_FIELD_NUMBER: _ClassVar[int]
    MAX_CONCURRENCY_FIELD_NUMBER: _ClassVar[int]
    MAX_LIVE_CALLS_FIELD_NUMBER: _ClassVar[int]
    BUDGET_TOKENS_FIELD_NUMBER: _ClassVar[int]
    BUDGET_PER_FIELD_NUMBER: _ClassVar[int]
    weight: int
    max_priority: int
    rpm: int
    tpm: int
    max_concurrency: int
    max_live_calls: int
    budget_tokens: int
    budget_per: _duration_pb2.Duration
    def __init__(self, weight: _Optional[int] = ..., max_priority: _Optional[int] = ..., rpm: _Optional[int] = ..., tpm: _Optional[int] = ..., max_concurrency: _Optional[int] = ..., max_live_calls: _Optional[int] = ..., budget_tokens: _Optional[int] = ..., budget_per: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class StateLoss(_message.Message):
    __slots__ = ("count", "last", "restored", "reassert_pending")
    COUNT_FIELD_NUMBER: _ClassVar[int]
    LAST_FIELD_NUMBER: _ClassVar[int]
    RESTORED_FIELD_NUMBER: _ClassVar[int]
    REASSERT_PENDING_FIELD_NUMBER: _ClassVar[int]
    count: int
    last: _timestamp_pb2.Timestamp
    restored: int
    reassert_pending: bool
    def __init__(self, count: _Optional[int] = ..., last: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., restored: _Optional[int] = ..., reassert_pending: _Optional[bool] = ...) -> None: ...

class SourceState(_message.Message):
    __slots__ = ("name", "state", "reason", "retry_after", "epoch", "reopens", "probe_out", "probe_left", "window_calls", "window_failures", "consecutive_failures", "override", "override_actor", "override_reason", "in_flight", "requests_last_minute", "tokens_last_minute", "pacer_ceiling", "cooldown_memo", "failed_recently", "config", "open_cause", "line")
    NAME_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    RETRY_AFTER_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    REOPENS_FIELD_NUMBER: _ClassVar[int]
    PROBE_OUT_FIELD_NUMBER: _ClassVar[int]
    PROBE_LEFT_FIELD_NUMBER: _ClassVar[int]
    WINDOW_CALLS_FIELD_NUMBER: _ClassVar[int]
    WINDOW_FAILURES_FIELD_NUMBER: _ClassVar[int]
    CONSECUTIVE_FAILURES_FIELD_NUMBER: _ClassVar[int]
    OVERRIDE_FIELD_NUMBER: _ClassVar[int]
    OVERRIDE_ACTOR_FIELD_NUMBER: _ClassVar[int]
    OVERRIDE_REASON_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_LAST_MINUTE_FIELD_NUMBER: _ClassVar[int]
    TOKENS_LAST_MINUTE_FIELD_NUMBER: _ClassVar[int]
    PACER_CEILING_FIELD_NUMBER: _ClassVar[int]
    COOLDOWN_MEMO_FIELD_NUMBER: _ClassVar[int]
    FAILED_RECENTLY_FIELD_NUMBER: _ClassVar[int]
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    OPEN_CAUSE_FIELD_NUMBER: _ClassVar[int]
    LINE_FIELD_NUMBER: _ClassVar[int]
    name: str
    state: BreakerState
    reason: Reason
    retry_after: _duration_pb2.Duration
    epoch: int
    reopens: int
    probe_out: bool
    probe_left: _duration_pb2.Duration
    window_calls: int
    window_failures: int
    consecutive_failures: int
    override: Override
    override_actor: str
    override_reason: str
    in_flight: int
    requests_last_minute: int
    tokens_last_minute: int
    pacer_ceiling: int
    cooldown_memo: _duration_pb2.Duration
    failed_recently: bool
    config: SourceConfig
    open_cause: OpenCause
    line: SourceLine
    def __init__(self, name: _Optional[str] = ..., state: _Optional[_Union[BreakerState, str]] = ..., reason: _Optional[_Union[Reason, str]] = ..., retry_after: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., epoch: _Optional[int] = ..., reopens: _Optional[int] = ..., probe_out: _Optional[bool] = ..., probe_left: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., window_calls: _Optional[int] = ..., window_failures: _Optional[int] = ..., consecutive_failures: _Optional[int] = ..., override: _Optional[_Union[Override, str]] = ..., override_actor: _Optional[str] = ..., override_reason: _Optional[str] = ..., in_flight: _Optional[int] = ..., requests_last_minute: _Optional[int] = ..., tokens_last_minute: _Optional[int] = ..., pacer_ceiling: _Optional[int] = ..., cooldown_memo: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., failed_recently: _Optional[bool] = ..., config: _Optional[_Union[SourceConfig, _Mapping]] = ..., open_cause: _Optional[_Union[OpenCause, str]] = ..., line: _Optional[_Union[SourceLine, _Mapping]] = ...) -> None: ...

class SourceLine(_message.Message):
    __slots__ = ("length", "oldest_wait", "groups")
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    OLDEST_WAIT_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    length: int
    oldest_wait: _duration_pb2.Duration
    groups: _containers.RepeatedCompositeFieldContainer[LineGroup]
    def __init__(self, length: _Optional[int] = ..., oldest_wait: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., groups: _Optional[_Iterable[_Union[LineGroup, _Mapping]]] = ...) -> None: ...

class LineGroup(_message.Message):
    __slots__ = ("priority", "tenant", "waiting")
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    WAITING_FIELD_NUMBER: _ClassVar[int]
    priority: int
    tenant: str
    waiting: int
    def __init__(self, priority: _Optional[int] = ..., tenant: _Optional[str] = ..., waiting: _Optional[int] = ...) -> None: ...

class ScopeConfig(_message.Message):
    __slots__ = ("name", "circuit_open", "quota_full", "max_attempts", "backoff_base", "backoff_max", "stall_window", "poll_interval", "lease_grace", "max_retry_after", "source_dead", "mode", "tenants", "default_tenant_weight", "max_tenants", "priority_aging")
    class TenantsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    CIRCUIT_OPEN_FIELD_NUMBER: _ClassVar[int]
    QUOTA_FULL_FIELD_NUMBER: _ClassVar[int]
    MAX_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    BACKOFF_BASE_FIELD_NUMBER: _ClassVar[int]
    BACKOFF_MAX_FIELD_NUMBER: _ClassVar[int]
    STALL_WINDOW_FIELD_NUMBER: _ClassVar[int]
    POLL_INTERVAL_FIELD_NUMBER: _ClassVar[int]
    LEASE_GRACE_FIELD_NUMBER: _ClassVar[int]
    MAX_RETRY_AFTER_FIELD_NUMBER: _ClassVar[int]
    SOURCE_DEAD_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    TENANTS_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_TENANT_WEIGHT_FIELD_NUMBER: _ClassVar[int]
    MAX_TENANTS_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_AGING_FIELD_NUMBER: _ClassVar[int]
    name: str
    circuit_open: OnRefusal
    quota_full: OnRefusal
    max_attempts: int
    backoff_base: _duration_pb2.Duration
    backoff_max: _duration_pb2.Duration
    stall_window: _duration_pb2.Duration
    poll_interval: _duration_pb2.Duration
    lease_grace: _duration_pb2.Duration
    max_retry_after: _duration_pb2.Duration
    source_dead: OnRefusal
    mode: ScopeMode
    tenants: _containers.ScalarMap[str, int]
    default_tenant_weight: int
    max_tenants: int
    priority_aging: _duration_pb2.Duration
    def __init__(self, name: _Optional[str] = ..., circuit_open: _Optional[_Union[OnRefusal, str]] = ..., quota_full: _Optional[_Union[OnRefusal, str]] = ..., max_attempts: _Optional[int] = ..., backoff_base: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., backoff_max: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., stall_window: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., poll_interval: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., lease_grace: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., max_retry_after: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., source_dead: _Optional[_Union[OnRefusal, str]] = ..., mode: _Optional[_Union[ScopeMode, str]] = ..., tenants: _Optional[_Mapping[str, int]] = ..., default_tenant_weight: _Optional[int] = ..., max_tenants: _Optional[int] = ..., priority_aging: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class SourceConfig(_message.Message):
    __slots__ = ("priority", "weight", "max_concurrency", "rpm", "tpm", "timeout", "lease", "attributes", "breaker")
    class AttributesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    MAX_CONCURRENCY_FIELD_NUMBER: _ClassVar[int]
    RPM_FIELD_NUMBER: _ClassVar[int]
    TPM_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    LEASE_FIELD_NUMBER: _ClassVar[int]
    ATTRIBUTES_FIELD_NUMBER: _ClassVar[int]
    BREAKER_FIELD_NUMBER: _ClassVar[int]
    priority: int
    weight: int
    max_concurrency: int
    rpm: int
    tpm: int
    timeout: _duration_pb2.Duration
    lease: _duration_pb2.Duration
    attributes: _containers.ScalarMap[str, str]
    breaker: BreakerConfig
    def __init__(self, priority: _Optional[int] = ..., weight: _Optional[int] = ..., max_concurrency: _Optional[int] = ..., rpm: _Optional[int] = ..., tpm: _Optional[int] = ..., timeout: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., lease: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., attributes: _Optional[_Mapping[str, str]] = ..., breaker: _Optional[_Union[BreakerConfig, _Mapping]] = ...) -> None: ...

class BreakerConfig(_message.Message):
    __slots__ = ("fail_threshold", "min_calls", "fail_rate", "window", "cooldown", "max_cooldown", "probe_ttl", "probe_ttl_derived")
    FAIL_THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    MIN_CALLS_FIELD_NUMBER: _ClassVar[int]
    FAIL_RATE_FIELD_NUMBER: _ClassVar[int]
    WINDOW_FIELD_NUMBER: _ClassVar[int]
    COOLDOWN_FIELD_NUMBER: _ClassVar[int]
    MAX_COOLDOWN_FIELD_NUMBER: _ClassVar[int]
    PROBE_TTL_FIELD_NUMBER: _ClassVar[int]
    PROBE_TTL_DERIVED_FIELD_NUMBER: _ClassVar[int]
    fail_threshold: int
    min_calls: int
    fail_rate: float
    window: _duration_pb2.Duration
    cooldown: _duration_pb2.Duration
    max_cooldown: _duration_pb2.Duration
    probe_ttl: _duration_pb2.Duration
    probe_ttl_derived: bool
    def __init__(self, fail_threshold: _Optional[int] = ..., min_calls: _Optional[int] = ..., fail_rate: _Optional[float] = ..., window: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., cooldown: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., max_cooldown: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., probe_ttl: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., probe_ttl_derived: _Optional[bool] = ...) -> None: ...

class WatchEventsRequest(_message.Message):
    __slots__ = ("scope",)
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    scope: str
    def __init__(self, scope: _Optional[str] = ...) -> None: ...

class WatchEventsResponse(_message.Message):
    __slots__ = ("sequence", "time", "scope", "dropped", "breaker_transition", "probe", "stale_outcome", "override_changed", "wait_started", "backend_health")
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    DROPPED_FIELD_NUMBER: _ClassVar[int]
    BREAKER_TRANSITION_FIELD_NUMBER: _ClassVar[int]
    PROBE_FIELD_NUMBER: _ClassVar[int]
    STALE_OUTCOME_FIELD_NUMBER: _ClassVar[int]
    OVERRIDE_CHANGED_FIELD_NUMBER: _ClassVar[int]
    WAIT_STARTED_FIELD_NUMBER: _ClassVar[int]
    BACKEND_HEALTH_FIELD_NUMBER: _ClassVar[int]
    sequence: int
    time: _timestamp_pb2.Timestamp
    scope: str
    dropped: int
    breaker_transition: BreakerTransition
    probe: ProbeEvent
    stale_outcome: StaleOutcome
    override_changed: OverrideChanged
    wait_started: WaitStarted
    backend_health: BackendHealth
    def __init__(self, sequence: _Optional[int] = ..., time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., scope: _Optional[str] = ..., dropped: _Optional[int] = ..., breaker_transition: _Optional[_Union[BreakerTransition, _Mapping]] = ..., probe: _Optional[_Union[ProbeEvent, _Mapping]] = ..., stale_outcome: _Optional[_Union[StaleOutcome, _Mapping]] = ..., override_changed: _Optional[_Union[OverrideChanged, _Mapping]] = ..., wait_started: _Optional[_Union[WaitStarted, _Mapping]] = ..., backend_health: _Optional[_Union[BackendHealth, _Mapping]] = ...) -> None: ...

class BreakerTransition(_message.Message):
    __slots__ = ("source", "to", "cause", "epoch", "reopens", "cooldown")
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    FROM_FIELD_NUMBER: _ClassVar[int]
    TO_FIELD_NUMBER: _ClassVar[int]
    CAUSE_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    REOPENS_FIELD_NUMBER: _ClassVar[int]
    COOLDOWN_FIELD_NUMBER: _ClassVar[int]
    source: str
    to: BreakerState
    cause: TransitionCause
    epoch: int
    reopens: int
    cooldown: _duration_pb2.Duration
    def __init__(self, source: _Optional[str] = ..., to: _Optional[_Union[BreakerState, str]] = ..., cause: _Optional[_Union[TransitionCause, str]] = ..., epoch: _Optional[int] = ..., reopens: _Optional[int] = ..., cooldown: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., **kwargs) -> None: ...

class ProbeEvent(_message.Message):
    __slots__ = ("source", "kind", "permit_id", "epoch", "call_id", "outcome", "state")
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    PERMIT_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    source: str
    kind: ProbeEventKind
    permit_id: str
    epoch: int
    call_id: str
    outcome: Outcome
    state: BreakerState
    def __init__(self, source: _Optional[str] = ..., kind: _Optional[_Union[ProbeEventKind, str]] = ..., permit_id: _Optional[str] = ..., epoch: _Optional[int] = ..., call_id: _Optional[str] = ..., outcome: _Optional[_Union[Outcome, str]] = ..., state: _Optional[_Union[BreakerState, str]] = ...) -> None: ...

class StaleOutcome(_message.Message):
    __slots__ = ("source", "permit_id", "epoch", "state")
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    PERMIT_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    source: str
    permit_id: str
    epoch: int
    state: BreakerState
    def __init__(self, source: _Optional[str] = ..., permit_id: _Optional[str] = ..., epoch: _Optional[int] = ..., state: _Optional[_Union[BreakerState, str]] = ...) -> None: ...

class OverrideChanged(_message.Message):
    __slots__ = ("source", "override", "actor", "reason", "state", "epoch", "action")
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    OVERRIDE_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    source: str
    override: Override
    actor: str
    reason: str
    state: BreakerState
    epoch: int
    action: OverrideAction
    def __init__(self, source: _Optional[str] = ..., override: _Optional[_Union[Override, str]] = ..., actor: _Optional[str] = ..., reason: _Optional[str] = ..., state: _Optional[_Union[BreakerState, str]] = ..., epoch: _Optional[int] = ..., action: _Optional[_Union[OverrideAction, str]] = ...) -> None: ...

class WaitStarted(_message.Message):
    __slots__ = ("call_id", "sleep", "gate_rejections", "per_source_reasons", "attempts")
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    SLEEP_FIELD_NUMBER: _ClassVar[int]
    GATE_REJECTIONS_FIELD_NUMBER: _ClassVar[int]
    PER_SOURCE_REASONS_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    call_id: str
    sleep: _duration_pb2.Duration
    gate_rejections: int
    per_source_reasons: _containers.RepeatedCompositeFieldContainer[SourceReason]
    attempts: int
    def __init__(self, call_id: _Optional[str] = ..., sleep: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., gate_rejections: _Optional[int] = ..., per_source_reasons: _Optional[_Iterable[_Union[SourceReason, _Mapping]]] = ..., attempts: _Optional[int] = ...) -> None: ...

class BackendHealth(_message.Message):
    __slots__ = ("backend", "degraded", "detail")
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    DEGRADED_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    backend: str
    degraded: bool
    detail: str
    def __init__(self, backend: _Optional[str] = ..., degraded: _Optional[bool] = ..., detail: _Optional[str] = ...) -> None: ...
