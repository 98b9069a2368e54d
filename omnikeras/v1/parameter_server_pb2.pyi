from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Refusal(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    REFUSAL_UNSPECIFIED: _ClassVar[Refusal]
    NOT_REGISTERED: _ClassVar[Refusal]
    DROPPED: _ClassVar[Refusal]
    NON_FINITE: _ClassVar[Refusal]
REFUSAL_UNSPECIFIED: Refusal
NOT_REGISTERED: Refusal
DROPPED: Refusal
NON_FINITE: Refusal

class VariableSpec(_message.Message):
    __slots__ = ("name", "dtype", "shape")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    name: str
    dtype: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, name: _Optional[str] = ..., dtype: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ...) -> None: ...

class TensorChunk(_message.Message):
    __slots__ = ("spec", "offset", "data")
    SPEC_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    spec: VariableSpec
    offset: int
    data: bytes
    def __init__(self, spec: _Optional[_Union[VariableSpec, _Mapping]] = ..., offset: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class LearningRateSchedule(_message.Message):
    __slots__ = ("name", "config_json")
    NAME_FIELD_NUMBER: _ClassVar[int]
    CONFIG_JSON_FIELD_NUMBER: _ClassVar[int]
    name: str
    config_json: str
    def __init__(self, name: _Optional[str] = ..., config_json: _Optional[str] = ...) -> None: ...

class Constraint(_message.Message):
    __slots__ = ("name", "config_json")
    NAME_FIELD_NUMBER: _ClassVar[int]
    CONFIG_JSON_FIELD_NUMBER: _ClassVar[int]
    name: str
    config_json: str
    def __init__(self, name: _Optional[str] = ..., config_json: _Optional[str] = ...) -> None: ...

class Hyperparameters(_message.Message):
    __slots__ = ("learning_rate", "momentum", "nesterov", "learning_rate_schedule", "weight_decay", "no_weight_decay", "statistics", "compensate_asynchrony", "optimizer", "settings", "adamw_variables", "learning_rate_from_workers", "constraints", "use_ema", "ema_momentum", "ema_overwrite_frequency", "gradient_accumulation_steps", "clipnorm", "global_clipnorm", "clipvalue")
    class SettingsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    class ConstraintsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Constraint
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Constraint, _Mapping]] = ...) -> None: ...
    LEARNING_RATE_FIELD_NUMBER: _ClassVar[int]
    MOMENTUM_FIELD_NUMBER: _ClassVar[int]
    NESTEROV_FIELD_NUMBER: _ClassVar[int]
    LEARNING_RATE_SCHEDULE_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_DECAY_FIELD_NUMBER: _ClassVar[int]
    NO_WEIGHT_DECAY_FIELD_NUMBER: _ClassVar[int]
    STATISTICS_FIELD_NUMBER: _ClassVar[int]
    COMPENSATE_ASYNCHRONY_FIELD_NUMBER: _ClassVar[int]
    OPTIMIZER_FIELD_NUMBER: _ClassVar[int]
    SETTINGS_FIELD_NUMBER: _ClassVar[int]
    ADAMW_VARIABLES_FIELD_NUMBER: _ClassVar[int]
    LEARNING_RATE_FROM_WORKERS_FIELD_NUMBER: _ClassVar[int]
    CONSTRAINTS_FIELD_NUMBER: _ClassVar[int]
    USE_EMA_FIELD_NUMBER: _ClassVar[int]
    EMA_MOMENTUM_FIELD_NUMBER: _ClassVar[int]
    EMA_OVERWRITE_FREQUENCY_FIELD_NUMBER: _ClassVar[int]
    GRADIENT_ACCUMULATION_STEPS_FIELD_NUMBER: _ClassVar[int]
    CLIPNORM_FIELD_NUMBER: _ClassVar[int]
    GLOBAL_CLIPNORM_FIELD_NUMBER: _ClassVar[int]
    CLIPVALUE_FIELD_NUMBER: _ClassVar[int]
    learning_rate: float
    momentum: float
    nesterov: bool
    learning_rate_schedule: LearningRateSchedule
    weight_decay: float
    no_weight_decay: _containers.RepeatedScalarFieldContainer[str]
    statistics: _containers.RepeatedScalarFieldContainer[str]
    compensate_asynchrony: bool
    optimizer: str
    settings: _containers.ScalarMap[str, float]
    adamw_variables: _containers.RepeatedScalarFieldContainer[str]
    learning_rate_from_workers: bool
    constraints: _containers.MessageMap[str, Constraint]
    use_ema: bool
    ema_momentum: float
    ema_overwrite_frequency: int
    gradient_accumulation_steps: int
    clipnorm: float
    global_clipnorm: float
    clipvalue: float
    def __init__(self, learning_rate: _Optional[float] = ..., momentum: _Optional[float] = ..., nesterov: _Optional[bool] = ..., learning_rate_schedule: _Optional[_Union[LearningRateSchedule, _Mapping]] = ..., weight_decay: _Optional[float] = ..., no_weight_decay: _Optional[_Iterable[str]] = ..., statistics: _Optional[_Iterable[str]] = ..., compensate_asynchrony: _Optional[bool] = ..., optimizer: _Optional[str] = ..., settings: _Optional[_Mapping[str, float]] = ..., adamw_variables: _Optional[_Iterable[str]] = ..., learning_rate_from_workers: _Optional[bool] = ..., constraints: _Optional[_Mapping[str, Constraint]] = ..., use_ema: _Optional[bool] = ..., ema_momentum: _Optional[float] = ..., ema_overwrite_frequency: _Optional[int] = ..., gradient_accumulation_steps: _Optional[int] = ..., clipnorm: _Optional[float] = ..., global_clipnorm: _Optional[float] = ..., clipvalue: _Optional[float] = ...) -> None: ...

class RegisterRequest(_message.Message):
    __slots__ = ("worker_id", "group", "host", "chief")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    CHIEF_FIELD_NUMBER: _ClassVar[int]
    worker_id: int
    group: int
    host: str
    chief: bool
    def __init__(self, worker_id: _Optional[int] = ..., group: _Optional[int] = ..., host: _Optional[str] = ..., chief: _Optional[bool] = ...) -> None: ...

class RegisterReply(_message.Message):
    __slots__ = ("worker_id", "group", "num_groups", "model_version", "model_initialized", "hyperparameters", "server_id")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    NUM_GROUPS_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    MODEL_INITIALIZED_FIELD_NUMBER: _ClassVar[int]
    HYPERPARAMETERS_FIELD_NUMBER: _ClassVar[int]
    SERVER_ID_FIELD_NUMBER: _ClassVar[int]
    worker_id: int
    group: int
    num_groups: int
    model_version: int
    model_initialized: bool
    hyperparameters: Hyperparameters
    server_id: str
    def __init__(self, worker_id: _Optional[int] = ..., group: _Optional[int] = ..., num_groups: _Optional[int] = ..., model_version: _Optional[int] = ..., model_initialized: _Optional[bool] = ..., hyperparameters: _Optional[_Union[Hyperparameters, _Mapping]] = ..., server_id: _Optional[str] = ...) -> None: ...

class DeregisterRequest(_message.Message):
    __slots__ = ("worker_id",)
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    worker_id: int
    def __init__(self, worker_id: _Optional[int] = ...) -> None: ...

class DeregisterReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class InitModelRequest(_message.Message):
    __slots__ = ("hyperparameters", "chunk")
    HYPERPARAMETERS_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    hyperparameters: Hyperparameters
    chunk: TensorChunk
    def __init__(self, hyperparameters: _Optional[_Union[Hyperparameters, _Mapping]] = ..., chunk: _Optional[_Union[TensorChunk, _Mapping]] = ...) -> None: ...

class InitModelReply(_message.Message):
    __slots__ = ("model_version", "initialized_by_caller")
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    INITIALIZED_BY_CALLER_FIELD_NUMBER: _ClassVar[int]
    model_version: int
    initialized_by_caller: bool
    def __init__(self, model_version: _Optional[int] = ..., initialized_by_caller: _Optional[bool] = ...) -> None: ...

class PushHeader(_message.Message):
    __slots__ = ("worker_id", "step", "model_version", "example_count", "batch", "known_layout_version", "loss", "skip_update", "learning_rate")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    EXAMPLE_COUNT_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    KNOWN_LAYOUT_VERSION_FIELD_NUMBER: _ClassVar[int]
    LOSS_FIELD_NUMBER: _ClassVar[int]
    SKIP_UPDATE_FIELD_NUMBER: _ClassVar[int]
    LEARNING_RATE_FIELD_NUMBER: _ClassVar[int]
    worker_id: int
    step: int
    model_version: int
    example_count: int
    batch: int
    known_layout_version: int
    loss: float
    skip_update: bool
    learning_rate: float
    def __init__(self, worker_id: _Optional[int] = ..., step: _Optional[int] = ..., model_version: _Optional[int] = ..., example_count: _Optional[int] = ..., batch: _Optional[int] = ..., known_layout_version: _Optional[int] = ..., loss: _Optional[float] = ..., skip_update: _Optional[bool] = ..., learning_rate: _Optional[float] = ...) -> None: ...

class PushRequest(_message.Message):
    __slots__ = ("header", "chunk")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    header: PushHeader
    chunk: TensorChunk
    def __init__(self, header: _Optional[_Union[PushHeader, _Mapping]] = ..., chunk: _Optional[_Union[TensorChunk, _Mapping]] = ...) -> None: ...

class PushReply(_message.Message):
    __slots__ = ("model_version", "group", "group_members_combined", "stop_requested", "layout_version", "next_batch", "next_members", "layout", "update_skipped", "iterations")
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    GROUP_MEMBERS_COMBINED_FIELD_NUMBER: _ClassVar[int]
    STOP_REQUESTED_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_VERSION_FIELD_NUMBER: _ClassVar[int]
    NEXT_BATCH_FIELD_NUMBER: _ClassVar[int]
    NEXT_MEMBERS_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_FIELD_NUMBER: _ClassVar[int]
    UPDATE_SKIPPED_FIELD_NUMBER: _ClassVar[int]
    ITERATIONS_FIELD_NUMBER: _ClassVar[int]
    model_version: int
    group: int
    group_members_combined: int
    stop_requested: bool
    layout_version: int
    next_batch: int
    next_members: _containers.RepeatedScalarFieldContainer[int]
    layout: GroupLayout
    update_skipped: bool
    iterations: int
    def __init__(self, model_version: _Optional[int] = ..., group: _Optional[int] = ..., group_members_combined: _Optional[int] = ..., stop_requested: _Optional[bool] = ..., layout_version: _Optional[int] = ..., next_batch: _Optional[int] = ..., next_members: _Optional[_Iterable[int]] = ..., layout: _Optional[_Union[GroupLayout, _Mapping]] = ..., update_skipped: _Optional[bool] = ..., iterations: _Optional[int] = ...) -> None: ...

class GroupLayout(_message.Message):
    __slots__ = ("version", "groups")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    version: int
    groups: _containers.RepeatedCompositeFieldContainer[GroupMembers]
    def __init__(self, version: _Optional[int] = ..., groups: _Optional[_Iterable[_Union[GroupMembers, _Mapping]]] = ...) -> None: ...

class GroupMembers(_message.Message):
    __slots__ = ("workers",)
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    workers: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, workers: _Optional[_Iterable[int]] = ...) -> None: ...

class PullRequest(_message.Message):
    __slots__ = ("newer_than", "wait_for_model_seconds")
    NEWER_THAN_FIELD_NUMBER: _ClassVar[int]
    WAIT_FOR_MODEL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    newer_than: int
    wait_for_model_seconds: float
    def __init__(self, newer_than: _Optional[int] = ..., wait_for_model_seconds: _Optional[float] = ...) -> None: ...

class PullReply(_message.Message):
    __slots__ = ("header", "chunk")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    header: PullHeader
    chunk: TensorChunk
    def __init__(self, header: _Optional[_Union[PullHeader, _Mapping]] = ..., chunk: _Optional[_Union[TensorChunk, _Mapping]] = ...) -> None: ...

class PullHeader(_message.Message):
    __slots__ = ("model_version", "has_weights", "push")
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    HAS_WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    PUSH_FIELD_NUMBER: _ClassVar[int]
    model_version: int
    has_weights: bool
    push: PushReply
    def __init__(self, model_version: _Optional[int] = ..., has_weights: _Optional[bool] = ..., push: _Optional[_Union[PushReply, _Mapping]] = ...) -> None: ...

class DescribeRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DescribeReply(_message.Message):
    __slots__ = ("model_initialized", "model_version", "variables", "hyperparameters", "num_groups", "shared_memory_socket", "server_id", "resumed_from_version", "iterations")
    MODEL_INITIALIZED_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    VARIABLES_FIELD_NUMBER: _ClassVar[int]
    HYPERPARAMETERS_FIELD_NUMBER: _ClassVar[int]
    NUM_GROUPS_FIELD_NUMBER: _ClassVar[int]
    SHARED_MEMORY_SOCKET_FIELD_NUMBER: _ClassVar[int]
    SERVER_ID_FIELD_NUMBER: _ClassVar[int]
    RESUMED_FROM_VERSION_FIELD_NUMBER: _ClassVar[int]
    ITERATIONS_FIELD_NUMBER: _ClassVar[int]
    model_initialized: bool
    model_version: int
    variables: _containers.RepeatedCompositeFieldContainer[VariableSpec]
    hyperparameters: Hyperparameters
    num_groups: int
    shared_memory_socket: str
    server_id: str
    resumed_from_version: int
    iterations: int
    def __init__(self, model_initialized: _Optional[bool] = ..., model_version: _Optional[int] = ..., variables: _Optional[_Iterable[_Union[VariableSpec, _Mapping]]] = ..., hyperparameters: _Optional[_Union[Hyperparameters, _Mapping]] = ..., num_groups: _Optional[int] = ..., shared_memory_socket: _Optional[str] = ..., server_id: _Optional[str] = ..., resumed_from_version: _Optional[int] = ..., iterations: _Optional[int] = ...) -> None: ...

class SetHyperparametersRequest(_message.Message):
    __slots__ = ("hyperparameters", "fresh_optimizer")
    HYPERPARAMETERS_FIELD_NUMBER: _ClassVar[int]
    FRESH_OPTIMIZER_FIELD_NUMBER: _ClassVar[int]
    hyperparameters: Hyperparameters
    fresh_optimizer: bool
    def __init__(self, hyperparameters: _Optional[_Union[Hyperparameters, _Mapping]] = ..., fresh_optimizer: _Optional[bool] = ...) -> None: ...

class SetHyperparametersReply(_message.Message):
    __slots__ = ("hyperparameters",)
    HYPERPARAMETERS_FIELD_NUMBER: _ClassVar[int]
    hyperparameters: Hyperparameters
    def __init__(self, hyperparameters: _Optional[_Union[Hyperparameters, _Mapping]] = ...) -> None: ...

class SetGroupsRequest(_message.Message):
    __slots__ = ("num_groups", "assignment")
    class AssignmentEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: int
        def __init__(self, key: _Optional[int] = ..., value: _Optional[int] = ...) -> None: ...
    NUM_GROUPS_FIELD_NUMBER: _ClassVar[int]
    ASSIGNMENT_FIELD_NUMBER: _ClassVar[int]
    num_groups: int
    assignment: _containers.ScalarMap[int, int]
    def __init__(self, num_groups: _Optional[int] = ..., assignment: _Optional[_Mapping[int, int]] = ...) -> None: ...

class SetGroupsReply(_message.Message):
    __slots__ = ("num_groups", "assignment", "flushed_group_steps")
    class AssignmentEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: int
        def __init__(self, key: _Optional[int] = ..., value: _Optional[int] = ...) -> None: ...
    NUM_GROUPS_FIELD_NUMBER: _ClassVar[int]
    ASSIGNMENT_FIELD_NUMBER: _ClassVar[int]
    FLUSHED_GROUP_STEPS_FIELD_NUMBER: _ClassVar[int]
    num_groups: int
    assignment: _containers.ScalarMap[int, int]
    flushed_group_steps: int
    def __init__(self, num_groups: _Optional[int] = ..., assignment: _Optional[_Mapping[int, int]] = ..., flushed_group_steps: _Optional[int] = ...) -> None: ...

class StatsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GroupStats(_message.Message):
    __slots__ = ("group", "members", "updates_applied", "staleness_histogram", "next_batch", "next_members")
    class StalenessHistogramEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: int
        def __init__(self, key: _Optional[int] = ..., value: _Optional[int] = ...) -> None: ...
    GROUP_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    UPDATES_APPLIED_FIELD_NUMBER: _ClassVar[int]
    STALENESS_HISTOGRAM_FIELD_NUMBER: _ClassVar[int]
    NEXT_BATCH_FIELD_NUMBER: _ClassVar[int]
    NEXT_MEMBERS_FIELD_NUMBER: _ClassVar[int]
    group: int
    members: _containers.RepeatedScalarFieldContainer[int]
    updates_applied: int
    staleness_histogram: _containers.ScalarMap[int, int]
    next_batch: int
    next_members: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, group: _Optional[int] = ..., members: _Optional[_Iterable[int]] = ..., updates_applied: _Optional[int] = ..., staleness_histogram: _Optional[_Mapping[int, int]] = ..., next_batch: _Optional[int] = ..., next_members: _Optional[_Iterable[int]] = ...) -> None: ...

class StatsReply(_message.Message):
    __slots__ = ("model_version", "updates_applied", "pushes_received", "pushes_rejected_non_finite", "workers_dropped", "parameter_count", "parameter_bytes", "hyperparameters", "groups", "mean_apply_seconds", "uptime_seconds", "total_momentum", "momentum_in_force", "learning_rate_in_force", "implicit_momentum", "step_backoffs", "step_share", "chief_history_json", "trainings_ended", "chief_batch", "stop_requested")
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    UPDATES_APPLIED_FIELD_NUMBER: _ClassVar[int]
    PUSHES_RECEIVED_FIELD_NUMBER: _ClassVar[int]
    PUSHES_REJECTED_NON_FINITE_FIELD_NUMBER: _ClassVar[int]
    WORKERS_DROPPED_FIELD_NUMBER: _ClassVar[int]
    PARAMETER_COUNT_FIELD_NUMBER: _ClassVar[int]
    PARAMETER_BYTES_FIELD_NUMBER: _ClassVar[int]
    HYPERPARAMETERS_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    MEAN_APPLY_SECONDS_FIELD_NUMBER: _ClassVar[int]
    UPTIME_SECONDS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_MOMENTUM_FIELD_NUMBER: _ClassVar[int]
    MOMENTUM_IN_FORCE_FIELD_NUMBER: _ClassVar[int]
    LEARNING_RATE_IN_FORCE_FIELD_NUMBER: _ClassVar[int]
    IMPLICIT_MOMENTUM_FIELD_NUMBER: _ClassVar[int]
    STEP_BACKOFFS_FIELD_NUMBER: _ClassVar[int]
    STEP_SHARE_FIELD_NUMBER: _ClassVar[int]
    CHIEF_HISTORY_JSON_FIELD_NUMBER: _ClassVar[int]
    TRAININGS_ENDED_FIELD_NUMBER: _ClassVar[int]
    CHIEF_BATCH_FIELD_NUMBER: _ClassVar[int]
    STOP_REQUESTED_FIELD_NUMBER: _ClassVar[int]
    model_version: int
    updates_applied: int
    pushes_received: int
    pushes_rejected_non_finite: int
    workers_dropped: int
    parameter_count: int
    parameter_bytes: int
    hyperparameters: Hyperparameters
    groups: _containers.RepeatedCompositeFieldContainer[GroupStats]
    mean_apply_seconds: float
    uptime_seconds: float
    total_momentum: float
    momentum_in_force: float
    learning_rate_in_force: float
    implicit_momentum: float
    step_backoffs: int
    step_share: float
    chief_history_json: str
    trainings_ended: int
    chief_batch: int
    stop_requested: bool
    def __init__(self, model_version: _Optional[int] = ..., updates_applied: _Optional[int] = ..., pushes_received: _Optional[int] = ..., pushes_rejected_non_finite: _Optional[int] = ..., workers_dropped: _Optional[int] = ..., parameter_count: _Optional[int] = ..., parameter_bytes: _Optional[int] = ..., hyperparameters: _Optional[_Union[Hyperparameters, _Mapping]] = ..., groups: _Optional[_Iterable[_Union[GroupStats, _Mapping]]] = ..., mean_apply_seconds: _Optional[float] = ..., uptime_seconds: _Optional[float] = ..., total_momentum: _Optional[float] = ..., momentum_in_force: _Optional[float] = ..., learning_rate_in_force: _Optional[float] = ..., implicit_momentum: _Optional[float] = ..., step_backoffs: _Optional[int] = ..., step_share: _Optional[float] = ..., chief_history_json: _Optional[str] = ..., trainings_ended: _Optional[int] = ..., chief_batch: _Optional[int] = ..., stop_requested: _Optional[bool] = ...) -> None: ...

class SnapshotRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class SnapshotReply(_message.Message):
    __slots__ = ("model_version",)
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    model_version: int
    def __init__(self, model_version: _Optional[int] = ...) -> None: ...

class SetWeightsRequest(_message.Message):
    __slots__ = ("chunk",)
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    chunk: TensorChunk
    def __init__(self, chunk: _Optional[_Union[TensorChunk, _Mapping]] = ...) -> None: ...

class SetWeightsReply(_message.Message):
    __slots__ = ("model_version",)
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    model_version: int
    def __init__(self, model_version: _Optional[int] = ...) -> None: ...

class ReplaceModelRequest(_message.Message):
    __slots__ = ("header", "chunk")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    header: ReplaceModelHeader
    chunk: TensorChunk
    def __init__(self, header: _Optional[_Union[ReplaceModelHeader, _Mapping]] = ..., chunk: _Optional[_Union[TensorChunk, _Mapping]] = ...) -> None: ...

class ReplaceModelHeader(_message.Message):
    __slots__ = ("hyperparameters", "fresh_optimizer")
    HYPERPARAMETERS_FIELD_NUMBER: _ClassVar[int]
    FRESH_OPTIMIZER_FIELD_NUMBER: _ClassVar[int]
    hyperparameters: Hyperparameters
    fresh_optimizer: bool
    def __init__(self, hyperparameters: _Optional[_Union[Hyperparameters, _Mapping]] = ..., fresh_optimizer: _Optional[bool] = ...) -> None: ...

class ReplaceModelReply(_message.Message):
    __slots__ = ("model_version",)
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    model_version: int
    def __init__(self, model_version: _Optional[int] = ...) -> None: ...

class SetFrozenWeightsRequest(_message.Message):
    __slots__ = ("chunk",)
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    chunk: TensorChunk
    def __init__(self, chunk: _Optional[_Union[TensorChunk, _Mapping]] = ...) -> None: ...

class SetFrozenWeightsReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetFrozenWeightsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetFrozenWeightsReply(_message.Message):
    __slots__ = ("chunk",)
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    chunk: TensorChunk
    def __init__(self, chunk: _Optional[_Union[TensorChunk, _Mapping]] = ...) -> None: ...

class RequestStopRequest(_message.Message):
    __slots__ = ("history_json",)
    HISTORY_JSON_FIELD_NUMBER: _ClassVar[int]
    history_json: str
    def __init__(self, history_json: _Optional[str] = ...) -> None: ...

class RequestStopReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class CheckpointRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class CheckpointReply(_message.Message):
    __slots__ = ("path", "model_version")
    PATH_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    path: str
    model_version: int
    def __init__(self, path: _Optional[str] = ..., model_version: _Optional[int] = ...) -> None: ...

class SharedMemoryHello(_message.Message):
    __slots__ = ("worker_id", "token", "server_id", "layout_digest")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    SERVER_ID_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_DIGEST_FIELD_NUMBER: _ClassVar[int]
    worker_id: int
    token: str
    server_id: str
    layout_digest: bytes
    def __init__(self, worker_id: _Optional[int] = ..., token: _Optional[str] = ..., server_id: _Optional[str] = ..., layout_digest: _Optional[bytes] = ...) -> None: ...

class SharedMemoryReply(_message.Message):
    __slots__ = ("push", "model_version", "code", "message", "refusal")
    PUSH_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    REFUSAL_FIELD_NUMBER: _ClassVar[int]
    push: PushReply
    model_version: int
    code: int
    message: str
    refusal: Refusal
    def __init__(self, push: _Optional[_Union[PushReply, _Mapping]] = ..., model_version: _Optional[int] = ..., code: _Optional[int] = ..., message: _Optional[str] = ..., refusal: _Optional[_Union[Refusal, str]] = ...) -> None: ...
