// longctx._longctx: the extension module under the Python package (python/longctx/). A thin
// binding: every computation is the C++ engine's or the block-causal op's.
#include <pybind11/pybind11.h>

#include <exception>

#include "binding.h"
#include "longctx/core/error.h"

namespace longctx::python {
namespace {

// Created once at import; the translator raises them.
PyObject* g_engine_error = nullptr;
PyObject* g_invalid_argument = nullptr;
PyObject* g_not_found = nullptr;
PyObject* g_unsupported = nullptr;
PyObject* g_out_of_memory = nullptr;

PyObject* new_exception(py::module_& m, const char* name, const char* doc, PyObject* bases) {
  std::string qualified = std::string("longctx.") + name;
  PyObject* cls = PyErr_NewExceptionWithDoc(qualified.c_str(), doc, bases, nullptr);
  if (!cls) throw py::error_already_set();
  m.add_object(name, py::handle(cls));  // the module keeps a reference
  return cls;
}

PyObject* exception_for(ErrorCode code) {
  switch (code) {
    case ErrorCode::kInvalidArgument:
    case ErrorCode::kOutOfRange:
      return g_invalid_argument;
    case ErrorCode::kNotFound:
      return g_not_found;
    case ErrorCode::kUnsupported:
      return g_unsupported;
    case ErrorCode::kOutOfMemory:
      return g_out_of_memory;
    default:
      return g_engine_error;
  }
}

}  // namespace

py::object exception_object(const Error& error) {
  return py::reinterpret_borrow<py::object>(exception_for(error.code()))(error.what());
}

void register_errors(py::module_& m) {
  g_engine_error = new_exception(m, "EngineError",
                                 "An error the longctx engine raised; the message is the engine's.",
                                 PyExc_RuntimeError);
  auto pair = [](PyObject* a, PyObject* b) {
    return py::make_tuple(py::handle(a), py::handle(b)).release().ptr();
  };
  g_invalid_argument =
      new_exception(m, "InvalidArgumentError",
                    "A malformed argument or a value out of range (also a ValueError).",
                    pair(g_engine_error, PyExc_ValueError));
  g_not_found = new_exception(m, "NotFoundError", "A missing file, tensor or key.",
                              pair(g_engine_error, PyExc_LookupError));
  g_unsupported = new_exception(m, "UnsupportedError",
                                "Well-formed but not supported (architecture, dtype, device).",
                                pair(g_engine_error, PyExc_NotImplementedError));
  g_out_of_memory = new_exception(m, "OutOfMemoryError", "An allocation past a memory budget.",
                                  pair(g_engine_error, PyExc_MemoryError));
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const Error& e) {
      PyErr_SetString(exception_for(e.code()), e.what());
    }
  });
}

}  // namespace longctx::python

PYBIND11_MODULE(_longctx, m) {
  namespace lp = longctx::python;
  m.doc() = "longctx's C++ engine and block-causal op (use the `longctx` package, not this).";
  m.attr("__version__") = LONGCTX_VERSION;
#if LONGCTX_WITH_CUDA
  m.attr("built_with_cuda") = true;
#else
  m.attr("built_with_cuda") = false;
#endif
  lp::register_errors(m);
  lp::register_dlpack(m);
  lp::register_engine(m);
  lp::register_ops(m);
}
