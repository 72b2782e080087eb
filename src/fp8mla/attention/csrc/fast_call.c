/* run()'s common case checked, filled and launched in C (fp8mla.attention.native); follows
 * bound.c in the one source the extension is built from. */

/* ---------------------------------------------------------------------------------------
 * FastCall: run()'s common case read, checked and launched in C. It accepts a call only when
 * every tensor is a plain torch.Tensor of the planned dtype, shape and device with a unit
 * last stride, every address 16-byte aligned and every stride a nonzero multiple of 16 (the
 * specialization the bound kernels were compiled for), the scales floats (or None) that are
 * finite and > 0, and the page ids in range; anything else is declined (returns None) and
 * the Python path takes the call, with its full checks and error messages.
 */
typedef struct {
  PyObject_HEAD
  Launch *a, *b;
  PyObject *tensor_type, *q_dtype, *kv_dtype, *f32_dtype;
  int q_code, kv_code, f32_code; /* the three dtypes' ScalarType codes; -1: unknown */
  long device;
  long long T, H, page_size, max_page, d_kpe;
  int split, has_nan, write_lse, scale_ptr, kv_elem;
  unsigned long long nan_addr, partial_lse;
} FastCall;

static PyObject *s_dtype, *s_shape, *s_stride, *s_data_ptr, *s_get_device;

/* A tensor's fields read through PyTorch's C++ API (csrc/tensor_fields.cpp, built against
 * the installed PyTorch where it can be; TensorFields from tensor_fields.h). Without it, the
 * fields are read through the tensor's Python methods. */
typedef int (*fields_fn)(PyObject *, TensorFields *);
static fields_fn g_fields = NULL;

/* set_fields(capsule or None): read tensors through the accessor in the capsule (None: through
 * their Python methods) */
static PyObject *set_fields(PyObject *self, PyObject *cap) {
  if (cap == Py_None) {
    g_fields = NULL;
    Py_RETURN_NONE;
  }
  void *fn = PyCapsule_GetPointer(cap, "fp8mla.tensor_fields.v1");
  if (!fn) return NULL;
  g_fields = (fields_fn)fn;
  Py_RETURN_NONE;
}

static void FastCall_dealloc(FastCall *self) {
  Py_XDECREF(self->a);
  Py_XDECREF(self->b);
  Py_XDECREF(self->tensor_type);
  Py_XDECREF(self->q_dtype);
  Py_XDECREF(self->kv_dtype);
  Py_XDECREF(self->f32_dtype);
  Py_TYPE(self)->tp_free((PyObject *)self);
}

static int FastCall_init(FastCall *self, PyObject *args, PyObject *kw) {
  PyObject *a, *b, *tt, *qd, *kd, *f32;
  if (!PyArg_ParseTuple(args, "O!OOOOOiiilLLLLLppppiKK", &LaunchType, &a, &b, &tt, &qd, &kd,
                        &f32, &self->q_code, &self->kv_code, &self->f32_code, &self->device,
                        &self->T, &self->H, &self->page_size, &self->max_page,
                        &self->d_kpe, &self->split, &self->has_nan, &self->write_lse,
                        &self->scale_ptr, &self->kv_elem, &self->nan_addr, &self->partial_lse))
    return -1;
  if (b != Py_None && Py_TYPE(b) != &LaunchType) {
    PyErr_SetString(PyExc_TypeError, "expected a Launch or None for the merge");
    return -1;
  }
  Py_INCREF(a);
  Py_XSETREF(self->a, (Launch *)a);
  Py_XINCREF(b == Py_None ? NULL : b);
  Py_XSETREF(self->b, b == Py_None ? NULL : (Launch *)b);
  Py_INCREF(tt);
  Py_XSETREF(self->tensor_type, tt);
  Py_INCREF(qd);
  Py_XSETREF(self->q_dtype, qd);
  Py_INCREF(kd);
  Py_XSETREF(self->kv_dtype, kd);
  Py_INCREF(f32);
  Py_XSETREF(self->f32_dtype, f32);
  return 0;
}

static PyTypeObject FastCallType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "fp8mla_launch.FastCall",
    .tp_basicsize = sizeof(FastCall),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "run()'s common case, checked and launched in C.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)FastCall_init,
    .tp_dealloc = (destructor)FastCall_dealloc,
};

typedef struct {
  unsigned long long ptr;
  long long shape[3], stride[3];
} TensorView;

/* the accessor, where it is set and the spec knows its dtypes' codes; else NULL */
static fields_fn fields_of(FastCall *fc) {
  return fc->q_code >= 0 && fc->kv_code >= 0 && fc->f32_code >= 0 ? g_fields : NULL;
}

/* 1: t is a plain tensor (not a subclass), read through the accessor, of dtype ``code`` on
 * the spec's device with ``ndim`` dims; its fields in f. 0: declined. */
static int read_fields(FastCall *fc, fields_fn fn, PyObject *t, int code, int ndim,
                       TensorFields *f) {
  return (PyObject *)Py_TYPE(t) == fc->tensor_type && fn(t, f) && f->dtype == code &&
         f->device == fc->device && f->ndim == ndim;
}

/* 1: t is a plain tensor (not a subclass) of ``dtype`` on the spec's device. 0: it is not.
 * -1: a Python error. */
static int plain_on_device(FastCall *fc, PyObject *t, PyObject *dtype) {
  if ((PyObject *)Py_TYPE(t) != fc->tensor_type) return 0;
  PyObject *o = PyObject_GetAttr(t, s_dtype);
  if (!o) return -1;
  int same = o == dtype;
  Py_DECREF(o);
  if (!same) return 0;
  o = PyObject_CallMethodNoArgs(t, s_get_device);
  if (!o) return -1;
  long dev = PyLong_AsLong(o);
  Py_DECREF(o);
  return dev == fc->device;
}

/* the tensor's address: 0 with a Python error set when it cannot be read */
static unsigned long long address_of(PyObject *t) {
  PyObject *o = PyObject_CallMethodNoArgs(t, s_data_ptr);
  if (!o) return 0;
  unsigned long long ptr = PyLong_AsUnsignedLongLong(o);
  Py_DECREF(o);
  return ptr;
}

/* 1: t is a plain tensor of ``dtype`` on the device with ``ndim`` dims, a unit last stride;
 * its address, shape and strides in v. 0: declined. -1: a Python error. */
static int view_of(FastCall *fc, PyObject *t, PyObject *dtype, int code, int ndim, TensorView *v) {
  fields_fn fn = fields_of(fc);
  if (fn) {
    TensorFields f;
    if (!read_fields(fc, fn, t, code, ndim, &f) || f.stride[ndim - 1] != 1) return 0;
    for (int i = 0; i < ndim; ++i) {
      v->shape[i] = f.shape[i];
      v->stride[i] = f.stride[i];
    }
    v->ptr = f.ptr;
    return 1;
  }
  int r = plain_on_device(fc, t, dtype);
  if (r <= 0) return r;
  PyObject *o = PyObject_GetAttr(t, s_shape);
  if (!o) return -1;
  int ok = PyTuple_Check(o) && PyTuple_GET_SIZE(o) == ndim;
  for (int i = 0; ok && i < ndim; ++i) v->shape[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(o, i));
  Py_DECREF(o);
  if (!ok) return 0;
  o = PyObject_CallMethodNoArgs(t, s_stride);
  if (!o) return -1;
  ok = PyTuple_Check(o) && PyTuple_GET_SIZE(o) == ndim;
  for (int i = 0; ok && i < ndim; ++i) v->stride[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(o, i));
  Py_DECREF(o);
  if (!ok || v->stride[ndim - 1] != 1) return 0;
  v->ptr = address_of(t);
  return PyErr_Occurred() ? -1 : 1;
}

/* a positive finite float scale; None is 1.0; 0: declined */
static int scale_of(PyObject *s, double *v) {
  if (s == Py_None) {
    *v = 1.0;
    return 1;
  }
  if (!PyFloat_CheckExact(s)) return 0;
  *v = PyFloat_AS_DOUBLE(s);
  return *v > 0.0 && *v <= 1.7976931348623157e308;
}

/* a scale the kernel reads from the device: a one-element fp32 tensor of at most one
 * dimension on the device, 16-byte aligned; its address in ptr. 0: declined. */
static int scale_tensor(FastCall *fc, PyObject *t, unsigned long long *ptr) {
  fields_fn fn = fields_of(fc);
  if (fn) {
    TensorFields f;
    if (!(read_fields(fc, fn, t, fc->f32_code, 0, &f) ||
          (read_fields(fc, fn, t, fc->f32_code, 1, &f) && f.shape[0] == 1)))
      return 0;
    *ptr = f.ptr;
    return (*ptr & 15) == 0;
  }
  int r = plain_on_device(fc, t, fc->f32_dtype);
  if (r <= 0) return r;
  PyObject *o = PyObject_GetAttr(t, s_shape);
  if (!o) return -1;
  int ok = PyTuple_Check(o) && PyTuple_GET_SIZE(o) <= 1 &&
           (PyTuple_GET_SIZE(o) == 0 || PyLong_AsLongLong(PyTuple_GET_ITEM(o, 0)) == 1);
  Py_DECREF(o);
  if (!ok) return 0;
  *ptr = address_of(t);
  if (PyErr_Occurred()) return -1;
  return (*ptr & 15) == 0;
}

static int put(Launch *l, int i, long long v) {
  int k = l->slot[i];
  if (k < 0) return 0;
  uint64_t bits = 0;
  switch (l->kinds[k]) {
  case 'p':
  case 'L':
    memcpy(&bits, &v, 8);
    break;
  case 'i':
    if (v < INT32_MIN || v > INT32_MAX) return -1;
    {
      int32_t w = (int32_t)v;
      memcpy(&bits, &w, 4);
    }
    break;
  case 'b':
  case 'B':
    bits = (uint8_t)v;
    break;
  default:
    return -1;
  }
  l->storage[k] = bits;
  return 0;
}

static int put_f(Launch *l, int i, double v) {
  int k = l->slot[i];
  if (k < 0) return 0;
  if (l->kinds[k] != 'f') return -1;
  float w = (float)v;
  uint64_t bits = 0;
  memcpy(&bits, &w, 4);
  l->storage[k] = bits;
  return 0;
}

static long long nan_offset(unsigned long long base, long long es, unsigned long long nan) {
  /* as launch.py's _nan_offset: the element offset from base to a NaN row, a multiple of 16 */
  long long diff = (long long)(base - nan);
  long long q = diff / es - ((diff % es) != 0 && ((diff < 0) != (es < 0)));
  long long start = ((q % 16) + 16) % 16;
  long long back = (long long)(nan - base);
  long long fl = back / es - ((back % es) != 0 && ((back < 0) != (es < 0)));
  return fl + start;
}

static int aligned16(long long v) { return v != 0 && (v & 15) == 0; }

/* Check a call (args: spec, stream, q_nope, q_pe, ckv, kpe, out, lse, ckv_scale, kpe_scale)
 * and fill the bound kernels' slots: 1 filled, 0 declined, -1 a Python error. */
static int fast_fill(PyObject *const *args, Py_ssize_t nargs) {
  if (nargs != 10 || Py_TYPE(args[0]) != &FastCallType) {
    PyErr_SetString(PyExc_TypeError, "expected (spec, stream, q_nope, q_pe, ckv, kpe, out, lse, ckv_scale, kpe_scale)");
    return -1;
  }
  FastCall *fc = (FastCall *)args[0];
  TensorView qn, qp, ck, kp, o, ls;
  int r;
#define VIEW(t, dt, nd, v)                                   \
  r = view_of(fc, (t), fc->dt##_dtype, fc->dt##_code, (nd), (v)); \
  if (r <= 0) return r;
  VIEW(args[2], q, 3, &qn);
  VIEW(args[3], q, 3, &qp);
  VIEW(args[4], kv, 3, &ck);
  VIEW(args[5], kv, 3, &kp);
  VIEW(args[6], q, 3, &o);
  int write_lse = args[7] != Py_None;
  if (write_lse != fc->write_lse) return 0;
  if (write_lse) {
    VIEW(args[7], f32, 2, &ls);
  }
#undef VIEW
  double cs = 1.0, ks = 1.0;
  unsigned long long cs_addr = 0, ks_addr = 0;
  if (fc->scale_ptr) { /* both scales read by the kernel from the device */
    r = scale_tensor(fc, args[8], &cs_addr);
    if (r <= 0) return r;
    r = scale_tensor(fc, args[9], &ks_addr);
    if (r <= 0) return r;
  } else if (!scale_of(args[8], &cs) || !scale_of(args[9], &ks)) {
    return 0;
  }
  long long T = fc->T, H = fc->H, P = ck.shape[0];
  if (qn.shape[0] != T || qn.shape[1] != H || qn.shape[2] != 512 || qp.shape[0] != T ||
      qp.shape[1] != H || qp.shape[2] != fc->d_kpe || o.shape[0] != T || o.shape[1] != H ||
      o.shape[2] != 512 || P < 1 || ck.shape[1] != fc->page_size || ck.shape[2] != 512 ||
      kp.shape[0] != P || kp.shape[1] != fc->page_size || kp.shape[2] != fc->d_kpe ||
      (fc->max_page >= 0 && fc->max_page >= P))
    return 0;
  if (write_lse && (ls.shape[0] != T || ls.shape[1] != H)) return 0;
  unsigned long long a_lse = write_lse ? ls.ptr : o.ptr;
  if ((qn.ptr | qp.ptr | ck.ptr | kp.ptr | o.ptr | a_lse) & 15) return 0;
  long long lse_t = write_lse ? ls.stride[0] : 0;
  if (!(aligned16(qn.stride[0]) && aligned16(qn.stride[1]) && aligned16(qp.stride[0]) &&
        aligned16(qp.stride[1]) && aligned16(ck.stride[0]) && aligned16(ck.stride[1]) &&
        aligned16(kp.stride[0]) && aligned16(kp.stride[1]) && aligned16(o.stride[0]) &&
        aligned16(o.stride[1]) && (!write_lse || aligned16(lse_t))))
    return 0;
  Launch *a = fc->a;
  long long v[24] = {
      (long long)qn.ptr, (long long)qp.ptr, (long long)ck.ptr, (long long)kp.ptr,
      (long long)ck.ptr, (long long)(fc->scale_ptr ? cs_addr : ck.ptr),
      (long long)(fc->scale_ptr ? ks_addr : ck.ptr), qn.stride[0], qn.stride[1],
      qp.stride[0], qp.stride[1], ck.stride[0], ck.stride[1], kp.stride[0], kp.stride[1], 0, 0,
      P, 0, 0, 0, 0, 0, T};
  int n = 0, bad = 0;
  for (; n < 24; ++n) {
    if (n == 18 || n == 19) continue;
    bad |= put(a, n, v[n]);
  }
  bad |= put_f(a, 18, cs);
  bad |= put_f(a, 19, ks);
  if (!fc->split) {
    long long w[6] = {(long long)o.ptr, (long long)a_lse, o.stride[0], o.stride[1], lse_t, write_lse};
    for (int i = 0; i < 6; ++i) bad |= put(a, n++, w[i]);
  }
  if (fc->has_nan) {
    long long nc = nan_offset(ck.ptr, fc->kv_elem, fc->nan_addr);
    long long nk = nan_offset(kp.ptr, fc->kv_elem, fc->nan_addr);
    if (!aligned16(nc) || !aligned16(nk) || nc < INT32_MIN || nc > INT32_MAX ||
        nk < INT32_MIN || nk > INT32_MAX)
      return 0; /* the bound kernel took them as 32-bit multiples of 16 */
    bad |= put(a, n++, nc);
    bad |= put(a, n++, nk);
  }
  if (n != a->ncall || bad) return 0;
  Launch *b = fc->b;
  if (b) {
    long long w[7] = {(long long)o.ptr, (long long)(write_lse ? ls.ptr : fc->partial_lse), T,
                      o.stride[0], o.stride[1], lse_t, write_lse};
    if (b->ncall != 7) return 0;
    for (int i = 0; i < 7; ++i) bad |= put(b, i, w[i]);
    if (bad) return 0;
  }
  return 1;
}

/* fast_run(spec, stream, q_nope, q_pe, ckv, kpe, out, lse, ckv_scale, kpe_scale) -> bool:
 * True when launched, False when declined (nothing launched). */
static PyObject *fast_run(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  int r = fast_fill(args, nargs);
  if (r < 0) return NULL;
  if (r == 0) Py_RETURN_FALSE;
  unsigned long long stream = PyLong_AsUnsignedLongLong(args[1]);
  if (stream == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
  if (load_driver() < 0) return NULL;
  CUcontext ctx = NULL;
  if (cu_ctx_get(&ctx) != CUDA_SUCCESS || ctx == NULL) Py_RETURN_FALSE;
  FastCall *fc = (FastCall *)args[0];
  if (launch_one(fc->a, (CUstream)(uintptr_t)stream) < 0) return NULL;
  if (fc->b && launch_one(fc->b, (CUstream)(uintptr_t)stream) < 0) return NULL;
  Py_RETURN_TRUE;
}

/* fast_check(...) -> bool: fast_run's checks and fills, nothing launched (for tests). */
static PyObject *fast_check(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  int r = fast_fill(args, nargs);
  if (r < 0) return NULL;
  return PyBool_FromLong(r);
}
