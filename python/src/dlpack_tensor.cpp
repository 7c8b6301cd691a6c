// The DLPack bridge (the protocol of the Python array API standard): a producer's __dlpack__
// returns a PyCapsule named "dltensor" holding a DLManagedTensor; the consumer renames it
// "used_dltensor" and calls the tensor's deleter when it no longer needs the memory.
#include <dlpack/dlpack.h>

#include <memory>
#include <utility>
#include <vector>

#include "binding.h"
#include "longctx/core/error.h"

namespace longctx::python {
namespace {

constexpr const char* kCapsuleName = "dltensor";
constexpr const char* kUsedCapsuleName = "used_dltensor";

DType dtype_from_dlpack(const DLDataType& t) {
  LONGCTX_CHECK(t.lanes == 1, ErrorCode::kUnsupported, "DLPack tensor with {} lanes", t.lanes);
  if (t.code == kDLFloat && t.bits == 32) return DType::kF32;
  if (t.code == kDLFloat && t.bits == 16) return DType::kF16;
  if (t.code == kDLBfloat && t.bits == 16) return DType::kBF16;
  if (t.code == kDLInt && t.bits == 32) return DType::kI32;
  if (t.code == kDLInt && t.bits == 64) return DType::kI64;
  if (t.code == kDLUInt && t.bits == 8) return DType::kU8;
  throw Error(ErrorCode::kUnsupported,
              LONGCTX_FORMAT("DLPack dtype (code {}, {} bits) is not one longctx takes (float32, "
                             "float16, bfloat16, int32, int64, uint8)",
                             int(t.code), int(t.bits)));
}

DLDataType dtype_to_dlpack(DType d) {
  switch (d) {
    case DType::kF32:
      return {kDLFloat, 32, 1};
    case DType::kF16:
      return {kDLFloat, 16, 1};
    case DType::kBF16:
      return {kDLBfloat, 16, 1};
    case DType::kI32:
      return {kDLInt, 32, 1};
    case DType::kI64:
      return {kDLInt, 64, 1};
    case DType::kU8:
      return {kDLUInt, 8, 1};
    case DType::kFP8E4M3:
      throw Error(ErrorCode::kUnsupported, "fp8_e4m3 tensors are not exported through DLPack");
  }
  throw Error(ErrorCode::kInternal, "unknown dtype");
}

// What a DLManagedTensor we export owns: the tensor (its storage) and the shape/stride arrays.
struct ExportContext {
  Tensor tensor;
  std::vector<int64_t> shape, strides;
  DLManagedTensor managed{};
};

void delete_export(DLManagedTensor* self) { delete static_cast<ExportContext*>(self->manager_ctx); }

// An unconsumed capsule still owns its tensor.
void capsule_destructor(PyObject* capsule) {
  if (!PyCapsule_IsValid(capsule, kCapsuleName)) return;  // consumed (renamed)
  auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, kCapsuleName));
  if (managed && managed->deleter) managed->deleter(managed);
}

class DLPackTensor {
 public:
  explicit DLPackTensor(Tensor t) : tensor_(std::move(t)) {}

  py::capsule dlpack(const py::object& stream) const {
    (void)stream;  // the op ran on the caller's stream: nothing to order
    auto ctx = std::make_unique<ExportContext>();
    ctx->tensor = tensor_;
    ctx->shape = tensor_.shape();
    ctx->strides = tensor_.strides();
    DLTensor& dl = ctx->managed.dl_tensor;
    dl.data = tensor_.data_ptr();
    dl.device = device();
    dl.ndim = int32_t(ctx->shape.size());
    dl.dtype = dtype_to_dlpack(tensor_.dtype());
    dl.shape = ctx->shape.data();
    dl.strides = ctx->strides.data();
    dl.byte_offset = 0;
    ctx->managed.manager_ctx = ctx.get();
    ctx->managed.deleter = delete_export;
    DLManagedTensor* managed = &ctx.release()->managed;
    PyObject* cap = PyCapsule_New(managed, kCapsuleName, capsule_destructor);
    if (!cap) {
      delete_export(managed);
      throw py::error_already_set();
    }
    return py::reinterpret_steal<py::capsule>(cap);
  }

  DLDevice device() const {
    const Device d = tensor_.device();
    return d.is_cuda() ? DLDevice{kDLCUDA, d.index} : DLDevice{kDLCPU, 0};
  }
  py::tuple dlpack_device() const {
    DLDevice d = device();
    return py::make_tuple(int(d.device_type), d.device_id);
  }
  const Tensor& tensor() const { return tensor_; }

 private:
  Tensor tensor_;
};

}  // namespace

Tensor tensor_from_dlpack(const py::object& obj, std::optional<intptr_t> stream) {
  LONGCTX_CHECK(py::hasattr(obj, "__dlpack__"), ErrorCode::kInvalidArgument,
                "expected a tensor with __dlpack__ (torch, numpy, CuPy), got {}",
                std::string(py::str(py::type::of(obj).attr("__name__"))));
  py::object cap_obj =
      stream ? obj.attr("__dlpack__")(py::arg("stream") = *stream) : obj.attr("__dlpack__")();
  PyObject* cap = cap_obj.ptr();
  LONGCTX_CHECK(PyCapsule_IsValid(cap, kCapsuleName), ErrorCode::kInvalidArgument,
                "__dlpack__ did not return an unused 'dltensor' capsule");
  auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(cap, kCapsuleName));
  // From here the memory is ours to release.
  if (PyCapsule_SetName(cap, kUsedCapsuleName) != 0) throw py::error_already_set();
  std::shared_ptr<void> keepalive(managed, [](void* p) {
    auto* m = static_cast<DLManagedTensor*>(p);
    if (m->deleter) m->deleter(m);
  });
  const DLTensor& dl = managed->dl_tensor;
  Device device;
  if (dl.device.device_type == kDLCPU) {
    device = Device::cpu();
  } else if (dl.device.device_type == kDLCUDA) {
    device = Device::cuda(dl.device.device_id);
  } else {
    throw Error(ErrorCode::kUnsupported,
                LONGCTX_FORMAT("DLPack device type {} (longctx takes CPU and CUDA memory)",
                               int(dl.device.device_type)));
  }
  const DType dtype = dtype_from_dlpack(dl.dtype);
  Shape shape(dl.shape, dl.shape + dl.ndim);
  Shape strides = dl.strides ? Shape(dl.strides, dl.strides + dl.ndim) : Shape{};
  void* data = static_cast<char*>(dl.data) + dl.byte_offset;
  return Tensor::from_blob(data, shape, dtype, device, std::move(keepalive), strides);
}

py::object dlpack_object(Tensor tensor) { return py::cast(DLPackTensor(std::move(tensor))); }

void register_dlpack(py::module_& m) {
  py::class_<DLPackTensor>(m, "DLPackTensor",
                           "A longctx tensor handed out through DLPack: pass it to "
                           "torch.from_dlpack / numpy.from_dlpack (no copy).")
      .def("__dlpack__", &DLPackTensor::dlpack, py::arg("stream") = py::none(),
           "__dlpack__(stream=None) -> PyCapsule")
      .def("__dlpack_device__", &DLPackTensor::dlpack_device,
           "__dlpack_device__() -> (device_type, device_id)")
      .def_property_readonly(
          "shape", [](const DLPackTensor& t) { return py::tuple(py::cast(t.tensor().shape())); })
      .def_property_readonly("dtype", [](const DLPackTensor& t) {
        return std::string(dtype_name(t.tensor().dtype()));
      });
}

}  // namespace longctx::python
