from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TrainingDecision(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TRAINING_DECISION_UNSPECIFIED: _ClassVar[TrainingDecision]
    TRAINING_DECISION_DISPATCHED: _ClassVar[TrainingDecision]
    TRAINING_DECISION_SKIPPED_BUSY: _ClassVar[TrainingDecision]
    TRAINING_DECISION_SKIPPED_WORKER_REMOVED: _ClassVar[TrainingDecision]
    TRAINING_DECISION_SKIPPED_NO_LABEL: _ClassVar[TrainingDecision]
TRAINING_DECISION_UNSPECIFIED: TrainingDecision
TRAINING_DECISION_DISPATCHED: TrainingDecision
TRAINING_DECISION_SKIPPED_BUSY: TrainingDecision
TRAINING_DECISION_SKIPPED_WORKER_REMOVED: TrainingDecision
TRAINING_DECISION_SKIPPED_NO_LABEL: TrainingDecision

class Tensor(_message.Message):
    __slots__ = ("shape", "dtype", "data")
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    shape: _containers.RepeatedScalarFieldContainer[int]
    dtype: str
    data: bytes
    def __init__(self, shape: _Optional[_Iterable[int]] = ..., dtype: _Optional[str] = ..., data: _Optional[bytes] = ...) -> None: ...

class Sample(_message.Message):
    __slots__ = ("id", "sequence", "event_time_ms", "tensor", "label", "task", "stream")
    ID_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    EVENT_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    TENSOR_FIELD_NUMBER: _ClassVar[int]
    LABEL_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    STREAM_FIELD_NUMBER: _ClassVar[int]
    id: str
    sequence: int
    event_time_ms: int
    tensor: Tensor
    label: int
    task: int
    stream: str
    def __init__(self, id: _Optional[str] = ..., sequence: _Optional[int] = ..., event_time_ms: _Optional[int] = ..., tensor: _Optional[_Union[Tensor, _Mapping]] = ..., label: _Optional[int] = ..., task: _Optional[int] = ..., stream: _Optional[str] = ...) -> None: ...

class Label(_message.Message):
    __slots__ = ("sample_id", "label", "event_time_ms")
    SAMPLE_ID_FIELD_NUMBER: _ClassVar[int]
    LABEL_FIELD_NUMBER: _ClassVar[int]
    EVENT_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    sample_id: str
    label: int
    event_time_ms: int
    def __init__(self, sample_id: _Optional[str] = ..., label: _Optional[int] = ..., event_time_ms: _Optional[int] = ...) -> None: ...

class ClassProbability(_message.Message):
    __slots__ = ("class_index", "probability")
    CLASS_INDEX_FIELD_NUMBER: _ClassVar[int]
    PROBABILITY_FIELD_NUMBER: _ClassVar[int]
    class_index: int
    probability: float
    def __init__(self, class_index: _Optional[int] = ..., probability: _Optional[float] = ...) -> None: ...

class Prediction(_message.Message):
    __slots__ = ("sample_id", "sequence", "predicted_class", "confidence", "has_label", "correct", "model_version", "latency_ms", "online_accuracy", "duplicate", "item", "decision", "worker", "plan_version", "task", "stream", "predicted_time_ms", "instance_id", "source_partition", "source_offset", "label", "top_k", "model_lineage")
    SAMPLE_ID_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    PREDICTED_CLASS_FIELD_NUMBER: _ClassVar[int]
    CONFIDENCE_FIELD_NUMBER: _ClassVar[int]
    HAS_LABEL_FIELD_NUMBER: _ClassVar[int]
    CORRECT_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    LATENCY_MS_FIELD_NUMBER: _ClassVar[int]
    ONLINE_ACCURACY_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    ITEM_FIELD_NUMBER: _ClassVar[int]
    DECISION_FIELD_NUMBER: _ClassVar[int]
    WORKER_FIELD_NUMBER: _ClassVar[int]
    PLAN_VERSION_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    STREAM_FIELD_NUMBER: _ClassVar[int]
    PREDICTED_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    SOURCE_PARTITION_FIELD_NUMBER: _ClassVar[int]
    SOURCE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    LABEL_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    MODEL_LINEAGE_FIELD_NUMBER: _ClassVar[int]
    sample_id: str
    sequence: int
    predicted_class: int
    confidence: float
    has_label: bool
    correct: bool
    model_version: int
    latency_ms: float
    online_accuracy: float
    duplicate: bool
    item: int
    decision: TrainingDecision
    worker: int
    plan_version: int
    task: int
    stream: str
    predicted_time_ms: int
    instance_id: str
    source_partition: int
    source_offset: int
    label: int
    top_k: _containers.RepeatedCompositeFieldContainer[ClassProbability]
    model_lineage: int
    def __init__(self, sample_id: _Optional[str] = ..., sequence: _Optional[int] = ..., predicted_class: _Optional[int] = ..., confidence: _Optional[float] = ..., has_label: _Optional[bool] = ..., correct: _Optional[bool] = ..., model_version: _Optional[int] = ..., latency_ms: _Optional[float] = ..., online_accuracy: _Optional[float] = ..., duplicate: _Optional[bool] = ..., item: _Optional[int] = ..., decision: _Optional[_Union[TrainingDecision, str]] = ..., worker: _Optional[int] = ..., plan_version: _Optional[int] = ..., task: _Optional[int] = ..., stream: _Optional[str] = ..., predicted_time_ms: _Optional[int] = ..., instance_id: _Optional[str] = ..., source_partition: _Optional[int] = ..., source_offset: _Optional[int] = ..., label: _Optional[int] = ..., top_k: _Optional[_Iterable[_Union[ClassProbability, _Mapping]]] = ..., model_lineage: _Optional[int] = ...) -> None: ...

class ModelEvent(_message.Message):
    __slots__ = ("kind", "instance_id", "model_version", "previous_model_version", "item", "source_partition", "source_offset", "detector", "reaction", "detail", "time_ms", "model_lineage")
    KIND_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    ITEM_FIELD_NUMBER: _ClassVar[int]
    SOURCE_PARTITION_FIELD_NUMBER: _ClassVar[int]
    SOURCE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    DETECTOR_FIELD_NUMBER: _ClassVar[int]
    REACTION_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    TIME_MS_FIELD_NUMBER: _ClassVar[int]
    MODEL_LINEAGE_FIELD_NUMBER: _ClassVar[int]
    kind: str
    instance_id: str
    model_version: int
    previous_model_version: int
    item: int
    source_partition: int
    source_offset: int
    detector: str
    reaction: str
    detail: str
    time_ms: int
    model_lineage: int
    def __init__(self, kind: _Optional[str] = ..., instance_id: _Optional[str] = ..., model_version: _Optional[int] = ..., previous_model_version: _Optional[int] = ..., item: _Optional[int] = ..., source_partition: _Optional[int] = ..., source_offset: _Optional[int] = ..., detector: _Optional[str] = ..., reaction: _Optional[str] = ..., detail: _Optional[str] = ..., time_ms: _Optional[int] = ..., model_lineage: _Optional[int] = ...) -> None: ...
