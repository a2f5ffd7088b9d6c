/* A code object (3.11+) read in one call: zen.cpython.readers.code.read_code's reading, compiled.
 *
 * The closure walk reads every code object of the model's code (~4,500 in a GPT-2 process) and each read was some
 * twenty Python-level steps (the header, the size, a struct unpack, two name tuples, three bytes objects, the
 * constants, three strs, the local-variable kinds): ~35 us each. Here those steps go through the same bounded
 * helpers as the Objects methods (objects.c) and share the interpreter's caches; what stays in Python is what the
 * reference does after reading (undoing instrumentation and specialisation, building the CodeInfo).
 *
 *   Objects.code(addr, spec) -> tuple | None
 *
 * spec: bytes of S_COUNT little-endian int64 (zen.cpython.readers.code._native_spec: the profile's offsets). The
 * tuple holds CodeInfo's fields from argcount to adaptive in their order, then quickened (bool), varnames, cellvars
 * and freevars. None wherever the reference would raise or read through another path (an object that is not a
 * plain code object, a size outside (0, max_code_units], bytes outside one chunk, a name that is no compact str,
 * counts the reference refuses): the reference then runs and gives the same answer or the same error.
 */
#include "objects.h"
#include <string.h>

enum { S_ADAPTIVE, S_UNIT, S_MAX_UNITS, S_WARMUP, S_INTS, S_PTRS = S_INTS + 16, S_LOCAL = S_PTRS + 9, S_CELL, S_FREE,
       S_COUNT };
enum { N_INTS = 8, N_PTRS = 9 };                            /* argcount ... nlocalsplus; consts ... exceptiontable */
enum { F_CONSTS, F_NAMES, F_LPNAMES, F_LPKINDS, F_FILENAME, F_NAME, F_QUALNAME, F_LINETABLE, F_EXCTABLE };
enum { I_ARGCOUNT = 0, I_NLOCALSPLUS = 7 };

/* a little-endian integer of `size` bytes (1, 2, 4, 8), signed or not; 0 for a size the reference cannot unpack */
static int scalar(const unsigned char *p, int64_t code, int64_t *out)
{
    int64_t size = code >> 1, sign = code & 1;
    uint64_t u = 0;
    if (size != 1 && size != 2 && size != 4 && size != 8)
        return 0;
    for (int64_t i = size - 1; i >= 0; i--)
        u = (u << 8) | p[i];
    if (sign && size < 8 && (u >> (8 * size - 1)) & 1)
        u |= ~(uint64_t)0 << (8 * size);
    *out = (int64_t)u;
    return 1;
}

/* the names whose kind byte has `bit` set, in order (CodeInfo.varnames / cellvars / freevars) */
static PyObject *names_with(PyObject *names, PyObject *kinds, int64_t bit)
{
    Py_ssize_t n = PyTuple_GET_SIZE(names), m = 0;
    const unsigned char *k = (const unsigned char *)PyBytes_AS_STRING(kinds);
    for (Py_ssize_t i = 0; i < n; i++)
        m += (k[i] & bit) != 0;
    PyObject *out = PyTuple_New(m);
    for (Py_ssize_t i = 0, j = 0; out != NULL && i < n; i++)
        if (k[i] & bit)
            PyTuple_SET_ITEM(out, j++, Py_NewRef(PyTuple_GET_ITEM(names, i)));
    return out;
}

/* the object at a pointer field read by `m`, with the address's int as the caches' key */
static PyObject *field(Reading *r, uint64_t addr, PyObject *(*m)(Reading *, uint64_t, PyObject *, PyObject *))
{
    PyObject *key = PyLong_FromUnsignedLongLong(addr);
    if (key == NULL)
        return NULL;
    PyObject *out = m(r, addr, key, NULL);
    Py_DECREF(key);
    return out;
}

static PyObject *str_field(Reading *r, uint64_t addr, PyObject *key, PyObject *extra) { return obj_str_at(r, addr, key); }

static PyObject *items_field(Reading *r, uint64_t addr, PyObject *key, PyObject *extra)
{
    return obj_items_at(r, addr, key, r->o->p[P_MAX_ITEMS]);
}

/* the 18 read fields (argcount ... adaptive); objs receives new references, *answered 0 when the reference must */
static int read_fields(Reading *r, uint64_t addr, PyObject *key, const int64_t *s, PyObject **objs, int *answered,
                       int *quickened)
{
    int ok = obj_is_kind(r, addr, key, "code");
    *answered = 0;
    if (ok <= 0)
        return ok;
    uint64_t at_size, units, total;
    if (!obj_plus(addr, r->o->p[P_OB_SIZE], &at_size) || !obj_word(r, at_size, &units))
        return 0;
    if ((int64_t)units <= 0 || (int64_t)units > s[S_MAX_UNITS] || s[S_UNIT] <= 0 || s[S_ADAPTIVE] <= 0 ||
        __builtin_mul_overflow(units, (uint64_t)s[S_UNIT], &total) || !obj_plus(total, (uint64_t)s[S_ADAPTIVE], &total))
        return 0;
    const unsigned char *raw = obj_at(r, addr, total);
    if (raw == NULL)
        return 0;
    /* everything needed of the object's own bytes is taken before any other read may release their buffer */
    int64_t ints[N_INTS], warm = 0;
    uint64_t ptrs[N_PTRS];
    for (int i = 0; i < N_INTS; i++) {
        int64_t off = s[S_INTS + 2 * i], code = s[S_INTS + 2 * i + 1];
        if (off < 0 || (uint64_t)off + (uint64_t)(code >> 1) > total || !scalar(raw + off, code, &ints[i]))
            return 0;
    }
    for (int i = 0; i < N_PTRS; i++) {
        int64_t off = s[S_PTRS + i];
        if (off < 0 || (uint64_t)off + 8 > total)
            return 0;
        memcpy(&ptrs[i], raw + off, 8);
    }
    if (s[S_WARMUP] >= 0) { /* 3.11: quickened once the warm-up counter reached zero (read_code) */
        if ((uint64_t)s[S_WARMUP] + 2 > total || !scalar(raw + s[S_WARMUP], 2 * 2 + 1, &warm))
            return 0;
    }
    *quickened = warm >= 0;
    PyObject *adaptive = PyBytes_FromStringAndSize((const char *)raw + s[S_ADAPTIVE], (Py_ssize_t)(total - s[S_ADAPTIVE]));
    if (adaptive == NULL)
        return -1;
    objs[17] = adaptive;
    for (int i = 0; i < N_INTS; i++)
        if ((objs[i] = PyLong_FromLongLong(ints[i])) == NULL)
            return -1;
    static PyObject *(*const readers[N_PTRS])(Reading *, uint64_t, PyObject *, PyObject *) = {
        items_field, obj_strs_at, obj_strs_at, obj_bytes_at, str_field, str_field, str_field, obj_bytes_at, obj_bytes_at};
    for (int i = 0; i < N_PTRS; i++) {
        PyObject *v = field(r, ptrs[i], readers[i]);
        if (v == NULL)
            return -1;
        objs[N_INTS + i] = v;
        if (v == Py_None)
            return 0;
    }
    PyObject *lpnames = objs[N_INTS + F_LPNAMES];
    Py_ssize_t nlp = PyTuple_GET_SIZE(lpnames);
    if (PyBytes_GET_SIZE(objs[N_INTS + F_LPKINDS]) != nlp || ints[I_ARGCOUNT] < 0 || ints[I_ARGCOUNT] > (1 << 16) ||
        ints[I_NLOCALSPLUS] < 0 || ints[I_NLOCALSPLUS] > (1 << 20) || ints[I_NLOCALSPLUS] != nlp)
        return 0; /* the reference's "differ in length" / "implausible code object counts" */
    *answered = 1;
    return 1;
}

/* the record's fields as a tuple, Py_None when not answered */
static PyObject *code_at(Reading *r, uint64_t addr, PyObject *key, const int64_t *s)
{
    PyObject *objs[22] = {NULL};
    int answered = 0, quickened = 1;
    int got = read_fields(r, addr, key, s, objs, &answered, &quickened);
    PyObject *out = NULL;
    if (got >= 0 && answered) {
        PyObject *names = objs[N_INTS + F_LPNAMES], *kinds = objs[N_INTS + F_LPKINDS];
        objs[18] = Py_NewRef(quickened ? Py_True : Py_False);
        objs[19] = names_with(names, kinds, s[S_LOCAL]);
        objs[20] = objs[19] ? names_with(names, kinds, s[S_CELL]) : NULL;
        objs[21] = objs[20] ? names_with(names, kinds, s[S_FREE]) : NULL;
        if (objs[21] != NULL && (out = PyTuple_New(22)) != NULL)
            for (int i = 0; i < 22; i++) {
                PyTuple_SET_ITEM(out, i, objs[i]);
                objs[i] = NULL;
            }
    } else if (got >= 0) {
        out = Py_NewRef(Py_None);
    }
    for (int i = 0; i < 22; i++)
        Py_XDECREF(objs[i]);
    return out;
}

PyObject *zen_objects_code(Objects *o, PyObject *const *args, Py_ssize_t nargs)
{
    return obj_spec_call(o, args, nargs, S_COUNT, "code(addr, spec)", code_at);
}
