/* Attribution's code matching: zen.attribute.matching's greedy row loop and Attr SS matrix, compiled.
 *
 * A code view's attribute set arrives as int64 ids (one per distinct attribute, from the caller's map, so
 * two sets' intersection is the count of ids they share), a comparison's views as CSR arrays (ids, row
 * pointers) and their vectors as int64 triples. Attr SS is inter / union in double, as numpy divides two
 * int64 arrays; distance wraps on overflow as numpy's int64 does; candidates are ranked by (Attr SS
 * descending, distance ascending, column ascending), the reference's lexsort order; the TOP_N walk, its
 * early stop and the strict ">" that keeps the first best are the reference's. Every index handed in is
 * checked against the arrays it indexes before anything is read. */
#include "native.h"

/* Ids come from the caller's map of one attribution's distinct attributes (dense from 0); this bounds the
 * posting table a wrong id could make us allocate (8 bytes per possible id). */
#define MAX_ID ((int64_t)1 << 26)

typedef struct {
    const int64_t *ids, *ptr, *vec;
    Py_ssize_t n, nids;
    Py_buffer b_ids, b_ptr, b_vec;
} Rows;

static void rows_release(Rows *r)
{
    if (r->b_ids.obj)
        PyBuffer_Release(&r->b_ids);
    if (r->b_ptr.obj)
        PyBuffer_Release(&r->b_ptr);
    if (r->b_vec.obj)
        PyBuffer_Release(&r->b_vec);
}

/* Fill `r` from (ids, ptr[, vec]) buffers of int64; max id in *maxid. 0, or -1 with ValueError set. */
static int rows_get(Rows *r, PyObject *ids, PyObject *ptr, PyObject *vec, int64_t *maxid)
{
    memset(r, 0, sizeof(*r));
    if (PyObject_GetBuffer(ids, &r->b_ids, PyBUF_C_CONTIGUOUS) < 0 || PyObject_GetBuffer(ptr, &r->b_ptr, PyBUF_C_CONTIGUOUS) < 0)
        return -1;
    if (vec != NULL && PyObject_GetBuffer(vec, &r->b_vec, PyBUF_C_CONTIGUOUS) < 0)
        return -1;
    if (r->b_ids.len % 8 || r->b_ptr.len % 8 || r->b_ptr.len < 8 || (vec != NULL && r->b_vec.len % 24)) {
        PyErr_SetString(PyExc_ValueError, "match: arrays must be int64 (ids, row pointers, vectors of three)");
        return -1;
    }
    r->ids = r->b_ids.buf, r->ptr = r->b_ptr.buf, r->vec = vec != NULL ? r->b_vec.buf : NULL;
    r->nids = r->b_ids.len / 8, r->n = r->b_ptr.len / 8 - 1;
    if (vec != NULL && r->b_vec.len / 24 != r->n) {
        PyErr_SetString(PyExc_ValueError, "match: one vector per row");
        return -1;
    }
    if (r->ptr[0] != 0 || r->ptr[r->n] != r->nids) {
        PyErr_SetString(PyExc_ValueError, "match: row pointers must run from 0 to the number of ids");
        return -1;
    }
    for (Py_ssize_t i = 0; i < r->n; i++)
        if (r->ptr[i + 1] < r->ptr[i]) {
            PyErr_SetString(PyExc_ValueError, "match: row pointers must not decrease");
            return -1;
        }
    for (Py_ssize_t k = 0; k < r->nids; k++) {
        if (r->ids[k] < 0 || r->ids[k] >= MAX_ID) {
            PyErr_SetString(PyExc_ValueError, "match: attribute ids must lie in [0, 2**26)");
            return -1;
        }
        if (r->ids[k] > *maxid)
            *maxid = r->ids[k];
    }
    return 0;
}

/* Posting lists of the columns: for each id, the columns whose set holds it (CSR over ids). */
typedef struct {
    Py_ssize_t *start, *cols;
} Postings;

static int postings_build(Postings *p, const Rows *g, int64_t maxid)
{
    p->start = PyMem_Calloc((size_t)maxid + 2, sizeof(Py_ssize_t));
    p->cols = PyMem_Malloc(((size_t)g->nids + 1) * sizeof(Py_ssize_t));
    if (p->start == NULL || p->cols == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t k = 0; k < g->nids; k++)
        p->start[g->ids[k] + 1]++;
    for (int64_t i = 0; i <= maxid; i++)
        p->start[i + 1] += p->start[i];
    Py_ssize_t *fill = PyMem_Malloc(((size_t)maxid + 1) * sizeof(Py_ssize_t));
    if (fill == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    memcpy(fill, p->start, ((size_t)maxid + 1) * sizeof(Py_ssize_t));
    for (Py_ssize_t j = 0; j < g->n; j++)
        for (int64_t k = g->ptr[j]; k < g->ptr[j + 1]; k++)
            p->cols[fill[g->ids[k]]++] = j;
    PyMem_Free(fill);
    return 0;
}

static void postings_free(Postings *p)
{
    PyMem_Free(p->start);
    PyMem_Free(p->cols);
}

/* Intersection sizes of row i of d with every column (inter must be zero on entry). */
static void intersect(const Rows *d, Py_ssize_t i, const Postings *p, int64_t maxid, int64_t *inter)
{
    for (int64_t k = d->ptr[i]; k < d->ptr[i + 1]; k++) {
        int64_t a = d->ids[k];
        if (a > maxid)
            continue;
        for (Py_ssize_t q = p->start[a]; q < p->start[a + 1]; q++)
            inter[p->cols[q]]++;
    }
}

static double attr_ss(int64_t inter, int64_t size_d, int64_t size_g)
{
    int64_t uni = size_d + size_g - inter;
    return uni == 0 ? 1.0 : (double)inter / (double)uni;
}

/* |x - y| summed over the three components with int64 wrap-around, as numpy computes it. */
static int64_t distance(const int64_t *x, const int64_t *y)
{
    uint64_t s = 0;
    for (int c = 0; c < 3; c++) {
        int64_t diff = (int64_t)((uint64_t)x[c] - (uint64_t)y[c]);
        s += diff < 0 ? (uint64_t)0 - (uint64_t)diff : (uint64_t)diff;
    }
    return (int64_t)s;
}

#define MAX_TOP 16

/* The most IBSS (fuzz.ratio / 100) of two texts of na and nb characters can be: their longest common
 * subsequence is at most the shorter one, so 2 min / (na + nb); 1 for two empty texts. */
static double ibss_bound(int64_t na, int64_t nb)
{
    return na + nb > 0 ? 2.0 * (double)(na < nb ? na : nb) / (double)(na + nb) : 1.0;
}

/* A column whose score cannot pass the best by more than this (in case rapidfuzz's division rounds above
 * the bound) is still scored: skipping is only for columns that certainly lose. */
#define BOUND_MARGIN 1e-9

/* greedy_rows(d_ids, d_ptr, d_vec, g_ids, g_ptr, g_vec, used, topn, ibss[, d_len, g_len]) -> list
 * For each row in order: None when every column is taken (the row is added code), else (j, s, a, b) and
 * column j marked taken in `used` (a writable uint8/bool buffer, one per column). ibss(i, j) -> float.
 * With the texts' lengths (int64, one per row and one per column), a column whose IBSS could not make it
 * the best even at its length bound is not scored (its ibss call skipped): the same choices and scores. */
PyObject *zen_greedy_rows(PyObject *self, PyObject *args)
{
    PyObject *d_ids, *d_ptr, *d_vec, *g_ids, *g_ptr, *g_vec, *used_obj, *ibss, *d_len_obj = Py_None, *g_len_obj = Py_None;
    Py_ssize_t topn;
    if (!PyArg_ParseTuple(args, "OOOOOOOnO|OO", &d_ids, &d_ptr, &d_vec, &g_ids, &g_ptr, &g_vec, &used_obj, &topn, &ibss,
                          &d_len_obj, &g_len_obj))
        return NULL;
    if (topn < 1 || topn > MAX_TOP || !PyCallable_Check(ibss)) {
        PyErr_SetString(PyExc_ValueError, "greedy_rows: topn in [1, 16] and a callable ibss");
        return NULL;
    }
    Rows d = {0}, g = {0};
    Postings p = {NULL, NULL};
    Py_buffer ub = {0}, dlb = {0}, glb = {0};
    int64_t maxid = -1, *inter = NULL;
    const int64_t *d_len = NULL, *g_len = NULL;
    PyObject *out = NULL;
    if (rows_get(&d, d_ids, d_ptr, d_vec, &maxid) < 0 || rows_get(&g, g_ids, g_ptr, g_vec, &maxid) < 0)
        goto done;
    if (PyObject_GetBuffer(used_obj, &ub, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0)
        goto done;
    if (ub.len != g.n) {
        PyErr_SetString(PyExc_ValueError, "greedy_rows: one used flag per column");
        goto done;
    }
    if ((d_len_obj == Py_None) != (g_len_obj == Py_None)) {
        PyErr_SetString(PyExc_ValueError, "greedy_rows: the lengths of both sides' texts, or neither");
        goto done;
    }
    if (d_len_obj != Py_None) {
        if (PyObject_GetBuffer(d_len_obj, &dlb, PyBUF_C_CONTIGUOUS) < 0 || PyObject_GetBuffer(g_len_obj, &glb, PyBUF_C_CONTIGUOUS) < 0)
            goto done;
        if (dlb.len != 8 * d.n || glb.len != 8 * g.n) {
            PyErr_SetString(PyExc_ValueError, "greedy_rows: one int64 text length per row and per column");
            goto done;
        }
        d_len = dlb.buf, g_len = glb.buf;
        for (Py_ssize_t k = 0; k < d.n + g.n; k++)
            if ((k < d.n ? d_len[k] : g_len[k - d.n]) < 0) {
                PyErr_SetString(PyExc_ValueError, "greedy_rows: text lengths must not be negative");
                goto done;
            }
    }
    if (postings_build(&p, &g, maxid) < 0)
        goto done;
    inter = PyMem_Calloc((size_t)g.n + 1, sizeof(int64_t));
    if (inter == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    uint8_t *used = ub.buf;
    Py_ssize_t taken = 0;
    for (Py_ssize_t j = 0; j < g.n; j++)
        taken += used[j] != 0;
    if ((out = PyList_New(d.n)) == NULL)
        goto done;
    for (Py_ssize_t i = 0; i < d.n; i++) {
        if (taken == g.n) {
            Py_INCREF(Py_None);
            PyList_SET_ITEM(out, i, Py_None);
            continue;
        }
        intersect(&d, i, &p, maxid, inter);
        int64_t size_d = d.ptr[i + 1] - d.ptr[i];
        double ta[MAX_TOP];
        int64_t td[MAX_TOP];
        Py_ssize_t tj[MAX_TOP], nt = 0;
        for (Py_ssize_t j = 0; j < g.n; j++) {
            double a = attr_ss(inter[j], size_d, g.ptr[j + 1] - g.ptr[j]);
            inter[j] = 0;
            if (used[j])
                continue;
            int64_t dist = distance(d.vec + 3 * i, g.vec + 3 * j);
            /* columns come in ascending order: a later one enters only if strictly ahead in (a, dist) */
            Py_ssize_t at = nt;
            while (at > 0 && (a > ta[at - 1] || (a == ta[at - 1] && dist < td[at - 1])))
                at--;
            if (at >= topn)
                continue;
            Py_ssize_t last = nt < topn ? nt : topn - 1;
            for (Py_ssize_t m = last; m > at; m--)
                ta[m] = ta[m - 1], td[m] = td[m - 1], tj[m] = tj[m - 1];
            ta[at] = a, td[at] = dist, tj[at] = j;
            if (nt < topn)
                nt++;
        }
        double bs = 0, ba = 0, bb = 0;
        Py_ssize_t bj = -1;
        for (Py_ssize_t c = 0; c < nt; c++) {
            double a = ta[c];
            if (bj >= 0 && (a + 1.0) / 2 <= bs)
                break; /* IBSS <= 1 and Attr SS falls along the order: no later column can score higher */
            if (bj >= 0 && d_len != NULL && (a + ibss_bound(d_len[i], g_len[tj[c]])) / 2 + BOUND_MARGIN <= bs)
                continue; /* this one cannot win; a later one, of other length, still may */
            PyObject *r = PyObject_CallFunction(ibss, "nn", i, tj[c]);
            if (r == NULL)
                goto fail;
            double b = PyFloat_AsDouble(r);
            Py_DECREF(r);
            if (b == -1.0 && PyErr_Occurred())
                goto fail;
            double s = (a + b) / 2;
            if (bj < 0 || s > bs)
                bs = s, ba = a, bb = b, bj = tj[c];
        }
        used[bj] = 1;
        taken++;
        PyObject *t = Py_BuildValue("(nddd)", bj, bs, ba, bb);
        if (t == NULL)
            goto fail;
        PyList_SET_ITEM(out, i, t);
    }
    goto done;
fail:
    Py_CLEAR(out);
done:
    PyMem_Free(inter);
    postings_free(&p);
    if (ub.obj)
        PyBuffer_Release(&ub);
    if (dlb.obj)
        PyBuffer_Release(&dlb);
    if (glb.obj)
        PyBuffer_Release(&glb);
    rows_release(&d);
    rows_release(&g);
    return out;
}

/* attr_matrix(d_ids, d_ptr, g_ids, g_ptr) -> bytes: Attr SS of every (row, column), float64, row-major. */
PyObject *zen_attr_matrix(PyObject *self, PyObject *args)
{
    PyObject *d_ids, *d_ptr, *g_ids, *g_ptr, *out = NULL;
    if (!PyArg_ParseTuple(args, "OOOO", &d_ids, &d_ptr, &g_ids, &g_ptr))
        return NULL;
    Rows d = {0}, g = {0};
    Postings p = {NULL, NULL};
    int64_t maxid = -1, *inter = NULL;
    if (rows_get(&d, d_ids, d_ptr, NULL, &maxid) < 0 || rows_get(&g, g_ids, g_ptr, NULL, &maxid) < 0)
        goto done;
    if (g.n > 0 && d.n > PY_SSIZE_T_MAX / 8 / g.n) {
        PyErr_SetString(PyExc_ValueError, "attr_matrix: too large");
        goto done;
    }
    if (postings_build(&p, &g, maxid) < 0)
        goto done;
    inter = PyMem_Calloc((size_t)g.n + 1, sizeof(int64_t));
    if (inter == NULL || (out = PyBytes_FromStringAndSize(NULL, d.n * g.n * 8)) == NULL) {
        if (inter == NULL)
            PyErr_NoMemory();
        goto done;
    }
    double *m = (double *)PyBytes_AS_STRING(out);
    for (Py_ssize_t i = 0; i < d.n; i++) {
        intersect(&d, i, &p, maxid, inter);
        int64_t size_d = d.ptr[i + 1] - d.ptr[i];
        for (Py_ssize_t j = 0; j < g.n; j++) {
            m[i * g.n + j] = attr_ss(inter[j], size_d, g.ptr[j + 1] - g.ptr[j]);
            inter[j] = 0;
        }
    }
done:
    PyMem_Free(inter);
    postings_free(&p);
    rows_release(&d);
    rows_release(&g);
    return out;
}
