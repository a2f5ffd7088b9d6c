/* A function object read in one call: zen.cpython.readers.functions.read_function's reading, compiled.
 *
 * A recovery reads ~8,000 function objects (the closure walk, the code records' owners, the module globals) at
 * ~9 us each in a dozen Python-level steps; here the same fields are read through objects.c's bounded helpers and
 * the interpreter's caches in one call.
 *
 *   Objects.function(addr, spec) -> tuple | None
 *
 * spec: bytes of S_COUNT little-endian int64 (zen.cpython.readers.functions._native_spec: the struct's size and its
 * fields' offsets, -1 for func_builtins before 3.10). The tuple holds FunctionInfo's fields after addr, in order.
 * None wherever the reference would raise or take another path (not a plain function object, bytes outside one
 * chunk, a name that is no compact str, a __module__ whose kind is not known yet, a code pointer to no code
 * object): the reference then runs and gives the same answer or the same error.
 */
#include "objects.h"
#include <string.h>

enum { S_SIZE, S_NAME, S_QUALNAME, S_MODULE, S_CODE, S_GLOBALS, S_BUILTINS, S_DEFAULTS, S_KWDEFAULTS, S_CLOSURE,
       S_DOC, S_DICT, S_ANNOTATIONS, S_COUNT };
enum { N_FIELDS = S_COUNT - 1 }; /* the pointer fields, name ... annotations */

static PyObject *str_or_none(Reading *r, uint64_t addr)
{
    PyObject *key = PyLong_FromUnsignedLongLong(addr);
    if (key == NULL)
        return NULL;
    PyObject *s = obj_str_at(r, addr, key);
    Py_DECREF(key);
    return s;
}

/* 1 when `addr` holds an object of kind `want`, 0 when another kind or not answered, -1 on error */
static int of_kind(Reading *r, uint64_t addr, const char *want)
{
    PyObject *key = PyLong_FromUnsignedLongLong(addr);
    if (key == NULL)
        return -1;
    int got = obj_is_kind(r, addr, key, want);
    Py_DECREF(key);
    return got;
}

/* the function's __module__ as read_function gives it: a str, or None for no str (*answered 0: the reference) */
static PyObject *module_name(Reading *r, uint64_t module, int *answered)
{
    *answered = 1;
    if (module == 0)
        Py_RETURN_NONE;
    PyObject *key = PyLong_FromUnsignedLongLong(module), *kind;
    if (key == NULL)
        return NULL;
    int got = obj_kind_of(r, module, key, &kind);
    PyObject *out = NULL;
    if (got == 0)
        *answered = 0;
    else if (got > 0 && !(PyUnicode_Check(kind) && PyUnicode_CompareWithASCIIString(kind, "str") == 0))
        out = Py_NewRef(Py_None); /* not a str: no module name, as the reference says */
    else if (got > 0 && (out = obj_str_at(r, module, key)) == Py_None)
        *answered = 0;
    Py_DECREF(key);
    return out;
}

static PyObject *read_function(Reading *r, uint64_t addr, PyObject *key, const int64_t *s)
{
    int ok = obj_is_kind(r, addr, key, "function");
    if (ok <= 0)
        return ok < 0 ? NULL : Py_NewRef(Py_None);
    if (s[S_SIZE] <= 0)
        Py_RETURN_NONE;
    const unsigned char *raw = obj_at(r, addr, (uint64_t)s[S_SIZE]);
    if (raw == NULL)
        Py_RETURN_NONE;
    uint64_t w[N_FIELDS];
    for (int i = 0; i < N_FIELDS; i++) {
        int64_t off = s[1 + i];
        w[i] = 0; /* func_builtins before 3.10: 0, as the reference gives it */
        if (off >= 0 && (uint64_t)off + 8 > (uint64_t)s[S_SIZE])
            Py_RETURN_NONE;
        if (off >= 0)
            memcpy(&w[i], raw + off, 8);
    }
    PyObject *name = NULL, *qualname = NULL, *module = NULL, *out = NULL;
    int answered = 0;
    if ((name = str_or_none(r, w[S_NAME - 1])) == NULL || name == Py_None)
        goto done;
    if ((qualname = str_or_none(r, w[S_QUALNAME - 1])) == NULL || qualname == Py_None)
        goto done;
    if ((module = module_name(r, w[S_MODULE - 1], &answered)) == NULL || !answered)
        goto done;
    int code = of_kind(r, w[S_CODE - 1], "code");
    if (code < 0)
        goto done;
    answered = code;
    if (!answered)
        goto done;
    out = PyTuple_New(N_FIELDS);
    if (out == NULL)
        goto done;
    PyTuple_SET_ITEM(out, 0, Py_NewRef(name));
    PyTuple_SET_ITEM(out, 1, Py_NewRef(qualname));
    PyTuple_SET_ITEM(out, 2, Py_NewRef(module));
    for (int i = S_CODE - 1; i < N_FIELDS; i++) {
        PyObject *v = PyLong_FromUnsignedLongLong(w[i]);
        if (v == NULL) {
            Py_CLEAR(out);
            goto done;
        }
        PyTuple_SET_ITEM(out, i, v);
    }
done:
    if (out == NULL && !PyErr_Occurred())
        out = Py_NewRef(Py_None);
    Py_XDECREF(name), Py_XDECREF(qualname), Py_XDECREF(module);
    return out;
}

PyObject *zen_objects_function(Objects *o, PyObject *const *args, Py_ssize_t nargs)
{
    return obj_spec_call(o, args, nargs, S_COUNT, "function(addr, spec)", read_function);
}
