/* The extension's functions and module (fp8mla_launch); follows bound.c and fast_call.c. */

static PyMethodDef module_methods[] = {
    {"launch", (PyCFunction)(void (*)(void))launch, METH_FASTCALL,
     "launch(stream, a, a_values, b, b_values) -> bool"},
    {"fast_run", (PyCFunction)(void (*)(void))fast_run, METH_FASTCALL,
     "fast_run(spec, stream, q_nope, q_pe, ckv, kpe, out, lse, ckv_scale, kpe_scale) -> bool"},
    {"fast_check", (PyCFunction)(void (*)(void))fast_check, METH_FASTCALL,
     "fast_check(spec, stream, ...) -> bool: fast_run without the launch"},
    {"set_fields", set_fields, METH_O,
     "set_fields(capsule or None): read tensors through this accessor (None: Python methods)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "fp8mla_launch", NULL, -1, module_methods};

PyMODINIT_FUNC PyInit_fp8mla_launch(void) {
  if (PyType_Ready(&LaunchType) < 0 || PyType_Ready(&FastCallType) < 0) return NULL;
  s_dtype = PyUnicode_InternFromString("dtype");
  s_shape = PyUnicode_InternFromString("shape");
  s_stride = PyUnicode_InternFromString("stride");
  s_data_ptr = PyUnicode_InternFromString("data_ptr");
  s_get_device = PyUnicode_InternFromString("get_device");
  if (!s_dtype || !s_shape || !s_stride || !s_data_ptr || !s_get_device) return NULL;
  PyObject *m = PyModule_Create(&module_def);
  if (!m) return NULL;
  Py_INCREF(&LaunchType);
  Py_INCREF(&FastCallType);
  if (PyModule_AddObject(m, "Launch", (PyObject *)&LaunchType) < 0 ||
      PyModule_AddObject(m, "FastCall", (PyObject *)&FastCallType) < 0) {
    Py_DECREF(m);
    return NULL;
  }
  return m;
}
