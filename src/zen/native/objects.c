/* The readers of small CPython objects, compiled: what zen.cpython.interp.Interpreter.kind / .str / .read_within and
 * the tuple, bytes and str readers do for one object, in one call instead of a stack of Python frames (a recovery
 * asks ~100,000 times: object headers, names, constants tuples, line tables).
 *
 * Objects(starts, ends, ids, offs, buffers, caches, params) reads the image through the address space's chunk table
 * (AddressSpace.chunk_table: per chunk its virtual range and its place in a backing buffer) and shares the
 * interpreter's caches (caches = (obj_kind, obj_type, kind_cache, str_cache), the Interpreter's own dicts, filled
 * exactly as the Python path fills them). Every method answers None wherever the reference would raise, go through
 * another path or need something this does not know (bytes spanning chunks, a chunk without a buffer, a type whose
 * kind is not cached yet, a str subclass, a non-ASCII str flagged ASCII): the caller then runs the reference, which
 * gives the same answer or the same error. So nothing here raises for bad image data, and each bound the reference
 * checks is checked first (alignment, plausible reference counts and type pointers, lengths against `Limits`, every
 * byte inside its chunk and its buffer).
 *
 *   kind(addr) -> str | None            Interpreter.kind, for an object whose type's kind is cached
 *   read(addr, size) -> bytes | None    Interpreter.read_within's one-chunk case
 *   str(addr) -> str | None             Interpreter.str (readers.text.read_str) for a compact str
 *   strs(addr) -> tuple | None          tuple(ip.str(a) for a in read_tuple(ip, addr))
 *   items(addr, limit) -> list | None   readers.containers.read_tuple
 *   bytes(addr) -> bytes | None         readers.text.read_bytes
 *   code(addr, spec) -> tuple | None    readers.code.read_code's reading (code_object.c, on the helpers in objects.h)
 *   function(addr, spec) -> tuple|None  readers.functions.read_function's reading (functions.c)
 */
#include "objects.h"
#include <string.h>

void obj_done(Reading *r)
{
    if (r->held >= 0)
        PyBuffer_Release(&r->view);
    r->held = -1;
}

/* A pointer to bytes [addr, addr + size) when they lie in one chunk with a buffer; NULL otherwise (no error set) */
const unsigned char *obj_at(Reading *r, uint64_t addr, uint64_t size)
{
    Objects *o = r->o;
    Py_ssize_t lo = 0, hi = o->n;
    while (lo < hi) { /* the first chunk starting above addr */
        Py_ssize_t mid = lo + (hi - lo) / 2;
        if (o->start[mid] <= addr)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == 0)
        return NULL;
    Py_ssize_t i = lo - 1;
    if (addr >= o->end[i] || size > o->end[i] - addr || o->bid[i] < 0)
        return NULL;
    if (r->held != o->bid[i]) {
        obj_done(r);
        if (o->bid[i] >= PyList_GET_SIZE(o->buffers))
            return NULL;
        if (PyObject_GetBuffer(PyList_GET_ITEM(o->buffers, o->bid[i]), &r->view, PyBUF_SIMPLE) < 0) {
            PyErr_Clear(); /* a closed mmap: the reference reports it */
            return NULL;
        }
        r->held = o->bid[i];
    }
    uint64_t pos = (uint64_t)o->boff[i] + (addr - o->start[i]);
    if (o->boff[i] < 0 || pos > (uint64_t)r->view.len || size > (uint64_t)r->view.len - pos)
        return NULL;
    return (const unsigned char *)r->view.buf + pos;
}

/* a + b, or 0 where it would pass the last address (an object near the top of the space: the reference's read fails) */
int obj_plus(uint64_t a, uint64_t b, uint64_t *out) { return !__builtin_add_overflow(a, b, out); }

int obj_word(Reading *r, uint64_t addr, uint64_t *out)
{
    const unsigned char *p = obj_at(r, addr, 8);
    if (p == NULL)
        return 0;
    memcpy(out, p, 8);
    return 1;
}

/* Interpreter.kind: 1 with *kind (borrowed from the caches) when answered, 0 when the reference must, -1 on error */
int obj_kind_of(Reading *r, uint64_t addr, PyObject *key, PyObject **kind)
{
    Objects *o = r->o;
    PyObject *k = PyDict_GetItemWithError(o->obj_kind, key);
    if (k != NULL || PyErr_Occurred()) {
        *kind = k;
        return k != NULL ? 1 : -1;
    }
    PyObject *tpo = PyDict_GetItemWithError(o->obj_type, key), *tkey;
    if (tpo != NULL) {
        tkey = Py_NewRef(tpo);
    } else {
        if (PyErr_Occurred())
            return -1;
        uint64_t rc, tp;
        uint64_t second;
        if (addr == 0 || addr & 7 || !obj_plus(addr, 8, &second) || !obj_word(r, addr, &rc) || !obj_word(r, second, &tp))
            return 0;
        rc &= o->p[P_RC_MASK];
        if (rc == 0 || rc > o->p[P_MAX_REFCNT] || tp == 0 || tp & 7)
            return 0;
        if ((tkey = PyLong_FromUnsignedLongLong(tp)) == NULL)
            return -1;
    }
    k = PyDict_GetItemWithError(o->kind_cache, tkey); /* in the cache: check_type passes without reading */
    if (k == NULL) {
        Py_DECREF(tkey);
        return PyErr_Occurred() ? -1 : 0;
    }
    if ((tpo == NULL && PyDict_SetItem(o->obj_type, key, tkey) < 0) || PyDict_SetItem(o->obj_kind, key, k) < 0) {
        Py_DECREF(tkey);
        return -1;
    }
    Py_DECREF(tkey);
    *kind = k;
    return 1;
}

/* 1 when the object's kind is `want`, 0 when not answered or another kind, -1 on error */
int obj_is_kind(Reading *r, uint64_t addr, PyObject *key, const char *want)
{
    PyObject *k;
    int got = obj_kind_of(r, addr, key, &k);
    if (got <= 0)
        return got;
    return PyUnicode_Check(k) && PyUnicode_CompareWithASCIIString(k, want) == 0;
}

int obj_address(PyObject *arg, uint64_t *addr)
{
    if (!PyLong_Check(arg))
        return 0;
    *addr = PyLong_AsUnsignedLongLong(arg);
    if (*addr == (uint64_t)-1 && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    return 1;
}

/* the size word of a variable-size object, within [0, most]; 0 when not answered */
int obj_size_of(Reading *r, uint64_t addr, uint64_t most, uint64_t *n)
{
    uint64_t field;
    if (!obj_plus(addr, r->o->p[P_OB_SIZE], &field) || !obj_word(r, field, n))
        return 0;
    return (int64_t)*n >= 0 && *n <= most;
}

PyObject *obj_str_at(Reading *r, uint64_t addr, PyObject *key)
{
    Objects *o = r->o;
    PyObject *s = PyDict_GetItemWithError(o->str_cache, key);
    if (s != NULL)
        return Py_NewRef(s);
    if (PyErr_Occurred())
        return NULL;
    int ok = obj_is_kind(r, addr, key, "str");
    if (ok <= 0)
        return ok < 0 ? NULL : Py_NewRef(Py_None);
    const unsigned char *head = obj_at(r, addr, o->p[P_U_STATE] + 4);
    if (head == NULL)
        Py_RETURN_NONE;
    int64_t length;
    uint32_t state;
    memcpy(&length, head + o->p[P_U_LENGTH], 8);
    memcpy(&state, head + o->p[P_U_STATE], 4);
    unsigned kind = (state >> o->p[P_KIND_SHIFT]) & 7;
    int compact = (state >> o->p[P_COMPACT_BIT]) & 1, ascii = (state >> o->p[P_ASCII_BIT]) & 1;
    if (length < 0 || (uint64_t)length > o->p[P_MAX_STR] || length > (PY_SSIZE_T_MAX >> 2) || !compact ||
        (kind != 1 && kind != 2 && kind != 4))
        Py_RETURN_NONE; /* refused or a str subclass's separate data: the reference */
    uint64_t where;
    const unsigned char *data = obj_plus(addr, ascii ? o->p[P_U_ASCII] : o->p[P_U_COMPACT], &where)
                                    ? obj_at(r, where, (uint64_t)length * kind) : NULL;
    if (data == NULL)
        Py_RETURN_NONE;
    if (ascii && kind == 1)
        s = PyUnicode_DecodeASCII((const char *)data, length, NULL);
    else
        s = PyUnicode_Decode((const char *)data, length * kind, kind == 1 ? "latin-1" : kind == 2 ? "utf-16-le" : "utf-32-le",
                             "surrogatepass");
    if (s == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError))
            return NULL;
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    if (PyDict_SetItem(o->str_cache, key, s) < 0)
        Py_CLEAR(s);
    return s;
}

/* the element addresses of a tuple of at most `most` items; Py_None when not answered */
PyObject *obj_items_at(Reading *r, uint64_t addr, PyObject *key, uint64_t most)
{
    int ok = obj_is_kind(r, addr, key, "tuple");
    uint64_t n;
    if (ok <= 0)
        return ok < 0 ? NULL : Py_NewRef(Py_None);
    uint64_t first;
    if (!obj_size_of(r, addr, most, &n) || n > (UINT64_MAX >> 4) || !obj_plus(addr, r->o->p[P_TUPLE_ITEMS], &first))
        Py_RETURN_NONE;
    const unsigned char *p = n ? obj_at(r, first, 8 * n) : NULL;
    if (n && p == NULL)
        Py_RETURN_NONE;
    PyObject *out = PyList_New((Py_ssize_t)n);
    for (uint64_t i = 0; out != NULL && i < n; i++) {
        uint64_t w;
        memcpy(&w, p + 8 * i, 8);
        PyObject *v = PyLong_FromUnsignedLongLong(w);
        if (v == NULL)
            Py_CLEAR(out);
        else
            PyList_SET_ITEM(out, (Py_ssize_t)i, v);
    }
    return out;
}

typedef PyObject *(*Method)(Reading *, uint64_t, PyObject *, PyObject *);

/* parse the address, make the key the caches use, run `m` with one Reading, release */
static PyObject *with_reading(Objects *o, PyObject *arg, PyObject *extra, Method m)
{
    uint64_t addr;
    if (!obj_address(arg, &addr))
        Py_RETURN_NONE;
    Reading r = {o, -1};
    PyObject *out = m(&r, addr, arg, extra);
    obj_done(&r);
    return out;
}

static PyObject *m_kind(Reading *r, uint64_t addr, PyObject *key, PyObject *extra)
{
    PyObject *k;
    int got = obj_kind_of(r, addr, key, &k);
    return got < 0 ? NULL : Py_NewRef(got ? k : Py_None);
}

static PyObject *m_str(Reading *r, uint64_t addr, PyObject *key, PyObject *extra) { return obj_str_at(r, addr, key); }

static PyObject *m_items(Reading *r, uint64_t addr, PyObject *key, PyObject *limit)
{
    uint64_t most = r->o->p[P_MAX_ITEMS];
    if (limit != NULL && limit != Py_None) { /* read_tuple's `limit or ip.limits.max_items` */
        if (!PyLong_Check(limit))
            Py_RETURN_NONE;
        int overflow;
        long long v = PyLong_AsLongLongAndOverflow(limit, &overflow);
        if (overflow || (v == -1 && PyErr_Occurred())) {
            PyErr_Clear();
            Py_RETURN_NONE;
        }
        if (v != 0) {
            if (v < 0)
                Py_RETURN_NONE;
            most = (uint64_t)v;
        }
    }
    return obj_items_at(r, addr, key, most);
}

PyObject *obj_strs_at(Reading *r, uint64_t addr, PyObject *key, PyObject *extra)
{
    PyObject *items = obj_items_at(r, addr, key, r->o->p[P_MAX_ITEMS]);
    if (items == NULL || items == Py_None)
        return items;
    Py_ssize_t n = PyList_GET_SIZE(items);
    PyObject *out = PyTuple_New(n);
    for (Py_ssize_t i = 0; out != NULL && i < n; i++) {
        PyObject *a = PyList_GET_ITEM(items, i);
        uint64_t sa = PyLong_AsUnsignedLongLong(a); /* made here from a u64: cannot fail */
        PyObject *s = obj_str_at(r, sa, a);
        if (s == NULL || s == Py_None) {
            Py_CLEAR(out);
            if (s != NULL)
                out = s; /* not answered: Py_None for the whole tuple */
            break;
        }
        PyTuple_SET_ITEM(out, i, s);
    }
    Py_DECREF(items);
    return out;
}

PyObject *obj_bytes_at(Reading *r, uint64_t addr, PyObject *key, PyObject *extra)
{
    int ok = obj_is_kind(r, addr, key, "bytes");
    uint64_t n;
    if (ok <= 0)
        return ok < 0 ? NULL : Py_NewRef(Py_None);
    uint64_t data;
    if (!obj_size_of(r, addr, r->o->p[P_MAX_BYTES], &n) || !obj_plus(addr, r->o->p[P_BYTES_SVAL], &data))
        Py_RETURN_NONE;
    const unsigned char *p = obj_at(r, data, n);
    return p == NULL ? Py_NewRef(Py_None) : PyBytes_FromStringAndSize((const char *)p, (Py_ssize_t)n);
}

static PyObject *o_kind(Objects *o, PyObject *arg) { return with_reading(o, arg, NULL, m_kind); }
static PyObject *o_str(Objects *o, PyObject *arg) { return with_reading(o, arg, NULL, m_str); }
static PyObject *o_strs(Objects *o, PyObject *arg) { return with_reading(o, arg, NULL, obj_strs_at); }
static PyObject *o_bytes(Objects *o, PyObject *arg) { return with_reading(o, arg, NULL, obj_bytes_at); }

static PyObject *o_items(Objects *o, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "items(addr, limit)");
        return NULL;
    }
    return with_reading(o, args[0], args[1], m_items);
}

static PyObject *o_read(Objects *o, PyObject *const *args, Py_ssize_t nargs)
{
    uint64_t addr, size;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "read(addr, size)");
        return NULL;
    }
    if (!obj_address(args[0], &addr) || !obj_address(args[1], &size))
        Py_RETURN_NONE; /* a negative size: the reference's error */
    Reading r = {o, -1};
    const unsigned char *p = obj_at(&r, addr, size);
    PyObject *out = p == NULL ? Py_NewRef(Py_None) : PyBytes_FromStringAndSize((const char *)p, (Py_ssize_t)size);
    obj_done(&r);
    return out;
}

PyObject *obj_spec_call(Objects *o, PyObject *const *args, Py_ssize_t nargs, Py_ssize_t count, const char *usage,
                        SpecReader reader)
{
    int64_t s[OBJ_SPEC_MAX];
    if (nargs != 2 || count > OBJ_SPEC_MAX || !PyBytes_Check(args[1]) || PyBytes_GET_SIZE(args[1]) != count * 8) {
        PyErr_Format(PyExc_TypeError, "%s: spec is the layout's offsets as int64 bytes", usage);
        return NULL;
    }
    memcpy(s, PyBytes_AS_STRING(args[1]), (size_t)count * 8);
    uint64_t addr;
    if (!obj_address(args[0], &addr))
        Py_RETURN_NONE;
    Reading r = {o, -1};
    PyObject *out = reader(&r, addr, args[0], s);
    obj_done(&r);
    return out;
}

static int copy_array(PyObject *arr, Py_ssize_t n, void **out)
{
    Py_buffer v;
    if (PyObject_GetBuffer(arr, &v, PyBUF_C_CONTIGUOUS) < 0)
        return -1;
    int ok = v.len == n * 8;
    if (ok && (*out = PyMem_Malloc(n ? (size_t)n * 8 : 1)) != NULL)
        memcpy(*out, v.buf, (size_t)n * 8);
    PyBuffer_Release(&v);
    if (!ok)
        PyErr_SetString(PyExc_ValueError, "chunk table arrays of different lengths");
    return ok && *out != NULL ? 0 : -1;
}

static PyObject *o_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    PyObject *starts, *ends, *ids, *offs, *buffers, *caches, *params;
    if (!PyArg_ParseTuple(args, "OOOOO!O!O!", &starts, &ends, &ids, &offs, &PyList_Type, &buffers, &PyTuple_Type,
                          &caches, &PyTuple_Type, &params))
        return NULL;
    if (PyTuple_GET_SIZE(caches) != 4 || PyTuple_GET_SIZE(params) != P_COUNT) {
        PyErr_SetString(PyExc_ValueError, "Objects: caches is 4 dicts, params the layout's numbers");
        return NULL;
    }
    for (int i = 0; i < 4; i++)
        if (!PyDict_CheckExact(PyTuple_GET_ITEM(caches, i))) {
            PyErr_SetString(PyExc_TypeError, "Objects: the caches are dicts");
            return NULL;
        }
    Py_ssize_t n = PyObject_Length(starts);
    if (n < 0)
        return NULL;
    Objects *o = (Objects *)type->tp_alloc(type, 0);
    if (o == NULL)
        return NULL;
    o->n = n;
    for (int i = 0; i < P_COUNT; i++) {
        o->p[i] = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(params, i));
        if (PyErr_Occurred()) {
            Py_DECREF(o);
            return NULL;
        }
    }
    if (copy_array(starts, n, (void **)&o->start) < 0 || copy_array(ends, n, (void **)&o->end) < 0 ||
        copy_array(ids, n, (void **)&o->bid) < 0 || copy_array(offs, n, (void **)&o->boff) < 0) {
        Py_DECREF(o);
        return NULL;
    }
    o->buffers = Py_NewRef(buffers);
    o->obj_kind = Py_NewRef(PyTuple_GET_ITEM(caches, 0));
    o->obj_type = Py_NewRef(PyTuple_GET_ITEM(caches, 1));
    o->kind_cache = Py_NewRef(PyTuple_GET_ITEM(caches, 2));
    o->str_cache = Py_NewRef(PyTuple_GET_ITEM(caches, 3));
    return (PyObject *)o;
}

static void o_dealloc(Objects *o)
{
    PyMem_Free(o->start), PyMem_Free(o->end), PyMem_Free(o->bid), PyMem_Free(o->boff);
    Py_XDECREF(o->buffers), Py_XDECREF(o->obj_kind), Py_XDECREF(o->obj_type);
    Py_XDECREF(o->kind_cache), Py_XDECREF(o->str_cache);
    Py_TYPE(o)->tp_free((PyObject *)o);
}

static PyMethodDef o_methods[] = {
    {"kind", (PyCFunction)o_kind, METH_O, "kind(addr) -> str | None: Interpreter.kind where the type's kind is cached"},
    {"read", (PyCFunction)(void (*)(void))o_read, METH_FASTCALL, "read(addr, size) -> bytes | None: one chunk's bytes"},
    {"str", (PyCFunction)o_str, METH_O, "str(addr) -> str | None: a compact str (Interpreter.str)"},
    {"strs", (PyCFunction)o_strs, METH_O, "strs(addr) -> tuple | None: a tuple of compact strs"},
    {"items", (PyCFunction)(void (*)(void))o_items, METH_FASTCALL, "items(addr, limit) -> list | None: read_tuple"},
    {"bytes", (PyCFunction)o_bytes, METH_O, "bytes(addr) -> bytes | None: read_bytes"},
    {"code", (PyCFunction)(void (*)(void))zen_objects_code, METH_FASTCALL,
     "code(addr, spec) -> tuple | None: read_code's reading of a 3.11+ code object (code_object.c)"},
    {"function", (PyCFunction)(void (*)(void))zen_objects_function, METH_FASTCALL,
     "function(addr, spec) -> tuple | None: read_function's reading (functions.c)"},
    {NULL, NULL, 0, NULL},
};

PyTypeObject zen_objects_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "zen.native._core.Objects",
    .tp_basicsize = sizeof(Objects),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Objects(starts, ends, ids, offs, buffers, caches, params): small CPython objects read from an image",
    .tp_new = o_new,
    .tp_dealloc = (destructor)o_dealloc,
    .tp_methods = o_methods,
};
