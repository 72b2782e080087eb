/* Kernel launches with their arguments bound once (fp8mla.attention.native): the driver, the
 * Launch type and launch(). The extension is tensor_fields.h, this file, fast_call.c and
 * module.c, built as one source in that order.
 *
 * A Launch holds one compiled kernel's CUDA function, grid, block, shared memory, the
 * programmatic-dependency flag and a parameter block: every kernel parameter in an 8-byte
 * slot, filled from the plan's values when the Launch is made. A call writes only its own
 * values (the call's tensors' addresses, strides, lengths) into their slots and launches with
 * cuLaunchKernelEx: no argument parsing of the other ~40 parameters, no Python between the
 * two launches of a split plan (attention, then the merge), and the GIL held throughout (so
 * two threads never interleave the fill and the launch of one Launch).
 *
 * Slot kinds: 'p' pointer (uint64), 'L' int64, 'i' int32, 'I' uint32, 'b' int8, 'B' uint8,
 * 'f' float32 (a Python float or int). A value outside its kind's range raises
 * OverflowError before anything is launched.
 */
#include "cuda.h"
#include <dlfcn.h>
#include <stdint.h>
#include <string.h>
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#define MAX_PARAMS 128

typedef CUresult (*launch_ex_fn)(const CUlaunchConfig *, CUfunction, void **, void **);
typedef CUresult (*ctx_get_fn)(CUcontext *);
typedef CUresult (*err_str_fn)(CUresult, const char **);

static launch_ex_fn cu_launch_ex = NULL;
static ctx_get_fn cu_ctx_get = NULL;
static err_str_fn cu_err_str = NULL;

static int load_driver(void) {
  if (cu_launch_ex) return 0;
  void *lib = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
  if (!lib) {
    PyErr_SetString(PyExc_RuntimeError, "expected the CUDA driver (libcuda.so.1), got none");
    return -1;
  }
  launch_ex_fn l = (launch_ex_fn)dlsym(lib, "cuLaunchKernelEx");
  cu_ctx_get = (ctx_get_fn)dlsym(lib, "cuCtxGetCurrent");
  cu_err_str = (err_str_fn)dlsym(lib, "cuGetErrorString");
  if (!l || !cu_ctx_get || !cu_err_str) {
    PyErr_SetString(PyExc_RuntimeError, "expected cuLaunchKernelEx in libcuda.so.1, got none");
    return -1;
  }
  cu_launch_ex = l;
  return 0;
}

typedef struct {
  PyObject_HEAD
  CUlaunchConfig config;
  CUlaunchAttribute attrs[2];
  CUfunction function;
  int nparams;
  Py_ssize_t ncall;
  char kinds[MAX_PARAMS];
  short slot[MAX_PARAMS]; /* call value i -> parameter index; -1: not a parameter */
  uint64_t storage[MAX_PARAMS];
  void *params[MAX_PARAMS];
} Launch;

/* Write ``obj`` as ``kind`` into ``dst`` (an 8-byte slot, zeroed above the value). */
static int store(char kind, PyObject *obj, uint64_t *dst) {
  uint64_t bits = 0;
  if (obj == Py_None) {
    *dst = 0;
    return 0;
  }
  switch (kind) {
  case 'p': {
    unsigned long long v = PyLong_AsUnsignedLongLong(obj);
    if (v == (unsigned long long)-1 && PyErr_Occurred()) return -1;
    bits = v;
    break;
  }
  case 'L': {
    long long v = PyLong_AsLongLong(obj);
    if (v == -1 && PyErr_Occurred()) return -1;
    memcpy(&bits, &v, 8);
    break;
  }
  case 'i':
  case 'I':
  case 'b':
  case 'B': {
    long long v = PyLong_AsLongLong(obj);
    if (v == -1 && PyErr_Occurred()) return -1;
    long long lo = kind == 'i' ? INT32_MIN : kind == 'b' ? INT8_MIN : 0;
    long long hi = kind == 'i' ? INT32_MAX : kind == 'I' ? UINT32_MAX : kind == 'b' ? INT8_MAX : UINT8_MAX;
    if (v < lo || v > hi) {
      PyErr_Format(PyExc_OverflowError, "expected a value in [%lld, %lld] for a '%c' parameter, got %lld", lo, hi, kind, v);
      return -1;
    }
    if (kind == 'i') {
      int32_t w = (int32_t)v;
      memcpy(&bits, &w, 4);
    } else if (kind == 'I') {
      uint32_t w = (uint32_t)v;
      memcpy(&bits, &w, 4);
    } else {
      uint8_t w = (uint8_t)(int8_t)v;
      memcpy(&bits, &w, 1);
    }
    break;
  }
  case 'f': {
    double v = PyFloat_AsDouble(obj);
    if (v == -1.0 && PyErr_Occurred()) return -1;
    float w = (float)v;
    memcpy(&bits, &w, 4);
    break;
  }
  default:
    PyErr_Format(PyExc_ValueError, "expected a parameter kind in pLiIbBf, got '%c'", kind);
    return -1;
  }
  *dst = bits;
  return 0;
}

static int Launch_init(Launch *self, PyObject *args, PyObject *kw) {
  unsigned long long function;
  unsigned int gx, gy, gz, block, smem;
  int pdl, cooperative = 0;
  const char *kinds;
  Py_ssize_t nkinds;
  PyObject *values, *slots;
  if (!PyArg_ParseTuple(args, "K(III)IIps#OO|p", &function, &gx, &gy, &gz, &block, &smem, &pdl,
                        &kinds, &nkinds, &values, &slots, &cooperative))
    return -1;
  if (nkinds > MAX_PARAMS) {
    PyErr_Format(PyExc_ValueError, "expected at most %d parameters, got %zd", MAX_PARAMS, nkinds);
    return -1;
  }
  PyObject *vals = PySequence_Fast(values, "expected a sequence of parameter values");
  if (!vals) return -1;
  PyObject *sl = PySequence_Fast(slots, "expected a sequence of call slots");
  if (!sl) {
    Py_DECREF(vals);
    return -1;
  }
  int rc = -1;
  if (PySequence_Fast_GET_SIZE(vals) != nkinds) {
    PyErr_Format(PyExc_ValueError, "expected %zd parameter values, got %zd", nkinds, PySequence_Fast_GET_SIZE(vals));
    goto done;
  }
  if (PySequence_Fast_GET_SIZE(sl) > MAX_PARAMS) {
    PyErr_Format(PyExc_ValueError, "expected at most %d call values", MAX_PARAMS);
    goto done;
  }
  memset(self->storage, 0, sizeof(self->storage));
  self->nparams = (int)nkinds;
  for (Py_ssize_t k = 0; k < nkinds; ++k) {
    self->kinds[k] = kinds[k];
    self->params[k] = &self->storage[k];
    if (store(kinds[k], PySequence_Fast_GET_ITEM(vals, k), &self->storage[k]) < 0) goto done;
  }
  self->ncall = PySequence_Fast_GET_SIZE(sl);
  for (Py_ssize_t i = 0; i < self->ncall; ++i) {
    long s = PyLong_AsLong(PySequence_Fast_GET_ITEM(sl, i));
    if (s == -1 && PyErr_Occurred()) goto done;
    if (s < -1 || s >= nkinds) {
      PyErr_Format(PyExc_ValueError, "expected call slots in [-1, %zd), got %ld", nkinds, s);
      goto done;
    }
    self->slot[i] = (short)s;
  }
  self->function = (CUfunction)(uintptr_t)function;
  memset(&self->config, 0, sizeof(self->config));
  self->config.gridDimX = gx;
  self->config.gridDimY = gy;
  self->config.gridDimZ = gz;
  self->config.blockDimX = block;
  self->config.blockDimY = 1;
  self->config.blockDimZ = 1;
  self->config.sharedMemBytes = smem;
  /* the launch attributes Triton's launcher sets for the kernel's metadata: programmatic
     dependent launch, and a cooperative grid (all its blocks resident at once) */
  memset(self->attrs, 0, sizeof(self->attrs));
  unsigned int nattrs = 0;
  if (pdl) {
    self->attrs[nattrs].id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    self->attrs[nattrs++].value.programmaticStreamSerializationAllowed = 1;
  }
  if (cooperative) {
    self->attrs[nattrs].id = CU_LAUNCH_ATTRIBUTE_COOPERATIVE;
    self->attrs[nattrs++].value.cooperative = 1;
  }
  self->config.attrs = self->attrs;
  self->config.numAttrs = nattrs;
  rc = 0;
done:
  Py_DECREF(vals);
  Py_DECREF(sl);
  return rc;
}

/* Write the call's values into their slots. */
static int fill(Launch *self, PyObject *vals) {
  PyObject *seq = PySequence_Fast(vals, "expected a sequence of call values");
  if (!seq) return -1;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  if (n != self->ncall) {
    PyErr_Format(PyExc_ValueError, "expected %zd call values, got %zd", self->ncall, n);
    Py_DECREF(seq);
    return -1;
  }
  PyObject **items = PySequence_Fast_ITEMS(seq);
  for (Py_ssize_t i = 0; i < n; ++i) {
    int k = self->slot[i];
    if (k >= 0 && store(self->kinds[k], items[i], &self->storage[k]) < 0) {
      Py_DECREF(seq);
      return -1;
    }
  }
  Py_DECREF(seq);
  return 0;
}

static int launch_one(Launch *self, CUstream stream) {
  if (self->config.gridDimX * self->config.gridDimY * self->config.gridDimZ == 0) return 0;
  self->config.hStream = stream;
  CUresult err = cu_launch_ex(&self->config, self->function, self->params, NULL);
  if (err != CUDA_SUCCESS) {
    const char *msg = NULL;
    cu_err_str(err, &msg);
    PyErr_Format(PyExc_RuntimeError, "CUDA error in cuLaunchKernelEx: %s", msg ? msg : "unknown");
    return -1;
  }
  return 0;
}

static PyObject *Launch_fill(Launch *self, PyObject *vals) {
  if (fill(self, vals) < 0) return NULL;
  Py_RETURN_NONE;
}

static PyObject *Launch_packed(Launch *self, PyObject *unused) {
  return PyBytes_FromStringAndSize((const char *)self->storage, (Py_ssize_t)self->nparams * 8);
}

static PyMethodDef Launch_methods[] = {
    {"fill", (PyCFunction)Launch_fill, METH_O, "Write the call's values into their slots (no launch)."},
    {"packed", (PyCFunction)Launch_packed, METH_NOARGS, "The parameter block: 8 bytes per parameter."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject LaunchType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "fp8mla_launch.Launch",
    .tp_basicsize = sizeof(Launch),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "One kernel launch with its parameters bound.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Launch_init,
    .tp_methods = Launch_methods,
};

/* launch(stream, a, a_values, b, b_values) -> bool: fill both, then launch a and b (b may be
 * None). False (nothing launched) when this thread has no current CUDA context. */
static PyObject *launch(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  if (nargs != 5) {
    PyErr_SetString(PyExc_TypeError, "expected launch(stream, a, a_values, b, b_values)");
    return NULL;
  }
  if (Py_TYPE(args[1]) != &LaunchType || (args[3] != Py_None && Py_TYPE(args[3]) != &LaunchType)) {
    PyErr_SetString(PyExc_TypeError, "expected Launch objects");
    return NULL;
  }
  unsigned long long stream = PyLong_AsUnsignedLongLong(args[0]);
  if (stream == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
  Launch *a = (Launch *)args[1];
  Launch *b = args[3] == Py_None ? NULL : (Launch *)args[3];
  if (load_driver() < 0) return NULL;
  if (fill(a, args[2]) < 0 || (b && fill(b, args[4]) < 0)) return NULL;
  CUcontext ctx = NULL;
  if (cu_ctx_get(&ctx) != CUDA_SUCCESS || ctx == NULL) Py_RETURN_FALSE;
  if (launch_one(a, (CUstream)(uintptr_t)stream) < 0) return NULL;
  if (b && launch_one(b, (CUstream)(uintptr_t)stream) < 0) return NULL;
  Py_RETURN_TRUE;
}
