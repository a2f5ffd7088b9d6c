/* The canonical-marshal rewrite's writer and entry point: nodes parsed by marshal_parse.c written in pre-order, shared
 * ones flagged at their first occurrence and referenced after (zen.cpython.code.canonical_marshal._Rewriter.emit). */
#include "marshal.h"

typedef struct {
    char *buf;
    Py_ssize_t len, cap;
} Out;

static int put(Out *o, const void *b, Py_ssize_t n)
{
    if (o->len + n > o->cap) {
        Py_ssize_t c = o->cap ? o->cap : 4096;
        while (c < o->len + n)
            c *= 2;
        char *nb = PyMem_Realloc(o->buf, (size_t)c);
        if (nb == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        o->buf = nb;
        o->cap = c;
    }
    memcpy(o->buf + o->len, b, (size_t)n);
    o->len += n;
    return 0;
}

/* `bytes` with the first byte flagged when shared */
static int put_head(Out *o, PyObject *bytes, int shared)
{
    const unsigned char *b = (const unsigned char *)PyBytes_AS_STRING(bytes);
    unsigned char first = (unsigned char)(b[0] | (shared ? FLAG_REF : 0));
    return put(o, &first, 1) < 0 ? -1 : put(o, b + 1, PyBytes_GET_SIZE(bytes) - 1);
}

static int emit(Rw *rw, Out *o, Py_ssize_t *refno, Py_ssize_t *nout, Py_ssize_t n)
{
    if (refno[n] >= 0) {
        unsigned char r[5] = {'r'};
        for (int j = 0; j < 4; j++)
            r[1 + j] = (unsigned char)((uint32_t)refno[n] >> (8 * j));
        return put(o, r, 5);
    }
    PyObject *key = PyList_GET_ITEM(rw->nodes, n);
    int bytes = PyBytes_CheckExact(key);
    PyObject *head = bytes ? key : PyTuple_GET_ITEM(key, 0);
    int first = ((const unsigned char *)PyBytes_AS_STRING(head))[0];
    int shared = rw->counts[n] > 1 && (!bytes || !zen_is_singleton(first));
    if (shared && !bytes && (first == '[' || first == '<' || first == '{'))
        shared = 0; /* mutable containers are never shared */
    if (shared)
        refno[n] = (*nout)++;
    if (put_head(o, head, shared) < 0)
        return -1;
    if (bytes)
        return 0;
    for (Py_ssize_t i = 1; i < PyTuple_GET_SIZE(key); i++) {
        PyObject *k = PyTuple_GET_ITEM(key, i);
        int r = PyLong_CheckExact(k) ? emit(rw, o, refno, nout, PyLong_AsSsize_t(k))
                                     : put(o, PyBytes_AS_STRING(k), PyBytes_GET_SIZE(k));
        if (r < 0)
            return -1;
    }
    return 0;
}

/* canonical(data, layout, budget, max_depth) -> bytes | None (None: let the reference answer) */
PyObject *zen_canonical(PyObject *self, PyObject *args)
{
    Py_buffer view;
    const char *layout;
    Py_ssize_t nlayout, budget, max_depth;
    if (!PyArg_ParseTuple(args, "y*s#nn:canonical", &view, &layout, &nlayout, &budget, &max_depth))
        return NULL;
    if (max_depth < 0 || max_depth > 1000) {
        PyBuffer_Release(&view);
        Py_RETURN_NONE;
    }
    Rw rw = {view.buf, view.len, 0, max_depth, budget, layout, nlayout, PyList_New(0), PyDict_New(), PyDict_New(),
             NULL, 0, 0, NULL, 0, 0, NULL, 0, 0};
    PyObject *result = NULL;
    Out o = {NULL, 0, 0};
    Py_ssize_t *refno = NULL;
    if (rw.nodes == NULL || rw.ids == NULL || rw.expanded == NULL)
        goto done;
    Py_ssize_t root = zen_parse(&rw, 0);
    if (root == -1 && PyErr_ExceptionMatches(zen_fallback)) {
        PyErr_Clear();
        root = FALLBACK;
    }
    if (root == FALLBACK || (root >= 0 && rw.pos != rw.len)) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    if (root < 0)
        goto done;
    rw.counts[root]++;
    refno = PyMem_Malloc((size_t)(rw.ncounts ? rw.ncounts : 1) * sizeof(Py_ssize_t));
    if (refno == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < rw.ncounts; i++)
        refno[i] = -1;
    Py_ssize_t nout = 0;
    if (emit(&rw, &o, refno, &nout, root) == 0)
        result = PyBytes_FromStringAndSize(o.buf ? o.buf : "", o.len);
done:
    PyMem_Free(refno);
    PyMem_Free(o.buf);
    PyMem_Free(rw.counts);
    PyMem_Free(rw.heights);
    PyMem_Free(rw.refs);
    Py_XDECREF(rw.nodes);
    Py_XDECREF(rw.ids);
    Py_XDECREF(rw.expanded);
    PyBuffer_Release(&view);
    return result;
}
