/* Shared by the compiled core's files (see _core.c): each defines the Python-callable functions of one hot path. */
#ifndef ZEN_NATIVE_H
#define ZEN_NATIVE_H
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

PyObject *zen_record_ok(PyObject *self, PyObject *args); /* validate.c */
PyObject *zen_decode(PyObject *self, PyObject *args);    /* decode.c */
int zen_decode_init(void);
PyObject *zen_deoptimize(PyObject *self, PyObject *args); /* decode.c */
void zen_deopt_into(const unsigned char *in, Py_ssize_t n, const unsigned char *base, const unsigned char *ncache,
                    int cache_op, unsigned char *o);
PyObject *zen_canonical(PyObject *self, PyObject *args); /* marshal_emit.c */
int zen_canonical_init(void);                            /* marshal_parse.c */
PyObject *zen_greedy_rows(PyObject *self, PyObject *args); /* match.c */
PyObject *zen_attr_matrix(PyObject *self, PyObject *args); /* match.c */
PyObject *zen_long_number(PyObject *self, PyObject *args); /* longnum.c */
PyObject *zen_u64_find(PyObject *self, PyObject *args);    /* scan.c */
PyObject *zen_find_all(PyObject *self, PyObject *args);    /* find.c */
PyObject *zen_find_many(PyObject *self, PyObject *args);   /* find.c */
PyObject *zen_listing(PyObject *self, PyObject *args);     /* listing.c */
int zen_listing_init(void);
extern PyTypeObject zen_objects_type;                      /* objects.c */
extern PyTypeObject zen_sha256_type;                       /* sha256_pair.c */
PyObject *zen_sha256_update_pair(PyObject *self, PyObject *args);
int zen_sha256_init(void);
int zen_sha256_ni(void);
void zen_sha256_oneshot(const uint8_t *p, size_t n, uint8_t out[32]);
PyObject *zen_code_rows(PyObject *self, PyObject *args); /* code_rows.c */

#endif
