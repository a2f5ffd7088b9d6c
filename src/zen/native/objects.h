/* The compiled reader of small CPython objects (objects.c), shared with the readers built on it (code_object.c):
 * the Objects type's state and one call's view of the image, and the bounded helpers every reader goes through. */
#ifndef ZEN_OBJECTS_H
#define ZEN_OBJECTS_H
#include "native.h"

enum { P_RC_MASK, P_MAX_REFCNT, P_MAX_STR, P_MAX_ITEMS, P_MAX_BYTES, P_OB_SIZE, P_TUPLE_ITEMS, P_BYTES_SVAL,
       P_U_LENGTH, P_U_STATE, P_U_ASCII, P_U_COMPACT, P_KIND_SHIFT, P_COMPACT_BIT, P_ASCII_BIT, P_COUNT };

typedef struct {
    PyObject_HEAD
    Py_ssize_t n;
    uint64_t *start, *end;
    int64_t *bid, *boff;
    PyObject *buffers;                                  /* list: the backing buffers (an mmap per core file) */
    PyObject *obj_kind, *obj_type, *kind_cache, *str_cache; /* the interpreter's dicts */
    uint64_t p[P_COUNT];
} Objects;

/* One call's view of the image: the buffer last used stays acquired until obj_done() (most calls read one buffer) */
typedef struct {
    Objects *o;
    int64_t held;
    Py_buffer view;
} Reading;

/* Hidden: shared between the extension's files only. A default-visibility symbol in position-independent code may be
 * interposed, so the compiler would no longer inline these into objects.c's own methods (kind/str cost more). */
#define OBJ_API __attribute__((visibility("hidden")))

OBJ_API void obj_done(Reading *r);
/* bytes [addr, addr + size) inside one chunk with a buffer, or NULL (no error set) */
OBJ_API const unsigned char *obj_at(Reading *r, uint64_t addr, uint64_t size);
OBJ_API int obj_plus(uint64_t a, uint64_t b, uint64_t *out);
OBJ_API int obj_word(Reading *r, uint64_t addr, uint64_t *out);
/* 1 answered (*kind borrowed), 0 for the reference to answer, -1 on error */
OBJ_API int obj_kind_of(Reading *r, uint64_t addr, PyObject *key, PyObject **kind);
OBJ_API int obj_is_kind(Reading *r, uint64_t addr, PyObject *key, const char *want);
OBJ_API int obj_address(PyObject *arg, uint64_t *addr);
OBJ_API int obj_size_of(Reading *r, uint64_t addr, uint64_t most, uint64_t *n);
/* a new reference: the object, Py_None when not answered, NULL on error */
OBJ_API PyObject *obj_str_at(Reading *r, uint64_t addr, PyObject *key);
OBJ_API PyObject *obj_items_at(Reading *r, uint64_t addr, PyObject *key, uint64_t most);
/* readers.text.read_bytes and a tuple of strs (extra: unused) */
/* readers.text.read_bytes; a tuple of compact strs (`extra` unused: the Objects methods' shape) */
OBJ_API PyObject *obj_bytes_at(Reading *r, uint64_t addr, PyObject *key, PyObject *extra);
OBJ_API PyObject *obj_strs_at(Reading *r, uint64_t addr, PyObject *key, PyObject *extra);
/* A reader of one object given the layout's offsets: answers the object, Py_None, or NULL with an error set */
typedef PyObject *(*SpecReader)(Reading *r, uint64_t addr, PyObject *key, const int64_t *spec);
enum { OBJ_SPEC_MAX = 64 };
/* `reader` called as the Objects method (addr, spec): spec is bytes of `count` (<= OBJ_SPEC_MAX) int64; None for
 * an addr that is no address; a TypeError naming `usage` for a spec of another size */
OBJ_API PyObject *obj_spec_call(Objects *o, PyObject *const *args, Py_ssize_t nargs, Py_ssize_t count,
                                const char *usage, SpecReader reader);
OBJ_API PyObject *zen_objects_code(Objects *o, PyObject *const *args, Py_ssize_t nargs);     /* code_object.c */
OBJ_API PyObject *zen_objects_function(Objects *o, PyObject *const *args, Py_ssize_t nargs); /* functions.c */

#endif
