/* A lean launcher for compiled Triton kernels whose launch was bound once (launch.KernelLaunch).
 *
 * Triton's own launcher parses every argument of the kernel on every call (13 launch fields and
 * 20-30 kernel arguments for our kernels), then calls cuLaunchKernelEx. A bound launch knows all
 * but a few of those values in advance: make() packs them into a parameter buffer once, and
 * launch() copies that buffer, writes the few values that change (pointers, mostly) and calls
 * cuLaunchKernelEx with the same configuration Triton would use (grid, 32 * num_warps threads,
 * the kernel's shared memory, programmatic dependent launch, cooperative grid, clusters).
 *
 * Built at run time with Triton's own helper (triton.runtime.build), against the cuda.h that
 * Triton ships; libcuda is opened with dlopen, so nothing links against it.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
#include <stdint.h>
#include <string.h>

#include "cuda.h"

#define MAX_PARAMS 96
#define SLOT 8

typedef CUresult (*launch_ex_t)(const CUlaunchConfig *, CUfunction, void **, void **);
typedef CUresult (*error_string_t)(CUresult, const char **);
typedef CUresult (*param_info_t)(CUfunction, size_t, size_t *, size_t *);
typedef CUresult (*ctx_get_current_t)(CUcontext *);

static launch_ex_t launch_ex = NULL;
static error_string_t error_string = NULL;
static param_info_t param_info = NULL;
static ctx_get_current_t ctx_get_current = NULL;

typedef struct {
  PyObject_HEAD
  CUfunction function;
  unsigned int grid[3];
  unsigned int block;
  unsigned int shared;
  int num_ctas, pdl, coop;
  int n_params, n_dynamic;
  int dynamic[MAX_PARAMS];          /* the parameter index of each value passed per call */
  unsigned char kind[MAX_PARAMS];   /* the type code of each parameter (see store) */
  _Alignas(16) unsigned char storage[MAX_PARAMS * SLOT];  /* parameter i at i * SLOT */
} Launch;

static PyTypeObject LaunchType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "fastlaunch.Launch",
    .tp_basicsize = sizeof(Launch),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A kernel launch bound once: function, configuration, constant parameters.",
};

static int size_of(unsigned char kind) {
  switch (kind) {
  case 'p': case 'q': case 'Q': case 'd': return 8;
  case 'i': case 'I': case 'f': return 4;
  case 'h': case 'H': return 2;
  case 'b': case 'B': return 1;
  default: return 0;
  }
}

/* Write Python value v as a parameter of type `kind` at dst. */
static int store(unsigned char kind, unsigned char *dst, PyObject *v) {
  if (kind == 'p' || kind == 'Q') {
    unsigned long long x = 0;
    if (v != Py_None) {
      if (kind == 'p' && !PyLong_Check(v)) { /* an array: its data_ptr() */
        PyObject *address = PyObject_CallMethod(v, "data_ptr", NULL);
        if (address == NULL) return -1;
        x = PyLong_AsUnsignedLongLong(address);
        Py_DECREF(address);
      } else {
        x = PyLong_AsUnsignedLongLong(v);
      }
      if (x == (unsigned long long)-1 && PyErr_Occurred()) return -1;
    }
    memcpy(dst, &x, 8);
    return 0;
  }
  if (kind == 'f' || kind == 'd') {
    double x = PyFloat_AsDouble(v);
    if (x == -1.0 && PyErr_Occurred()) return -1;
    if (kind == 'f') {
      float y = (float)x;
      memcpy(dst, &y, 4);
    } else {
      memcpy(dst, &x, 8);
    }
    return 0;
  }
  long long x = PyLong_AsLongLong(v);
  if (x == -1 && PyErr_Occurred()) return -1;
  switch (kind) {
  case 'q': memcpy(dst, &x, 8); return 0;
  case 'i': { int32_t y = (int32_t)x; memcpy(dst, &y, 4); return 0; }
  case 'I': { uint32_t y = (uint32_t)x; memcpy(dst, &y, 4); return 0; }
  case 'h': { int16_t y = (int16_t)x; memcpy(dst, &y, 2); return 0; }
  case 'H': { uint16_t y = (uint16_t)x; memcpy(dst, &y, 2); return 0; }
  case 'b': { int8_t y = (int8_t)x; memcpy(dst, &y, 1); return 0; }
  case 'B': { uint8_t y = (uint8_t)x; memcpy(dst, &y, 1); return 0; }
  }
  PyErr_Format(PyExc_ValueError, "fastlaunch: unknown parameter type %c", kind);
  return -1;
}

static int load_driver(void) {
  if (launch_ex != NULL) return 0;
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
  if (lib == NULL) {
    PyErr_SetString(PyExc_RuntimeError, "fastlaunch: cannot open libcuda.so.1");
    return -1;
  }
  error_string = (error_string_t)dlsym(lib, "cuGetErrorString");
  param_info = (param_info_t)dlsym(lib, "cuFuncGetParamInfo"); /* CUDA 12.4+, else NULL */
  ctx_get_current = (ctx_get_current_t)dlsym(lib, "cuCtxGetCurrent");
  launch_ex = (launch_ex_t)dlsym(lib, "cuLaunchKernelEx");
  if (launch_ex == NULL || ctx_get_current == NULL) {
    PyErr_SetString(PyExc_RuntimeError, "fastlaunch: libcuda has no cuLaunchKernelEx");
    return -1;
  }
  return 0;
}

/* make(function, gx, gy, gz, block, shared, num_ctas, pdl, coop, kinds, values, dynamic)
 * kinds: bytes, one type code per kernel parameter; values: one per parameter (those at
 * dynamic positions are ignored); dynamic: the parameter indices given per call, in order. */
static PyObject *make(PyObject *self, PyObject *args) {
  unsigned long long function;
  unsigned int gx, gy, gz, block, shared;
  int num_ctas, pdl, coop;
  const char *kinds;
  Py_ssize_t n_kinds;
  PyObject *values, *dynamic;
  if (!PyArg_ParseTuple(args, "KIIIIIippy#O!O!", &function, &gx, &gy, &gz, &block, &shared,
                        &num_ctas, &pdl, &coop, &kinds, &n_kinds, &PyTuple_Type, &values,
                        &PyTuple_Type, &dynamic))
    return NULL;
  if (load_driver() < 0) return NULL;
  if (n_kinds > MAX_PARAMS || PyTuple_GET_SIZE(values) != n_kinds ||
      PyTuple_GET_SIZE(dynamic) > n_kinds) {
    PyErr_SetString(PyExc_ValueError, "fastlaunch: too many parameters or mismatched values");
    return NULL;
  }
  unsigned char kind[MAX_PARAMS];
  for (Py_ssize_t i = 0; i < n_kinds; i++) kind[i] = (unsigned char)kinds[i];
  /* the driver knows the kernel's parameters: check their number and sizes against ours (an
   * integer may be narrower in the kernel than Triton passes it, as i1 is: take its width) */
  if (param_info != NULL) {
    for (Py_ssize_t i = 0; i <= n_kinds; i++) {
      size_t offset = 0, size = 0;
      CUresult r = param_info((CUfunction)function, (size_t)i, &offset, &size);
      if (i == n_kinds) {
        if (r == CUDA_SUCCESS) {
          PyErr_SetString(PyExc_ValueError, "fastlaunch: the kernel has more parameters");
          return NULL;
        }
        break;
      }
      if (r != CUDA_SUCCESS) {
        PyErr_Format(PyExc_ValueError, "fastlaunch: the kernel has %zd parameters, not %zd", i,
                     n_kinds);
        return NULL;
      }
      if ((int)size != size_of(kind[i])) {
        int is_int = strchr("bBhHiIqQ", kind[i]) != NULL;
        int is_signed = strchr("bhiq", kind[i]) != NULL;
        unsigned char narrow =
            size == 1 ? 'b' : size == 2 ? 'h' : size == 4 ? 'i' : size == 8 ? 'q' : 0;
        if (!is_int || narrow == 0) {
          PyErr_Format(PyExc_ValueError, "fastlaunch: parameter %zd has %zu bytes, not %d", i,
                       size, size_of(kind[i]));
          return NULL;
        }
        kind[i] = is_signed ? narrow : (unsigned char)(narrow - 'a' + 'A');
      }
    }
  }
  Launch *l = PyObject_New(Launch, &LaunchType);
  if (l == NULL) return NULL;
  l->function = (CUfunction)function;
  l->grid[0] = gx;
  l->grid[1] = gy;
  l->grid[2] = gz;
  l->block = block;
  l->shared = shared;
  l->num_ctas = num_ctas;
  l->pdl = pdl;
  l->coop = coop;
  l->n_params = (int)n_kinds;
  l->n_dynamic = (int)PyTuple_GET_SIZE(dynamic);
  memset(l->storage, 0, sizeof(l->storage));
  char is_dynamic[MAX_PARAMS] = {0};
  for (int j = 0; j < l->n_dynamic; j++) {
    long k = PyLong_AsLong(PyTuple_GET_ITEM(dynamic, j));
    if (k < 0 || k >= n_kinds) {
      Py_DECREF(l);
      if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "fastlaunch: bad dynamic index");
      return NULL;
    }
    l->dynamic[j] = (int)k;
    is_dynamic[k] = 1;
  }
  for (int i = 0; i < n_kinds; i++) {
    l->kind[i] = kind[i];
    if (size_of(l->kind[i]) == 0) {
      Py_DECREF(l);
      PyErr_Format(PyExc_ValueError, "fastlaunch: unknown parameter type %c", kinds[i]);
      return NULL;
    }
    if (!is_dynamic[i] && store(l->kind[i], l->storage + i * SLOT,
                                PyTuple_GET_ITEM(values, i)) < 0) {
      Py_DECREF(l);
      return NULL;
    }
  }
  return (PyObject *)l;
}

/* launch(bound, stream, *values): one launch on `stream` with `values` at the dynamic
 * positions. */
static PyObject *launch(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  if (nargs < 2 || Py_TYPE(args[0]) != &LaunchType) {
    PyErr_SetString(PyExc_TypeError, "fastlaunch.launch(bound, stream, *values)");
    return NULL;
  }
  Launch *l = (Launch *)args[0];
  if (nargs != 2 + l->n_dynamic) {
    PyErr_Format(PyExc_TypeError, "fastlaunch.launch: expected %d values, got %zd",
                 l->n_dynamic, nargs - 2);
    return NULL;
  }
  unsigned long long stream = PyLong_AsUnsignedLongLong(args[1]);
  if (stream == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
  if ((unsigned long long)l->grid[0] * l->grid[1] * l->grid[2] == 0) Py_RETURN_NONE;

  _Alignas(16) unsigned char buffer[MAX_PARAMS * SLOT];
  void *params[MAX_PARAMS];
  memcpy(buffer, l->storage, (size_t)l->n_params * SLOT);
  for (int i = 0; i < l->n_params; i++) params[i] = buffer + i * SLOT;
  for (int j = 0; j < l->n_dynamic; j++) {
    int k = l->dynamic[j];
    if (store(l->kind[k], buffer + k * SLOT, args[2 + j]) < 0) return NULL;
  }

  CUcontext context = NULL;
  ctx_get_current(&context);
  if (context == NULL) {
    PyErr_SetString(PyExc_RuntimeError, "fastlaunch: no CUDA context is current");
    return NULL;
  }
  CUlaunchAttribute attrs[4];
  int n_attrs = 0;
  if (l->pdl) {
    attrs[n_attrs].id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    attrs[n_attrs].value.programmaticStreamSerializationAllowed = 1;
    n_attrs++;
  }
  if (l->coop) {
    attrs[n_attrs].id = CU_LAUNCH_ATTRIBUTE_COOPERATIVE;
    attrs[n_attrs].value.cooperative = 1;
    n_attrs++;
  }
  if (l->num_ctas != 1) {
    attrs[n_attrs].id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
    attrs[n_attrs].value.clusterDim.x = l->num_ctas;
    attrs[n_attrs].value.clusterDim.y = 1;
    attrs[n_attrs].value.clusterDim.z = 1;
    n_attrs++;
    attrs[n_attrs].id = CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE;
    attrs[n_attrs].value.clusterSchedulingPolicyPreference = CU_CLUSTER_SCHEDULING_POLICY_SPREAD;
    n_attrs++;
  }
  CUlaunchConfig config;
  config.gridDimX = l->grid[0] * l->num_ctas;
  config.gridDimY = l->grid[1];
  config.gridDimZ = l->grid[2];
  config.blockDimX = l->block;
  config.blockDimY = 1;
  config.blockDimZ = 1;
  config.sharedMemBytes = l->shared;
  config.hStream = (CUstream)stream;
  config.attrs = attrs;
  config.numAttrs = n_attrs;
  CUresult r = launch_ex(&config, l->function, params, NULL);
  if (r != CUDA_SUCCESS) {
    const char *message = NULL;
    if (error_string != NULL) error_string(r, &message);
    PyErr_Format(PyExc_RuntimeError, "fastlaunch: cuLaunchKernelEx failed: %s (%d)",
                 message ? message : "unknown error", (int)r);
    return NULL;
  }
  Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"make", make, METH_VARARGS, "Bind a launch: make(function, gx, gy, gz, block, shared, "
                                 "num_ctas, pdl, coop, kinds, values, dynamic)."},
    {"launch", (PyCFunction)(void (*)(void))launch, METH_FASTCALL,
     "launch(bound, stream, *values)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "fastlaunch", NULL, -1, methods};

PyMODINIT_FUNC PyInit_fastlaunch(void) {
  if (PyType_Ready(&LaunchType) < 0) return NULL;
  return PyModule_Create(&module);
}
