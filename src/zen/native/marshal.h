/* The canonical-marshal rewrite's state, shared by its parser (marshal_parse.c) and writer (marshal_emit.c). */
#ifndef ZEN_MARSHAL_H
#define ZEN_MARSHAL_H
#include "native.h"

#define FALLBACK (-2)
#define FLAG_REF 0x80

typedef struct {
    const unsigned char *data;
    Py_ssize_t len, pos, max_depth, budget;
    const char *layout;
    Py_ssize_t nlayout;
    PyObject *nodes;    /* list: node id -> key (bytes, or a tuple of head bytes, child ids and raw fields) */
    PyObject *ids;      /* dict: key -> node id, hash-consing equal encodings */
    PyObject *expanded; /* dict: node id -> its encoding without references (set items' sort keys) */
    Py_ssize_t *counts, ncounts, capcounts; /* node id -> occurrences in the written stream */
    Py_ssize_t *heights, nheights, capheights; /* node id -> levels below it (bounded: emit recurses that deep) */
    Py_ssize_t *refs, nrefs, caprefs;       /* the input's reference slots -> node id (-1 while being read) */
} Rw;

extern PyObject *zen_fallback; /* raised inside the rewrite where the data is left to the reference */
Py_ssize_t zen_parse(Rw *rw, Py_ssize_t depth);
int zen_is_singleton(int t);

#endif
