/* A tensor's dtype, device, shape, strides and address read through PyTorch's C++ API, for
 * run()'s C path (fast_call.c). Reading them through the tensor's Python methods takes ~28
 * calls into PyTorch's argument parser per run(), several microseconds on a slow host; here
 * one call per tensor takes nanoseconds. Built by fp8mla.attention.native against the
 * installed PyTorch (and only used by that build); the module hands fast_call.c one function
 * in a capsule named "fp8mla.tensor_fields.v1". */
#include <Python.h>
#include <torch/csrc/autograd/python_variable.h>

#include <cstdint>

#include "tensor_fields.h"

extern "C" {
/* 1: t is a tensor of at most 4 dims, its fields in f. 0: not a tensor, or its fields could
 * not be read (no Python error is left set). */
static int tensor_fields(PyObject *t, TensorFields *f) noexcept {
  try {
    if (!THPVariable_Check(t)) return 0;
    const at::Tensor &x = THPVariable_Unpack(t);
    const int64_t n = x.dim();
    if (n > 4 || !x.has_storage()) return 0;
    const c10::Device d = x.device();
    f->dtype = static_cast<int>(x.scalar_type());
    f->device = d.is_cuda() ? d.index() : d.is_cpu() ? -1 : -2;
    f->ndim = static_cast<int>(n);
    const auto sizes = x.sizes();
    const auto strides = x.strides();
    for (int64_t i = 0; i < n; ++i) {
      f->shape[i] = sizes[i];
      f->stride[i] = strides[i];
    }
    f->ptr = reinterpret_cast<uintptr_t>(x.const_data_ptr());
    return 1;
  } catch (...) {
    return 0;
  }
}
}

/* dtype_code(tensor) -> int: its c10::ScalarType, -1 for anything else */
static PyObject *dtype_code(PyObject *, PyObject *t) {
  TensorFields f;
  return PyLong_FromLong(tensor_fields(t, &f) ? f.dtype : -1);
}

static PyMethodDef methods[] = {
    {"dtype_code", dtype_code, METH_O, "dtype_code(tensor) -> int: its ScalarType code"},
    {nullptr, nullptr, 0, nullptr},
};

static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "fp8mla_fields", nullptr, -1,
                                        methods};

PyMODINIT_FUNC PyInit_fp8mla_fields(void) {
  PyObject *m = PyModule_Create(&module_def);
  if (!m) return nullptr;
  PyObject *cap = PyCapsule_New(reinterpret_cast<void *>(&tensor_fields),
                                "fp8mla.tensor_fields.v1", nullptr);
  if (!cap || PyModule_AddObject(m, "fields", cap) < 0) {
    Py_XDECREF(cap);
    Py_DECREF(m);
    return nullptr;
  }
  return m;
}
