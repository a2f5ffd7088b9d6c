/* zen.cpython.code.canonical_marshal._Rewriter, compiled. Every function answers a node id (>= 0), -1 with a Python
 * error set, or FALLBACK: the data is not what this rewrites (malformed, too deep, past the expansion budget, or a
 * form the reference reads its own way); the caller then runs the reference, which gives its exact answer or error.
 * So this never has to reproduce an error message, only the bytes of the data it accepts. */
#include "marshal.h"

static int push(Py_ssize_t **arr, Py_ssize_t *n, Py_ssize_t *cap, Py_ssize_t v)
{
    if (*n == *cap) {
        Py_ssize_t c = *cap ? *cap * 2 : 256;
        Py_ssize_t *a = PyMem_Realloc(*arr, (size_t)c * sizeof(Py_ssize_t));
        if (a == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        *arr = a;
        *cap = c;
    }
    (*arr)[(*n)++] = v;
    return 0;
}

static int32_t i32_at(const unsigned char *p)
{
    return (int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
}

int zen_is_singleton(int t) { return t == 'N' || t == 'F' || t == 'T' || t == '.' || t == 'S'; }

/* count a new container's children and bound its height, as the reference's _children: 0, or FALLBACK */
static Py_ssize_t children_of(Rw *rw, Py_ssize_t n, PyObject *key)
{
    Py_ssize_t h = -1;
    for (Py_ssize_t i = 1; i < PyTuple_GET_SIZE(key); i++) {
        PyObject *c = PyTuple_GET_ITEM(key, i);
        if (PyLong_CheckExact(c)) {
            Py_ssize_t id = PyLong_AsSsize_t(c);
            rw->counts[id]++;
            if (rw->heights[id] > h)
                h = rw->heights[id];
        }
    }
    if (h + 1 > rw->max_depth)
        return FALLBACK;
    rw->heights[n] = h + 1;
    return 0;
}

/* the node of `key` (a new reference, consumed): found, or added with its children counted */
static Py_ssize_t node(Rw *rw, PyObject *key, int children)
{
    if (key == NULL)
        return -1;
    PyObject *hit = PyDict_GetItemWithError(rw->ids, key);
    if (hit != NULL) {
        Py_DECREF(key);
        return PyLong_AsSsize_t(hit);
    }
    if (PyErr_Occurred()) {
        Py_DECREF(key);
        return -1;
    }
    Py_ssize_t n = PyList_GET_SIZE(rw->nodes);
    PyObject *id = PyLong_FromSsize_t(n);
    if (id == NULL || PyList_Append(rw->nodes, key) < 0 || PyDict_SetItem(rw->ids, key, id) < 0 ||
        push(&rw->counts, &rw->ncounts, &rw->capcounts, 0) < 0 ||
        push(&rw->heights, &rw->nheights, &rw->capheights, 0) < 0) {
        Py_XDECREF(id);
        Py_DECREF(key);
        return -1;
    }
    Py_DECREF(id);
    Py_ssize_t r = children ? children_of(rw, n, key) : 0;
    Py_DECREF(key);
    return r == 0 ? n : r;
}

static Py_ssize_t slotted(Rw *rw, Py_ssize_t n, Py_ssize_t slot)
{
    if (n >= 0 && slot >= 0)
        rw->refs[slot] = n;
    return n;
}

static Py_ssize_t scalar(Rw *rw, int t, const unsigned char *payload, Py_ssize_t size, Py_ssize_t slot)
{
    PyObject *key = PyBytes_FromStringAndSize(NULL, size + 1);
    if (key == NULL)
        return -1;
    char *k = PyBytes_AS_STRING(key);
    k[0] = (char)t;
    memcpy(k + 1, payload, (size_t)size);
    return slotted(rw, node(rw, key, 0), slot);
}

static const char name_chars[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_";

static Py_ssize_t string(Rw *rw, Py_ssize_t at, Py_ssize_t size, Py_ssize_t slot)
{
    const unsigned char *raw = rw->data + at;
    int interned = 1;
    for (Py_ssize_t i = 0; i < size && interned; i++)
        interned = raw[i] != 0 && strchr(name_chars, raw[i]) != NULL;
    rw->pos = at + size;
    PyObject *key = PyBytes_FromStringAndSize(NULL, size + (size < 256 ? 2 : 5));
    if (key == NULL)
        return -1;
    unsigned char *k = (unsigned char *)PyBytes_AS_STRING(key);
    if (size < 256) {
        k[0] = interned ? 0x5A : 0x7A;
        k[1] = (unsigned char)size;
        memcpy(k + 2, raw, (size_t)size);
    } else {
        k[0] = interned ? 0x41 : 0x61;
        for (int j = 0; j < 4; j++)
            k[1 + j] = (unsigned char)((uint32_t)size >> (8 * j));
        memcpy(k + 5, raw, (size_t)size);
    }
    return slotted(rw, node(rw, key, 0), slot);
}

static PyObject *head_bytes(int t, int32_t size)
{
    unsigned char h[5] = {(unsigned char)t};
    for (int j = 0; j < 4; j++)
        h[1 + j] = (unsigned char)((uint32_t)size >> (8 * j));
    return PyBytes_FromStringAndSize((const char *)h, 5);
}

static PyObject *expanded(Rw *rw, Py_ssize_t n);

/* sort `ids` (a list of node ids) by their expanded encodings, stably: (encoding, position, id) tuples */
static int sort_items(Rw *rw, PyObject *ids)
{
    Py_ssize_t m = PyList_GET_SIZE(ids);
    PyObject *keyed = PyList_New(m);
    if (keyed == NULL)
        return -1;
    for (Py_ssize_t i = 0; i < m; i++) {
        PyObject *e = expanded(rw, PyLong_AsSsize_t(PyList_GET_ITEM(ids, i)));
        if (e == NULL) {
            Py_DECREF(keyed);
            return -1;
        }
        PyObject *t = Py_BuildValue("(NnO)", e, i, PyList_GET_ITEM(ids, i));
        if (t == NULL) {
            Py_DECREF(keyed);
            return -1;
        }
        PyList_SET_ITEM(keyed, i, t);
    }
    if (PyList_Sort(keyed) < 0) {
        Py_DECREF(keyed);
        return -1;
    }
    for (Py_ssize_t i = 0; i < m; i++)
        PyList_SetItem(ids, i, Py_NewRef(PyTuple_GET_ITEM(PyList_GET_ITEM(keyed, i), 2)));
    Py_DECREF(keyed);
    return 0;
}

/* a fallback raised through Python's error machinery: a private exception caught at the top */
PyObject *zen_fallback;

int zen_canonical_init(void)
{
    zen_fallback = PyErr_NewException("zen.native._core.Fallback", NULL, NULL);
    return zen_fallback == NULL ? -1 : 0;
}

static PyObject *expanded(Rw *rw, Py_ssize_t n)
{
    PyObject *id = PyLong_FromSsize_t(n);
    if (id == NULL)
        return NULL;
    PyObject *hit = PyDict_GetItemWithError(rw->expanded, id);
    if (hit != NULL || PyErr_Occurred()) {
        Py_DECREF(id);
        return hit ? Py_NewRef(hit) : NULL;
    }
    PyObject *key = PyList_GET_ITEM(rw->nodes, n);
    if (PyBytes_CheckExact(key)) {
        Py_DECREF(id);
        return Py_NewRef(key);
    }
    Py_ssize_t m = PyTuple_GET_SIZE(key), total = 0;
    PyObject *parts = PyList_New(m);
    if (parts == NULL) {
        Py_DECREF(id);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < m; i++) {
        PyObject *k = PyTuple_GET_ITEM(key, i);
        PyObject *e = PyBytes_CheckExact(k) ? Py_NewRef(k) : expanded(rw, PyLong_AsSsize_t(k));
        if (e == NULL) {
            Py_DECREF(parts);
            Py_DECREF(id);
            return NULL;
        }
        total += PyBytes_GET_SIZE(e);
        PyList_SET_ITEM(parts, i, e);
    }
    rw->budget -= total;
    if (rw->budget < 0) {
        Py_DECREF(parts);
        Py_DECREF(id);
        PyErr_SetNone(zen_fallback);
        return NULL;
    }
    PyObject *joined = PyBytes_FromStringAndSize(NULL, total);
    if (joined != NULL) {
        char *at = PyBytes_AS_STRING(joined);
        for (Py_ssize_t i = 0; i < m; i++) {
            PyObject *e = PyList_GET_ITEM(parts, i);
            memcpy(at, PyBytes_AS_STRING(e), (size_t)PyBytes_GET_SIZE(e));
            at += PyBytes_GET_SIZE(e);
        }
    }
    Py_DECREF(parts);
    if (joined == NULL || PyDict_SetItem(rw->expanded, id, joined) < 0) {
        Py_XDECREF(joined);
        Py_DECREF(id);
        return NULL;
    }
    Py_DECREF(id);
    return joined;
}


/* `count` items parsed into a new list of ids (NULL: error or fallback, as `*r` says) */
static PyObject *items(Rw *rw, Py_ssize_t count, Py_ssize_t depth, Py_ssize_t *r)
{
    PyObject *ids = PyList_New(0);
    *r = -1;
    if (ids == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < count; i++) {
        Py_ssize_t c = zen_parse(rw, depth + 1);
        PyObject *id = c >= 0 ? PyLong_FromSsize_t(c) : NULL;
        if (id == NULL || PyList_Append(ids, id) < 0) {
            Py_XDECREF(id);
            Py_DECREF(ids);
            *r = c == FALLBACK ? FALLBACK : -1;
            return NULL;
        }
        Py_DECREF(id);
    }
    return ids;
}

/* (head, *ids, tail?) as a tuple; consumes head and ids */
static PyObject *keyed(PyObject *head, PyObject *ids, PyObject *tail)
{
    if (head == NULL || ids == NULL) {
        Py_XDECREF(head);
        Py_XDECREF(ids);
        Py_XDECREF(tail);
        return NULL;
    }
    Py_ssize_t m = PyList_GET_SIZE(ids);
    PyObject *key = PyTuple_New(1 + m + (tail != NULL));
    if (key != NULL) {
        PyTuple_SET_ITEM(key, 0, Py_NewRef(head));
        for (Py_ssize_t i = 0; i < m; i++)
            PyTuple_SET_ITEM(key, 1 + i, Py_NewRef(PyList_GET_ITEM(ids, i)));
        if (tail != NULL)
            PyTuple_SET_ITEM(key, 1 + m, Py_NewRef(tail));
    }
    Py_DECREF(head);
    Py_DECREF(ids);
    Py_XDECREF(tail);
    return key;
}

/* a list, set or dict: never shared, so never looked up (the reference files it under a unique key) */
static Py_ssize_t mutable_node(Rw *rw, PyObject *parts, Py_ssize_t slot)
{
    if (parts == NULL)
        return -1;
    Py_ssize_t n = PyList_GET_SIZE(rw->nodes);
    if (PyList_Append(rw->nodes, parts) < 0 || push(&rw->counts, &rw->ncounts, &rw->capcounts, 0) < 0 ||
        push(&rw->heights, &rw->nheights, &rw->capheights, 0) < 0) {
        Py_DECREF(parts);
        return -1;
    }
    Py_ssize_t r = children_of(rw, n, parts);
    Py_DECREF(parts);
    return r == 0 ? slotted(rw, n, slot) : r;
}

Py_ssize_t zen_parse(Rw *rw, Py_ssize_t depth)
{
    if (depth > rw->max_depth || rw->pos >= rw->len)
        return FALLBACK;
    const unsigned char *d = rw->data;
    Py_ssize_t len = rw->len, p = rw->pos + 1, slot = -1, r;
    int code = d[rw->pos], t = code & 0x7F;
    if (code & FLAG_REF) {
        slot = rw->nrefs;
        if (push(&rw->refs, &rw->nrefs, &rw->caprefs, -1) < 0)
            return -1;
    }
    if (zen_is_singleton(t)) {
        rw->pos = p;
        char b = (char)t;
        return node(rw, PyBytes_FromStringAndSize(&b, 1), 0);
    }
#define NEED(n) if ((n) > len) return FALLBACK
    switch (t) {
    case 'r': {
        NEED(p + 4);
        int32_t i = i32_at(d + p);
        rw->pos = p + 4;
        if (i < 0 || i >= rw->nrefs || rw->refs[i] < 0)
            return FALLBACK;
        return rw->refs[i];
    }
    case 'z': case 'Z': {
        NEED(p + 1);
        Py_ssize_t size = d[p];
        NEED(p + 1 + size);
        return string(rw, p + 1, size, slot);
    }
    case 'a': case 'A': case 'u': case 't': {
        NEED(p + 4);
        Py_ssize_t size = i32_at(d + p);
        if (size < 0)
            return FALLBACK;
        NEED(p + 4 + size);
        if (t == 'a' || t == 'A')
            return string(rw, p + 4, size, slot);
        PyObject *u = PyUnicode_DecodeUTF8((const char *)d + p + 4, size, "surrogatepass");
        if (u == NULL) {
            PyErr_Clear();
            return FALLBACK;
        }
        Py_DECREF(u);
        int ascii = 1;
        for (Py_ssize_t i = 0; i < size && ascii; i++)
            ascii = d[p + 4 + i] < 0x80;
        if (ascii)
            return string(rw, p + 4, size, slot);
        rw->pos = p + 4 + size;
        return scalar(rw, 0x75, d + p, 4 + size, slot);
    }
    case 'i': case 'g': case 'y': {
        Py_ssize_t size = t == 'i' ? 4 : t == 'g' ? 8 : 16;
        NEED(p + size);
        rw->pos = p + size;
        return scalar(rw, t, d + p, size, slot);
    }
    case 'l': {
        NEED(p + 4);
        long long n = i32_at(d + p);
        long long end = p + 4 + 2 * (n < 0 ? -n : n);
        NEED(end);
        rw->pos = (Py_ssize_t)end;
        return scalar(rw, t, d + p, (Py_ssize_t)end - p, slot);
    }
    case 's': {
        NEED(p + 4);
        Py_ssize_t size = i32_at(d + p);
        if (size < 0)
            return FALLBACK;
        NEED(p + 4 + size);
        rw->pos = p + 4 + size;
        return scalar(rw, t, d + p, 4 + size, slot);
    }
    case '(': case ')': case '>': case '[': case '<': {
        Py_ssize_t size;
        if (t == ')') {
            NEED(p + 1);
            size = d[p];
            rw->pos = p + 1;
        } else {
            NEED(p + 4);
            size = i32_at(d + p);
            rw->pos = p + 4;
        }
        if (size < 0 || size > len - rw->pos) /* every item takes at least one byte */
            return FALLBACK;
        PyObject *ids = items(rw, size, depth, &r);
        if (ids == NULL)
            return r;
        if ((t == '>' || t == '<') && sort_items(rw, ids) < 0) {
            Py_DECREF(ids);
            return -1;
        }
        if (t == '[' || t == '<')
            return mutable_node(rw, keyed(head_bytes(t, (int32_t)size), ids, NULL), slot);
        PyObject *head;
        if (t == '>')
            head = head_bytes('>', (int32_t)size);
        else if (size < 256) {
            char h[2] = {')', (char)size};
            head = PyBytes_FromStringAndSize(h, 2);
        } else
            head = head_bytes('(', (int32_t)size);
        return slotted(rw, node(rw, keyed(head, ids, NULL), 1), slot);
    }
    case 'c': case ':': {
        rw->pos = p;
        PyObject *ids = PyList_New(0);
        if (ids == NULL)
            return -1;
        Py_ssize_t nfields = t == 'c' ? rw->nlayout : 3;
        for (Py_ssize_t f = 0; f < nfields; f++) {
            PyObject *item;
            if (t == 'c' && rw->layout[f] == 'L') {
                if (rw->pos + 4 > len) {
                    Py_DECREF(ids);
                    return FALLBACK;
                }
                item = PyBytes_FromStringAndSize((const char *)d + rw->pos, 4);
                rw->pos += 4;
            } else {
                Py_ssize_t c = zen_parse(rw, depth + 1);
                if (c < 0) {
                    Py_DECREF(ids);
                    return c;
                }
                item = PyLong_FromSsize_t(c);
            }
            if (item == NULL || PyList_Append(ids, item) < 0) {
                Py_XDECREF(item);
                Py_DECREF(ids);
                return -1;
            }
            Py_DECREF(item);
        }
        char h = (char)t;
        return slotted(rw, node(rw, keyed(PyBytes_FromStringAndSize(&h, 1), ids, NULL), 1), slot);
    }
    case '{': {
        rw->pos = p;
        PyObject *ids = PyList_New(0);
        if (ids == NULL)
            return -1;
        for (;;) {
            if (rw->pos >= len) {
                Py_DECREF(ids);
                return FALLBACK;
            }
            if (d[rw->pos] == 0x30)
                break;
            for (int kv = 0; kv < 2; kv++) {
                Py_ssize_t c = zen_parse(rw, depth + 1);
                PyObject *id = c >= 0 ? PyLong_FromSsize_t(c) : NULL;
                if (id == NULL || PyList_Append(ids, id) < 0) {
                    Py_XDECREF(id);
                    Py_DECREF(ids);
                    return c == FALLBACK ? FALLBACK : -1;
                }
                Py_DECREF(id);
            }
        }
        rw->pos += 1;
        return mutable_node(rw, keyed(PyBytes_FromStringAndSize("{", 1), ids, PyBytes_FromStringAndSize("0", 1)), slot);
    }
    default:
        return FALLBACK;
    }
#undef NEED
}

