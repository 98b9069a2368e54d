import numpy as np
import pytest

from omnikeras.parameter_server import parallel, tensors
from omnikeras.parameter_server.errors import InvalidArgument, NotFound
from omnikeras.v1 import parameter_server_pb2 as pb


def test_round_trip_across_chunk_boundaries() -> None:
    arrays = {
        "kernel": np.arange(1000, dtype=np.float32).reshape(10, 100),
        "bias": np.array([1.5, -2.0], dtype=np.float64),
        "scalar": np.array(3.0, dtype=np.float16),
        "empty": np.zeros((0, 4), dtype=np.float32),
    }
    chunks = list(tensors.encode(arrays, chunk_bytes=64))
    assert max(len(c.data) for c in chunks) == 64
    rebuilt = tensors.assemble(chunks)
    assert list(rebuilt) == list(arrays)
    for name, array in arrays.items():
        assert rebuilt[name].dtype == array.dtype
        np.testing.assert_array_equal(rebuilt[name], array)


def test_scalars_keep_their_shape_through_the_server(start_server) -> None:
    from omnikeras import Hyperparameters, ParameterServerClient

    client = ParameterServerClient([start_server().address])
    client.register()
    client.init_model({"temperature": np.array(2.0, np.float32)}, Hyperparameters(0.5))
    client.push({"temperature": np.array(1.0, np.float32)}, step=1, example_count=1)
    pulled = client.pull().weights["temperature"]
    assert pulled.shape == () and pulled == 1.5


def test_big_endian_input_travels_as_little_endian() -> None:
    array = np.arange(5, dtype=">f4")
    (chunk,) = tensors.encode({"w": array})
    assert chunk.data == np.arange(5, dtype="<f4").tobytes()


def test_unsupported_dtype_is_refused() -> None:
    with pytest.raises(ValueError, match="int32"):
        list(tensors.encode({"w": np.arange(3, dtype=np.int32)}))


def _expected() -> dict[str, tensors.VariableSpec]:
    return {"w": tensors.VariableSpec("w", np.dtype("float32"), (4,))}


def _chunk(name: str = "w", dtype: str = "float32", shape: tuple[int, ...] = (4,), data: bytes = bytes(16), offset: int = 0) -> pb.TensorChunk:
    return pb.TensorChunk(spec=pb.VariableSpec(name=name, dtype=dtype, shape=shape), offset=offset, data=data)


@pytest.mark.parametrize(
    ("chunks", "error", "message"),
    [
        ([_chunk(name="v")], NotFound, "unknown variable"),
        ([_chunk(shape=(2, 2))], InvalidArgument, r"expected float32\[4\]"),
        ([_chunk(dtype="float64", data=bytes(32))], InvalidArgument, "expected float32"),
        ([_chunk(dtype="int8")], InvalidArgument, "dtype"),
        ([_chunk(data=bytes(8))], InvalidArgument, "cut short"),
        ([_chunk(data=bytes(20))], InvalidArgument, "holds 16"),
        ([_chunk(data=bytes(8)), pb.TensorChunk(offset=4, data=bytes(8))], InvalidArgument, "expected 8"),
        ([_chunk(), _chunk()], InvalidArgument, "sent twice"),
        ([pb.TensorChunk(data=bytes(4))], InvalidArgument, "before any variable spec"),
        ([], InvalidArgument, "without variables"),
    ],
)
def test_malformed_streams_are_refused(chunks: list[pb.TensorChunk], error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        tensors.assemble(chunks, _expected())


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_all_finite_finds_every_nan_and_inf(dtype: str) -> None:
    for size in (1, 7, 64, 1001):
        assert tensors.all_finite(np.ones(size, dtype))
        for position in {0, size // 2, size - 1}:
            for value in (np.nan, np.inf, -np.inf):
                array = np.ones(size, dtype)
                array[position] = value
                assert not tensors.all_finite(array), (size, position, value)
    # Finite values whose sum overflows are still finite.
    assert tensors.all_finite(np.full(8, np.finfo(dtype).max, dtype))
    assert tensors.all_finite(np.zeros(0, dtype))
    assert not tensors.all_finite(np.array([[1.0, np.nan], [1.0, 1.0]], dtype)[:, 1])


def test_all_finite_checks_both_halves_of_a_large_array() -> None:
    array = np.ones(parallel.SPLIT_ELEMENTS + 1, np.float32)
    assert tensors.all_finite(array)
    for position in (0, array.size // 2 - 1, array.size // 2, array.size - 1):
        array[position] = np.nan
        assert not tensors.all_finite(array), position
        array[position] = 1.0


def test_the_magnitude_of_float16_values_is_summed_without_overflow() -> None:
    # 70,000 ones: their sum passes float16's largest value (65,504); the update guard
    # would take it for a magnitude near the limit.
    assert tensors.magnitude(np.ones(70_000, np.float16)) == 70_000
    assert tensors.magnitude(np.array([1, np.nan], np.float16)) is None


def test_an_assembler_rebuilds_into_the_arrays_it_is_given_where_they_fit() -> None:
    weights = {"w": np.arange(300_000, dtype=np.float32), "b": np.arange(3, dtype=np.float32)}
    reused = np.zeros(300_000, np.float32)
    # A wrong shape and a read-only array are not written into.
    wrong_shape = np.zeros(4, np.float32)
    assembler = tensors.TensorAssembler(into={"w": reused, "b": wrong_shape})
    for chunk in tensors.encode(weights, chunk_bytes=1 << 16):
        assembler.add(chunk)
    arrays = assembler.finish()
    assert arrays["w"] is reused and arrays["b"] is not wrong_shape
    np.testing.assert_array_equal(reused, weights["w"])
    np.testing.assert_array_equal(arrays["b"], weights["b"])
    read_only = np.zeros(3, np.float32)
    read_only.flags.writeable = False
    assembler = tensors.TensorAssembler(into={"b": read_only})
    for chunk in tensors.encode({"b": weights["b"]}):
        assembler.add(chunk)
    assert assembler.finish()["b"] is not read_only and not read_only.any()
