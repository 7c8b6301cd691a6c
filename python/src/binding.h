// Shared pieces of the extension module longctx._longctx: the registration of each part and the
// DLPack bridge between longctx::Tensor and any DLPack producer/consumer (torch, numpy, CuPy).
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <optional>

#include "longctx/core/error.h"
#include "longctx/core/tensor.h"

namespace longctx::python {

namespace py = pybind11;

// The exception classes engine errors become (longctx.EngineError and its subclasses), and the
// translator that raises them with the engine's message.
void register_errors(py::module_& m);
// An instance of the exception class `error` raises (for errors that arrive as events).
py::object exception_object(const Error& error);
void register_engine(py::module_& m);
void register_ops(py::module_& m);
void register_dlpack(py::module_& m);

// A view of `obj`'s memory (no copy) through its __dlpack__ method; `stream` is passed on to
// __dlpack__ (the consumer's CUDA stream, so the producer orders its work before it). The
// producer's deleter runs when the last view goes; it may touch Python objects (numpy's does),
// so drop the returned tensor with the GIL held.
Tensor tensor_from_dlpack(const py::object& obj, std::optional<intptr_t> stream);

// A Python object with __dlpack__ / __dlpack_device__ owning a reference to `tensor`'s storage:
// torch.from_dlpack, numpy.from_dlpack and cupy.from_dlpack take it without copying.
py::object dlpack_object(Tensor tensor);

}  // namespace longctx::python
