/* A tensor's fields as run()'s C path reads them (fp8mla.attention.native): filled by the
 * accessor in tensor_fields.cpp, built against the installed PyTorch, and handed to
 * fast_call.c in a capsule named "fp8mla.tensor_fields.v1". C and C++; the C extension is
 * built with this file first, the accessor includes it. */
#ifndef FP8MLA_TENSOR_FIELDS_H
#define FP8MLA_TENSOR_FIELDS_H
#ifdef __cplusplus
extern "C" {
#endif
typedef struct {
  int dtype;  /* c10::ScalarType */
  int device; /* as Tensor.get_device(): the CUDA device's index, -1 on the CPU, -2 elsewhere */
  int ndim;
  long long shape[4], stride[4];
  unsigned long long ptr;
} TensorFields;
#ifdef __cplusplus
}
#endif
#endif
