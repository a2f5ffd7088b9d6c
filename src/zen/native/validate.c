/* Typed validation of parsed case files: zen.represent.schema._record_ok / _ok / _walk_ok, compiled.
 * Called with the limits schema.MAX_DEPTH and MAX_STRING; answers exactly what the reference answers. */
#include "native.h"


/* Spec tags: the Python side (zen.represent.schema._spec) compiles each type hint into a tuple whose
 * first item is one of these. */
enum { S_ANY = 0, S_STR = 1, S_INT = 2, S_FLOAT = 3, S_EXACT = 4, S_UNION = 5, S_LIST = 6, S_DICT = 7, S_RECORD = 8 };

static Py_ssize_t max_depth = 200;
static Py_ssize_t max_string = 1 << 20;

/* 1: fits, 0: does not, -1: error set. `d` is the depth of the container holding `v`. */
static int walk_ok(PyObject *v, Py_ssize_t d)
{
    if (PyUnicode_CheckExact(v))
        return PyUnicode_GET_LENGTH(v) <= max_string;
    if (PyDict_CheckExact(v)) {
        if (d > max_depth)
            return 0;
        PyObject *k, *x;
        Py_ssize_t pos = 0;
        while (PyDict_Next(v, &pos, &k, &x)) {
            if (PyUnicode_Check(k) ? PyUnicode_GET_LENGTH(k) > max_string : PyObject_Length(k) > max_string)
                return 0;
            if (PyErr_Occurred())
                return -1;
            int r = walk_ok(x, d + 1);
            if (r <= 0)
                return r;
        }
        return 1;
    }
    if (PyList_CheckExact(v)) {
        if (d > max_depth)
            return 0;
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(v); i++) {
            int r = walk_ok(PyList_GET_ITEM(v, i), d + 1);
            if (r <= 0)
                return r;
        }
        return 1;
    }
    return 1;
}

static int spec_ok(PyObject *v, PyObject *spec, Py_ssize_t d);

static int record_fields_ok(PyObject *v, PyObject *spec, Py_ssize_t d)
{
    /* spec: (S_RECORD, fields: dict[str, spec], allowed: frozenset, required: frozenset) */
    PyObject *fields = PyTuple_GET_ITEM(spec, 1), *allowed = PyTuple_GET_ITEM(spec, 2);
    PyObject *required = PyTuple_GET_ITEM(spec, 3);
    if (!PyDict_CheckExact(v) || d > max_depth)
        return 0;
    PyObject *k, *x;
    Py_ssize_t pos = 0;
    while (PyDict_Next(v, &pos, &k, &x)) {
        int in = PySet_Contains(allowed, k);
        if (in <= 0)
            return in;
    }
    PyObject *it = PyObject_GetIter(required);
    if (it == NULL)
        return -1;
    PyObject *name;
    while ((name = PyIter_Next(it)) != NULL) {
        int in = PyDict_Contains(v, name);
        Py_DECREF(name);
        if (in <= 0) {
            Py_DECREF(it);
            return in;
        }
    }
    Py_DECREF(it);
    if (PyErr_Occurred())
        return -1;
    pos = 0;
    while (PyDict_Next(v, &pos, &k, &x)) {
        PyObject *field = PyDict_GetItemWithError(fields, k);
        int r;
        if (field != NULL)
            r = spec_ok(x, field, d + 1);
        else if (PyErr_Occurred())
            return -1;
        else
            r = walk_ok(x, d + 1);
        if (r <= 0)
            return r;
    }
    return 1;
}

static int spec_ok(PyObject *v, PyObject *spec, Py_ssize_t d)
{
    if (!PyTuple_CheckExact(spec) || PyTuple_GET_SIZE(spec) < 1) {
        PyErr_SetString(PyExc_TypeError, "record_ok: a spec is a non-empty tuple");
        return -1;
    }
    long tag = PyLong_AsLong(PyTuple_GET_ITEM(spec, 0));
    if (tag == -1 && PyErr_Occurred())
        return -1;
    Py_ssize_t n = PyTuple_GET_SIZE(spec);
    switch (tag) {
    case S_ANY:
        return walk_ok(v, d);
    case S_STR:
        return PyUnicode_CheckExact(v) && PyUnicode_GET_LENGTH(v) <= max_string;
    case S_INT:
        return PyLong_CheckExact(v);
    case S_FLOAT:
        return PyLong_CheckExact(v) || PyFloat_CheckExact(v);
    case S_EXACT:
        if (n != 2)
            break;
        return (PyObject *)Py_TYPE(v) == PyTuple_GET_ITEM(spec, 1);
    case S_UNION: { /* (S_UNION, nullable: bool, options: tuple) */
        if (n != 3 || !PyTuple_CheckExact(PyTuple_GET_ITEM(spec, 2)))
            break;
        if (v == Py_None && PyTuple_GET_ITEM(spec, 1) == Py_True)
            return 1;
        PyObject *opts = PyTuple_GET_ITEM(spec, 2);
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(opts); i++) {
            int r = spec_ok(v, PyTuple_GET_ITEM(opts, i), d);
            if (r != 0)
                return r;
        }
        return 0;
    }
    case S_LIST: { /* (S_LIST, item spec) */
        if (n != 2)
            break;
        if (!PyList_CheckExact(v))
            return 0;
        PyObject *item = PyTuple_GET_ITEM(spec, 1);
        if (PyTuple_CheckExact(item) && PyTuple_GET_SIZE(item) == 1 &&
            PyLong_AsLong(PyTuple_GET_ITEM(item, 0)) == S_ANY)
            return walk_ok(v, d); /* list[Any]: the free-form check of the list itself */
        if (d > max_depth)
            return 0;
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(v); i++) {
            int r = spec_ok(PyList_GET_ITEM(v, i), item, d + 1);
            if (r <= 0)
                return r;
        }
        return 1;
    }
    case S_DICT: { /* (S_DICT, value spec) */
        if (n != 2)
            break;
        if (!PyDict_CheckExact(v))
            return 0;
        PyObject *item = PyTuple_GET_ITEM(spec, 1);
        if (PyTuple_CheckExact(item) && PyTuple_GET_SIZE(item) == 1 &&
            PyLong_AsLong(PyTuple_GET_ITEM(item, 0)) == S_ANY)
            return walk_ok(v, d);
        if (d > max_depth)
            return 0;
        PyObject *k, *x;
        Py_ssize_t pos = 0;
        while (PyDict_Next(v, &pos, &k, &x)) {
            Py_ssize_t len = PyObject_Length(k);
            if (len < 0)
                return -1;
            if (len > max_string)
                return 0;
        }
        pos = 0;
        while (PyDict_Next(v, &pos, &k, &x)) {
            int r = spec_ok(x, item, d + 1);
            if (r <= 0)
                return r;
        }
        return 1;
    }
    case S_RECORD:
        if (n != 4 || !PyDict_CheckExact(PyTuple_GET_ITEM(spec, 1)) || !PyAnySet_Check(PyTuple_GET_ITEM(spec, 2)))
            break;
        return record_fields_ok(v, spec, d);
    default:
        break;
    }
    PyErr_Format(PyExc_ValueError, "record_ok: malformed spec (tag %ld, %zd items)", tag, n);
    return -1;
}

/* record_ok(value, spec, depth, max_depth, max_string) -> bool. The limits are the caller's (schema.MAX_DEPTH,
 * MAX_STRING), kept in statics for the walk: it holds the GIL from start to end (keys are str, nothing calls back
 * into Python code), so no other call can change them halfway. */
PyObject *zen_record_ok(PyObject *self, PyObject *args)
{
    PyObject *value, *spec;
    Py_ssize_t depth, limit_depth, limit_string;
    if (!PyArg_ParseTuple(args, "OOnnn:record_ok", &value, &spec, &depth, &limit_depth, &limit_string))
        return NULL;
    if (limit_depth < 0 || limit_depth > 10000 || limit_string < 0) {
        PyErr_SetString(PyExc_ValueError, "record_ok: max_depth must be 0..10000 (the C stack bounds it), max_string >= 0");
        return NULL;
    }
    max_depth = limit_depth;
    max_string = limit_string;
    int r = spec_ok(value, spec, depth);
    if (r < 0)
        return NULL;
    return PyBool_FromLong(r);
}

