"""The gRPC face of the parameter server: turns messages into `GroupCoordinator` calls and
`ParameterServerError`s into gRPC statuses."""

import collections
import dataclasses
import functools
import logging
import pathlib
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TypeVar

import grpc
import numpy as np
from google.protobuf.message import Message

from omnikeras.parameter_server import tensors
from omnikeras.parameter_server.buffer_layout import BufferLayout, FlatArrays
from omnikeras.parameter_server.buffer_pool import BufferPool
from omnikeras.parameter_server.errors import (
    REFUSAL_KEY,
    FailedPrecondition,
    InvalidArgument,
    NonFinite,
    ParameterServerError,
    shown,
)
from omnikeras.parameter_server.groups import GroupCoordinator
from omnikeras.parameter_server.update_rule import Hyperparameters
from omnikeras.parameter_server.values import Description, PushResult
from omnikeras.v1 import parameter_server_pb2 as pb
from omnikeras.v1 import parameter_server_pb2_grpc as pb_grpc

logger = logging.getLogger(__name__)

_Handler = TypeVar("_Handler", bound=Callable)
_SERVICE = pb.DESCRIPTOR.services_by_name["ParameterServer"]
# Gradients kept for reuse: as many as pushes over gRPC are usually in flight at once.
_SPARE_GRADIENTS = 8
# The longest a pull may wait for the model: every wait has a deadline.
MAX_WAIT_SECONDS = 3600.0
# The longest chief's History a server keeps (`RequestStopRequest.history_json`).
MAX_HISTORY_CHARS = 1 << 20


def _status_on_error(method: _Handler) -> _Handler:
    """Aborts the call with the error's gRPC status; the server's state is untouched."""

    @functools.wraps(method)
    def wrapper(self, request, context):  # type: ignore[no-untyped-def]
        try:
            result = method(self, request, context)
            if isinstance(result, Iterator):
                # Streaming replies raise while being iterated, inside gRPC's loop.
                return _abort_on_error(result, context)
            return result
        except ParameterServerError as error:
            _abort(context, error)

    return wrapper  # type: ignore[return-value]


def _abort_on_error(replies: Iterator, context: grpc.ServicerContext) -> Iterator:
    try:
        yield from replies
    except ParameterServerError as error:
        _abort(context, error)


def _abort(context: grpc.ServicerContext, error: ParameterServerError) -> None:
    if error.refusal:
        context.set_trailing_metadata(((REFUSAL_KEY, str(int(error.refusal))),))
    context.abort(error.code, str(error))


class ParameterServerServicer(pb_grpc.ParameterServerServicer):
    def __init__(
        self,
        coordinator: GroupCoordinator,
        server_id: str,
        save_checkpoint: Callable[[], tuple[pathlib.Path, int]] | None = None,
        shared_memory_socket: str = "",
    ) -> None:
        self.coordinator = coordinator
        self.server_id = server_id
        self.save_checkpoint = save_checkpoint
        self.shared_memory_socket = shared_memory_socket
        self._started = time.monotonic()
        self._gradient_buffers = BufferPool(_SPARE_GRADIENTS)

    @_status_on_error
    def Register(self, request: pb.RegisterRequest, context: grpc.ServicerContext) -> pb.RegisterReply:
        worker_id, group = self.coordinator.register(request.worker_id, request.group, request.host, request.chief)
        model = self.coordinator.model
        logger.info("worker %d (%s) joined group %d", worker_id, shown(request.host or context.peer()), group)
        return pb.RegisterReply(
            worker_id=worker_id,
            group=group,
            num_groups=self.coordinator.num_groups,
            model_version=model.version,
            model_initialized=model.initialized,
            hyperparameters=self.coordinator.hyperparameters().to_proto(),
            server_id=self.server_id,
        )

    @_status_on_error
    def Deregister(self, request: pb.DeregisterRequest, context: grpc.ServicerContext) -> pb.DeregisterReply:
        self.coordinator.deregister(request.worker_id)
        logger.info("worker %d left", request.worker_id)
        return pb.DeregisterReply()

    @_status_on_error
    def InitModel(self, request_iterator: Iterator[tensors.Received[pb.InitModelRequest]], context: grpc.ServicerContext) -> pb.InitModelReply:
        first = next(request_iterator, None)
        if first is None or not first.message.HasField("hyperparameters"):
            raise InvalidArgument("InitModel must start with the hyperparameters")
        hyperparameters = Hyperparameters.from_proto(first.message.hyperparameters)
        if self.coordinator.model.initialized:
            # Another worker, or a checkpoint, came first: the weights are not read.
            return pb.InitModelReply(model_version=self.coordinator.model.version, initialized_by_caller=False)
        weights, non_finite, _ = _assemble(request_iterator)
        if not weights:
            raise InvalidArgument("InitModel carried no variables")
        if non_finite is not None:
            raise NonFinite("initial weight", non_finite)
        initialized = self.coordinator.initialize(weights, hyperparameters)
        return pb.InitModelReply(
            model_version=self.coordinator.model.version, initialized_by_caller=initialized
        )

    @_status_on_error
    def SetWeights(
        self, request_iterator: Iterator[tensors.Received[pb.SetWeightsRequest]], context: grpc.ServicerContext
    ) -> pb.SetWeightsReply:
        self.coordinator.model.require_initialized()
        weights, non_finite, _ = _assemble(request_iterator, expected=self.coordinator.model.specs)
        if non_finite is not None:
            raise NonFinite("weight", non_finite)
        version = self.coordinator.set_weights(weights)
        logger.info("weights set by a worker as version %d", version)
        self._save_after_replacing()
        return pb.SetWeightsReply(model_version=version)

    @_status_on_error
    def ReplaceModel(
        self, request_iterator: Iterator[tensors.Received[pb.ReplaceModelRequest]], context: grpc.ServicerContext
    ) -> pb.ReplaceModelReply:
        first = next(request_iterator, None)
        if first is None or not first.message.HasField("header"):
            raise InvalidArgument("ReplaceModel must start with its header")
        header = first.message.header
        hyperparameters = Hyperparameters.from_proto(header.hyperparameters)
        self.coordinator.model.require_initialized()
        weights, non_finite, _ = _assemble(request_iterator)
        if not weights:
            raise InvalidArgument("ReplaceModel carried no variables")
        if non_finite is not None:
            raise NonFinite("weight", non_finite)
        version = self.coordinator.replace_model(weights, hyperparameters, header.fresh_optimizer)
        logger.info("the model's variables replaced by a worker's, %d of them, as version %d", len(weights), version)
        self._save_after_replacing()
        return pb.ReplaceModelReply(model_version=version)

    @_status_on_error
    def SetFrozenWeights(
        self, request_iterator: Iterator[tensors.Received[pb.SetFrozenWeightsRequest]], context: grpc.ServicerContext
    ) -> pb.SetFrozenWeightsReply:
        weights, non_finite, _ = _assemble(request_iterator)
        if non_finite is not None:
            raise NonFinite("frozen weight", non_finite)
        self.coordinator.set_frozen_weights(weights)
        logger.info("frozen weights set by a worker, %d of them", len(weights))
        if self.coordinator.model.initialized:
            self._save_after_replacing()
        return pb.SetFrozenWeightsReply()

    @_status_on_error
    def GetFrozenWeights(
        self, request: pb.GetFrozenWeightsRequest, context: grpc.ServicerContext
    ) -> Iterator[bytes]:
        return tensors.encode_messages(pb.GetFrozenWeightsReply, self.coordinator.frozen_weights())

    @_status_on_error
    def Describe(self, request: pb.DescribeRequest, context: grpc.ServicerContext) -> pb.DescribeReply:
        model = self.coordinator.model
        return Description(
            model_initialized=model.initialized,
            model_version=model.version,
            variables=tuple(model.specs.values()),
            hyperparameters=self.coordinator.hyperparameters(),
            num_groups=self.coordinator.num_groups,
            shared_memory_socket=self.shared_memory_socket,
            server_id=self.server_id,
            resumed_from_version=self.coordinator.resumed_from_version,
            iterations=model.iterations,
        ).to_proto()

    @_status_on_error
    def Push(self, request_iterator: Iterator[tensors.Received[pb.PushRequest]], context: grpc.ServicerContext) -> pb.PushReply:
        return self._push(request_iterator, context).to_proto()

    @_status_on_error
    def Pull(self, request: pb.PullRequest, context: grpc.ServicerContext) -> Iterator[pb.PullReply | bytes]:
        if not 0 <= request.wait_for_model_seconds <= MAX_WAIT_SECONDS:
            raise InvalidArgument(f"wait_for_model_seconds must lie in [0, {MAX_WAIT_SECONDS}]")
        if request.wait_for_model_seconds > 0:
            self.coordinator.wait_for_model(request.wait_for_model_seconds, caller_gone=lambda: not context.is_active())
        version, chunks = self.coordinator.weights_newer_than(request.newer_than)
        return _weights(version, chunks, push=None)

    @_status_on_error
    def PushPull(self, request_iterator: Iterator[tensors.Received[pb.PushRequest]], context: grpc.ServicerContext) -> Iterator[pb.PullReply | bytes]:
        push = self._push(request_iterator, context)
        version, chunks = self.coordinator.weights_newer_than(-1)
        return _weights(version, chunks, push=push)

    @_status_on_error
    def SetHyperparameters(self, request: pb.SetHyperparametersRequest, context: grpc.ServicerContext) -> pb.SetHyperparametersReply:
        hyperparameters = Hyperparameters.from_proto(request.hyperparameters)
        self.coordinator.set_hyperparameters(hyperparameters, fresh_optimizer=request.fresh_optimizer)
        logger.info("hyperparameters set to %s%s", hyperparameters, ", afresh" if request.fresh_optimizer else "")
        return pb.SetHyperparametersReply(hyperparameters=hyperparameters.to_proto())

    @_status_on_error
    def SetGroups(self, request: pb.SetGroupsRequest, context: grpc.ServicerContext) -> pb.SetGroupsReply:
        num_groups, assignment, flushed = self.coordinator.set_groups(
            request.num_groups, dict(request.assignment)
        )
        logger.info("regrouped into %d groups: %s", num_groups, assignment)
        return pb.SetGroupsReply(num_groups=num_groups, assignment=assignment, flushed_group_steps=flushed)

    @_status_on_error
    def GetStats(self, request: pb.StatsRequest, context: grpc.ServicerContext) -> pb.StatsReply:
        stats = dataclasses.replace(self.coordinator.stats(), uptime_seconds=time.monotonic() - self._started)
        return stats.to_proto()

    @_status_on_error
    def RequestStop(self, request: pb.RequestStopRequest, context: grpc.ServicerContext) -> pb.RequestStopReply:
        if len(request.history_json) > MAX_HISTORY_CHARS:
            raise InvalidArgument(
                f"a History of {len(request.history_json)} characters is over the {MAX_HISTORY_CHARS} a server keeps"
            )
        self.coordinator.request_stop(request.history_json)
        logger.info("stop requested")
        return pb.RequestStopReply()

    @_status_on_error
    def SaveSnapshot(self, request: pb.SnapshotRequest, context: grpc.ServicerContext) -> pb.SnapshotReply:
        return pb.SnapshotReply(model_version=self.coordinator.save_snapshot(request.name))

    @_status_on_error
    def RestoreSnapshot(self, request: pb.SnapshotRequest, context: grpc.ServicerContext) -> pb.SnapshotReply:
        version = self.coordinator.restore_snapshot(request.name)
        logger.info("restored snapshot %r as version %d", request.name, version)
        return pb.SnapshotReply(model_version=version)

    @_status_on_error
    def DeleteSnapshot(self, request: pb.SnapshotRequest, context: grpc.ServicerContext) -> pb.SnapshotReply:
        return pb.SnapshotReply(model_version=self.coordinator.delete_snapshot(request.name))

    @_status_on_error
    def Checkpoint(self, request: pb.CheckpointRequest, context: grpc.ServicerContext) -> pb.CheckpointReply:
        if self.save_checkpoint is None:
            raise FailedPrecondition("the server was started without a checkpoint directory")
        self.coordinator.model.require_initialized()
        path, version = self.save_checkpoint()
        return pb.CheckpointReply(path=str(path), model_version=version)

    def _save_after_replacing(self) -> None:
        """Writes a checkpoint of weights a worker put in place: they are not the sum of
        updates that a restart could lose a few of, and a server resuming the variables
        replaced would refuse every push."""
        if self.save_checkpoint is not None:
            self.save_checkpoint()

    def _push(self, request_iterator: Iterator[tensors.Received[pb.PushRequest]], context: grpc.ServicerContext) -> PushResult:
        first = next(request_iterator, None)
        if first is None or not first.message.HasField("header"):
            raise InvalidArgument("a push must start with its header")
        header = first.message.header
        self.coordinator.check_pusher(header.worker_id)
        specs = self.coordinator.model.specs
        # Rebuilt in one buffer laid out as the server's weights, the gradients are
        # updated over it as a worker's segment is (see `flat_state`).
        into = self._gradient_buffers.take() or _laid_out(specs)
        gradients, non_finite, magnitudes = _assemble(request_iterator, specs, into)
        if isinstance(into, FlatArrays) and into.intact() and _rebuilt_in(gradients, into):
            gradients = into
        if non_finite is not None:
            self.coordinator.count_rejected_non_finite()
            raise NonFinite("gradient", non_finite)
        result = self.coordinator.push(
            header.worker_id,
            header.step,
            header.model_version,
            header.example_count,
            gradients,
            caller_gone=lambda: not context.is_active(),
            batch=header.batch if header.HasField("batch") else None,
            known_layout=header.known_layout_version,
            magnitudes=magnitudes,
            loss=header.loss if header.HasField("loss") else None,
            skip_update=header.skip_update,
            learning_rate=header.learning_rate if header.HasField("learning_rate") else None,
        )
        # Its group step is applied, with the gradient as scratch space, or it was a
        # retry's: the next push may rebuild its gradient here. (Not after an error: a
        # caller that went away leaves its gradient in the step still pending.)
        self._gradient_buffers.give_back(gradients)
        return result


def add_to_server(servicer: ParameterServerServicer, server: grpc.Server) -> None:
    """Registers `servicer` as the generated `add_ParameterServerServicer_to_server` does,
    except that the messages with tensor chunks are read with `tensors.decoder`, and the
    replies may be messages serialized beforehand (see `tensors.encode_messages`)."""
    handlers = {}
    for method in _SERVICE.methods:
        request_type = getattr(pb, method.input_type.name)
        reply_type = getattr(pb, method.output_type.name)
        handler_for = _HANDLER_FOR[method.client_streaming, method.server_streaming]
        handlers[method.name] = handler_for(
            getattr(servicer, method.name),
            request_deserializer=(
                tensors.decoder(request_type) if _has_chunks(request_type) else request_type.FromString
            ),
            response_serializer=(
                tensors.serialize if _has_chunks(reply_type) else reply_type.SerializeToString
            ),
        )
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(_SERVICE.full_name, handlers),))
    server.add_registered_method_handlers(_SERVICE.full_name, handlers)


_HANDLER_FOR = {
    (False, False): grpc.unary_unary_rpc_method_handler,
    (False, True): grpc.unary_stream_rpc_method_handler,
    (True, False): grpc.stream_unary_rpc_method_handler,
    (True, True): grpc.stream_stream_rpc_method_handler,
}


def _has_chunks(message_type: type[Message]) -> bool:
    return "chunk" in message_type.DESCRIPTOR.fields_by_name


def _assemble(
    requests: Iterator[tensors.Received[pb.PushRequest]]
    | Iterator[tensors.Received[pb.InitModelRequest]]
    | Iterator[tensors.Received[pb.SetWeightsRequest]]
    | Iterator[tensors.Received[pb.ReplaceModelRequest]]
    | Iterator[tensors.Received[pb.SetFrozenWeightsRequest]],
    expected: Mapping[str, tensors.VariableSpec] | None = None,
    into: Mapping[str, np.ndarray] | None = None,
) -> tuple[dict[str, np.ndarray], str | None, dict[str, float]]:
    """The tensors of a stream (rebuilt `into` arrays of theirs where given, see
    `tensors.TensorAssembler`), the first of them that holds NaN or Inf, if any, and
    each one's sum of magnitudes (see `tensors.magnitude`).

    Each chunk is checked as it arrives, while the next ones are in flight: after the
    stream, the check would hold up the reply (by 7 ms for 100 MB).
    """
    non_finite: list[str] = []
    magnitudes: dict[str, float] = collections.defaultdict(float)

    def check(name: str, elements: np.ndarray) -> None:
        if non_finite:
            return
        magnitude = tensors.magnitude(elements)
        if magnitude is None:
            non_finite.append(name)
        else:
            magnitudes[name] += magnitude

    assembler = tensors.TensorAssembler(expected, inspect=check, into=into)
    for request in requests:
        if not request.message.HasField("chunk"):
            raise InvalidArgument("after the first message, a stream carries only tensor chunks")
        assembler.add(request.message.chunk, request.data)
    return assembler.finish(), non_finite[0] if non_finite else None, dict(magnitudes)


def _laid_out(specs: Mapping[str, tensors.VariableSpec]) -> FlatArrays:
    layout = BufferLayout.of(specs)
    return layout.arrays(np.zeros(layout.region_bytes, np.uint8))


def _rebuilt_in(arrays: Mapping[str, np.ndarray], into: Mapping[str, np.ndarray]) -> bool:
    """Whether `arrays` are `into`'s own, every one of them."""
    return arrays.keys() == into.keys() and all(arrays[name] is array for name, array in into.items())


def _weights(version: int, chunks: Iterable[bytes] | None, push: PushResult | None) -> Iterator[pb.PullReply | bytes]:
    header = pb.PullHeader(model_version=version, has_weights=chunks is not None)
    if push is not None:
        header.push.CopyFrom(push.to_proto())
    yield pb.PullReply(header=header)
    if chunks is not None:
        yield from chunks
