from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ServiceState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SERVICE_STATE_UNSPECIFIED: _ClassVar[ServiceState]
    SERVICE_STATE_STARTING: _ClassVar[ServiceState]
    SERVICE_STATE_RUNNING: _ClassVar[ServiceState]
    SERVICE_STATE_REPLANNING: _ClassVar[ServiceState]
    SERVICE_STATE_SNAPSHOTTING: _ClassVar[ServiceState]
    SERVICE_STATE_RESTORING: _ClassVar[ServiceState]
    SERVICE_STATE_STOPPING: _ClassVar[ServiceState]
SERVICE_STATE_UNSPECIFIED: ServiceState
SERVICE_STATE_STARTING: ServiceState
SERVICE_STATE_RUNNING: ServiceState
SERVICE_STATE_REPLANNING: ServiceState
SERVICE_STATE_SNAPSHOTTING: ServiceState
SERVICE_STATE_RESTORING: ServiceState
SERVICE_STATE_STOPPING: ServiceState

class SetMemoryBudgetRequest(_message.Message):
    __slots__ = ("budget_bytes", "unconstrained")
    BUDGET_BYTES_FIELD_NUMBER: _ClassVar[int]
    UNCONSTRAINED_FIELD_NUMBER: _ClassVar[int]
    budget_bytes: int
    unconstrained: bool
    def __init__(self, budget_bytes: _Optional[int] = ..., unconstrained: _Optional[bool] = ...) -> None: ...

class GetPlanRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Stage(_message.Message):
    __slots__ = ("units",)
    UNITS_FIELD_NUMBER: _ClassVar[int]
    units: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, units: _Optional[_Iterable[int]] = ...) -> None: ...

class Worker(_message.Message):
    __slots__ = ("index", "delay", "live", "recompute", "accumulation", "omission")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    DELAY_FIELD_NUMBER: _ClassVar[int]
    LIVE_FIELD_NUMBER: _ClassVar[int]
    RECOMPUTE_FIELD_NUMBER: _ClassVar[int]
    ACCUMULATION_FIELD_NUMBER: _ClassVar[int]
    OMISSION_FIELD_NUMBER: _ClassVar[int]
    index: int
    delay: int
    live: bool
    recompute: bool
    accumulation: _containers.RepeatedScalarFieldContainer[int]
    omission: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, index: _Optional[int] = ..., delay: _Optional[int] = ..., live: _Optional[bool] = ..., recompute: _Optional[bool] = ..., accumulation: _Optional[_Iterable[int]] = ..., omission: _Optional[_Iterable[int]] = ...) -> None: ...

class PlanReply(_message.Message):
    __slots__ = ("model", "stages", "partition", "num_stages", "workers", "num_workers", "live_workers", "predicted_bytes", "paper_memory_elements", "min_feasible_bytes", "budget_bytes", "adaptation_rate", "arrival_interval_s", "stage_forward_time_s", "stage_backward_time_s", "decay", "memory_model", "dtype", "memory_breakdown", "plan_json", "plan_version", "applied_time_ms", "planning_seconds", "stall_seconds", "host_bytes")
    class MemoryBreakdownEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    MODEL_FIELD_NUMBER: _ClassVar[int]
    STAGES_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    NUM_STAGES_FIELD_NUMBER: _ClassVar[int]
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    NUM_WORKERS_FIELD_NUMBER: _ClassVar[int]
    LIVE_WORKERS_FIELD_NUMBER: _ClassVar[int]
    PREDICTED_BYTES_FIELD_NUMBER: _ClassVar[int]
    PAPER_MEMORY_ELEMENTS_FIELD_NUMBER: _ClassVar[int]
    MIN_FEASIBLE_BYTES_FIELD_NUMBER: _ClassVar[int]
    BUDGET_BYTES_FIELD_NUMBER: _ClassVar[int]
    ADAPTATION_RATE_FIELD_NUMBER: _ClassVar[int]
    ARRIVAL_INTERVAL_S_FIELD_NUMBER: _ClassVar[int]
    STAGE_FORWARD_TIME_S_FIELD_NUMBER: _ClassVar[int]
    STAGE_BACKWARD_TIME_S_FIELD_NUMBER: _ClassVar[int]
    DECAY_FIELD_NUMBER: _ClassVar[int]
    MEMORY_MODEL_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BREAKDOWN_FIELD_NUMBER: _ClassVar[int]
    PLAN_JSON_FIELD_NUMBER: _ClassVar[int]
    PLAN_VERSION_FIELD_NUMBER: _ClassVar[int]
    APPLIED_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    PLANNING_SECONDS_FIELD_NUMBER: _ClassVar[int]
    STALL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    HOST_BYTES_FIELD_NUMBER: _ClassVar[int]
    model: str
    stages: _containers.RepeatedCompositeFieldContainer[Stage]
    partition: _containers.RepeatedScalarFieldContainer[int]
    num_stages: int
    workers: _containers.RepeatedCompositeFieldContainer[Worker]
    num_workers: int
    live_workers: int
    predicted_bytes: int
    paper_memory_elements: int
    min_feasible_bytes: int
    budget_bytes: int
    adaptation_rate: float
    arrival_interval_s: float
    stage_forward_time_s: float
    stage_backward_time_s: float
    decay: float
    memory_model: str
    dtype: str
    memory_breakdown: _containers.ScalarMap[str, int]
    plan_json: str
    plan_version: int
    applied_time_ms: int
    planning_seconds: float
    stall_seconds: float
    host_bytes: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, model: _Optional[str] = ..., stages: _Optional[_Iterable[_Union[Stage, _Mapping]]] = ..., partition: _Optional[_Iterable[int]] = ..., num_stages: _Optional[int] = ..., workers: _Optional[_Iterable[_Union[Worker, _Mapping]]] = ..., num_workers: _Optional[int] = ..., live_workers: _Optional[int] = ..., predicted_bytes: _Optional[int] = ..., paper_memory_elements: _Optional[int] = ..., min_feasible_bytes: _Optional[int] = ..., budget_bytes: _Optional[int] = ..., adaptation_rate: _Optional[float] = ..., arrival_interval_s: _Optional[float] = ..., stage_forward_time_s: _Optional[float] = ..., stage_backward_time_s: _Optional[float] = ..., decay: _Optional[float] = ..., memory_model: _Optional[str] = ..., dtype: _Optional[str] = ..., memory_breakdown: _Optional[_Mapping[str, int]] = ..., plan_json: _Optional[str] = ..., plan_version: _Optional[int] = ..., applied_time_ms: _Optional[int] = ..., planning_seconds: _Optional[float] = ..., stall_seconds: _Optional[float] = ..., host_bytes: _Optional[_Iterable[int]] = ...) -> None: ...

class GetStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class WatchStatusRequest(_message.Message):
    __slots__ = ("interval_s",)
    INTERVAL_S_FIELD_NUMBER: _ClassVar[int]
    interval_s: float
    def __init__(self, interval_s: _Optional[float] = ...) -> None: ...

class StatusReply(_message.Message):
    __slots__ = ("instance_id", "state", "time_ms", "uptime_s", "items_received", "items_valid", "items_dead_lettered", "predictions_published", "duplicates_published", "items_dispatched", "items_skipped", "backward_passes", "labels_joined", "online_accuracy", "labelled_predictions", "correct_predictions", "budget_bytes", "predicted_bytes", "measured_bytes", "lag_items", "lag_seconds", "items_per_second", "latency_ms_p50", "latency_ms_p99", "model_version", "plan_version", "replans", "pauses", "last_snapshot_version", "counters", "rollbacks", "promotions", "drifts", "last_good_version", "model_lineage")
    class ItemsSkippedEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class CountersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    TIME_MS_FIELD_NUMBER: _ClassVar[int]
    UPTIME_S_FIELD_NUMBER: _ClassVar[int]
    ITEMS_RECEIVED_FIELD_NUMBER: _ClassVar[int]
    ITEMS_VALID_FIELD_NUMBER: _ClassVar[int]
    ITEMS_DEAD_LETTERED_FIELD_NUMBER: _ClassVar[int]
    PREDICTIONS_PUBLISHED_FIELD_NUMBER: _ClassVar[int]
    DUPLICATES_PUBLISHED_FIELD_NUMBER: _ClassVar[int]
    ITEMS_DISPATCHED_FIELD_NUMBER: _ClassVar[int]
    ITEMS_SKIPPED_FIELD_NUMBER: _ClassVar[int]
    BACKWARD_PASSES_FIELD_NUMBER: _ClassVar[int]
    LABELS_JOINED_FIELD_NUMBER: _ClassVar[int]
    ONLINE_ACCURACY_FIELD_NUMBER: _ClassVar[int]
    LABELLED_PREDICTIONS_FIELD_NUMBER: _ClassVar[int]
    CORRECT_PREDICTIONS_FIELD_NUMBER: _ClassVar[int]
    BUDGET_BYTES_FIELD_NUMBER: _ClassVar[int]
    PREDICTED_BYTES_FIELD_NUMBER: _ClassVar[int]
    MEASURED_BYTES_FIELD_NUMBER: _ClassVar[int]
    LAG_ITEMS_FIELD_NUMBER: _ClassVar[int]
    LAG_SECONDS_FIELD_NUMBER: _ClassVar[int]
    ITEMS_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    LATENCY_MS_P50_FIELD_NUMBER: _ClassVar[int]
    LATENCY_MS_P99_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    PLAN_VERSION_FIELD_NUMBER: _ClassVar[int]
    REPLANS_FIELD_NUMBER: _ClassVar[int]
    PAUSES_FIELD_NUMBER: _ClassVar[int]
    LAST_SNAPSHOT_VERSION_FIELD_NUMBER: _ClassVar[int]
    COUNTERS_FIELD_NUMBER: _ClassVar[int]
    ROLLBACKS_FIELD_NUMBER: _ClassVar[int]
    PROMOTIONS_FIELD_NUMBER: _ClassVar[int]
    DRIFTS_FIELD_NUMBER: _ClassVar[int]
    LAST_GOOD_VERSION_FIELD_NUMBER: _ClassVar[int]
    MODEL_LINEAGE_FIELD_NUMBER: _ClassVar[int]
    instance_id: str
    state: ServiceState
    time_ms: int
    uptime_s: float
    items_received: int
    items_valid: int
    items_dead_lettered: int
    predictions_published: int
    duplicates_published: int
    items_dispatched: int
    items_skipped: _containers.ScalarMap[str, int]
    backward_passes: int
    labels_joined: int
    online_accuracy: float
    labelled_predictions: int
    correct_predictions: int
    budget_bytes: int
    predicted_bytes: int
    measured_bytes: int
    lag_items: int
    lag_seconds: float
    items_per_second: float
    latency_ms_p50: float
    latency_ms_p99: float
    model_version: int
    plan_version: int
    replans: int
    pauses: int
    last_snapshot_version: int
    counters: _containers.ScalarMap[str, int]
    rollbacks: int
    promotions: int
    drifts: int
    last_good_version: int
    model_lineage: int
    def __init__(self, instance_id: _Optional[str] = ..., state: _Optional[_Union[ServiceState, str]] = ..., time_ms: _Optional[int] = ..., uptime_s: _Optional[float] = ..., items_received: _Optional[int] = ..., items_valid: _Optional[int] = ..., items_dead_lettered: _Optional[int] = ..., predictions_published: _Optional[int] = ..., duplicates_published: _Optional[int] = ..., items_dispatched: _Optional[int] = ..., items_skipped: _Optional[_Mapping[str, int]] = ..., backward_passes: _Optional[int] = ..., labels_joined: _Optional[int] = ..., online_accuracy: _Optional[float] = ..., labelled_predictions: _Optional[int] = ..., correct_predictions: _Optional[int] = ..., budget_bytes: _Optional[int] = ..., predicted_bytes: _Optional[int] = ..., measured_bytes: _Optional[int] = ..., lag_items: _Optional[int] = ..., lag_seconds: _Optional[float] = ..., items_per_second: _Optional[float] = ..., latency_ms_p50: _Optional[float] = ..., latency_ms_p99: _Optional[float] = ..., model_version: _Optional[int] = ..., plan_version: _Optional[int] = ..., replans: _Optional[int] = ..., pauses: _Optional[int] = ..., last_snapshot_version: _Optional[int] = ..., counters: _Optional[_Mapping[str, int]] = ..., rollbacks: _Optional[int] = ..., promotions: _Optional[int] = ..., drifts: _Optional[int] = ..., last_good_version: _Optional[int] = ..., model_lineage: _Optional[int] = ...) -> None: ...

class SaveSnapshotRequest(_message.Message):
    __slots__ = ("metadata",)
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    METADATA_FIELD_NUMBER: _ClassVar[int]
    metadata: _containers.ScalarMap[str, str]
    def __init__(self, metadata: _Optional[_Mapping[str, str]] = ...) -> None: ...

class TopicPartitionOffset(_message.Message):
    __slots__ = ("topic", "partition", "offset")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    offset: int
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ..., offset: _Optional[int] = ...) -> None: ...

class SnapshotInfo(_message.Message):
    __slots__ = ("version", "instance_id", "created_time_ms", "chunks", "total_bytes", "sha256", "offsets", "plan_version", "valid", "error", "metadata", "seconds")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    VERSION_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    CREATED_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    OFFSETS_FIELD_NUMBER: _ClassVar[int]
    PLAN_VERSION_FIELD_NUMBER: _ClassVar[int]
    VALID_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    version: int
    instance_id: str
    created_time_ms: int
    chunks: int
    total_bytes: int
    sha256: str
    offsets: _containers.RepeatedCompositeFieldContainer[TopicPartitionOffset]
    plan_version: int
    valid: bool
    error: str
    metadata: _containers.ScalarMap[str, str]
    seconds: float
    def __init__(self, version: _Optional[int] = ..., instance_id: _Optional[str] = ..., created_time_ms: _Optional[int] = ..., chunks: _Optional[int] = ..., total_bytes: _Optional[int] = ..., sha256: _Optional[str] = ..., offsets: _Optional[_Iterable[_Union[TopicPartitionOffset, _Mapping]]] = ..., plan_version: _Optional[int] = ..., valid: _Optional[bool] = ..., error: _Optional[str] = ..., metadata: _Optional[_Mapping[str, str]] = ..., seconds: _Optional[float] = ...) -> None: ...

class RestoreSnapshotRequest(_message.Message):
    __slots__ = ("version",)
    VERSION_FIELD_NUMBER: _ClassVar[int]
    version: int
    def __init__(self, version: _Optional[int] = ...) -> None: ...

class RestoreSnapshotReply(_message.Message):
    __slots__ = ("snapshot", "plan", "seconds")
    SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    PLAN_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    snapshot: SnapshotInfo
    plan: PlanReply
    seconds: float
    def __init__(self, snapshot: _Optional[_Union[SnapshotInfo, _Mapping]] = ..., plan: _Optional[_Union[PlanReply, _Mapping]] = ..., seconds: _Optional[float] = ...) -> None: ...

class ListSnapshotsRequest(_message.Message):
    __slots__ = ("verify",)
    VERIFY_FIELD_NUMBER: _ClassVar[int]
    verify: bool
    def __init__(self, verify: _Optional[bool] = ...) -> None: ...

class ListSnapshotsReply(_message.Message):
    __slots__ = ("snapshots", "latest_version")
    SNAPSHOTS_FIELD_NUMBER: _ClassVar[int]
    LATEST_VERSION_FIELD_NUMBER: _ClassVar[int]
    snapshots: _containers.RepeatedCompositeFieldContainer[SnapshotInfo]
    latest_version: int
    def __init__(self, snapshots: _Optional[_Iterable[_Union[SnapshotInfo, _Mapping]]] = ..., latest_version: _Optional[int] = ...) -> None: ...
