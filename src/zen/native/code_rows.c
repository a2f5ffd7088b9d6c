/* The system-wide code table's rows in one call: zen.cpython.program.system_table._code_rows's loop, compiled.
 *
 * A process that imported transformers holds ~83,000 code objects; the table makes one row each
 * [hex(address), module, qualname, first line, sha256 of the de-specialised bytecode, 32 hex digits]. The fields
 * are gathered in bulk beforehand (numpy); what was left in Python was the loop itself, ~0.35 s of a forked child
 * whose core the tensor writer shares, which ends last. Every row whose code needs more than the tables below (a
 * code object the vectorised checks refused, instrumented bytecode) is left to the reference, which the caller
 * runs for exactly those rows.
 *
 *   code_rows(addrs, codes, good, quals, qual_strs, fnames, fname_strs, lines, quick, modules, tables, hasher)
 *       -> (rows, fallback)
 *
 * addrs, codes (bytes or None), good, quals, fnames, lines, quick: lists of one length (per code object); qual_strs,
 * fname_strs: address -> str or None; modules: code address -> module name ("?" where absent); tables: (deopt: 256
 * bytes, caches: 256 bytes, cache_op, line_op, instr_op, enter) as bytecode.deoptimize and readers.code.uninstrumented
 * use them (-1: an opcode this version has not); hasher: zen.evidence.hashing.sha256 (the compiled Sha256 is used
 * directly). rows[i] is the row, or None where the reference skips it or must make it; fallback lists the latter.
 */
#include "native.h"
#include <string.h>

/* hasher(data).hexdigest()[:32]; the compiled Sha256 without making an object */
static PyObject *digest32(PyObject *hasher, const unsigned char *p, Py_ssize_t n)
{
    if (hasher == (PyObject *)&zen_sha256_type) {
        static const char hex[] = "0123456789abcdef";
        uint8_t out[32];
        char text[32];
        zen_sha256_oneshot(p, (size_t)n, out);
        for (int i = 0; i < 16; i++) {
            text[2 * i] = hex[out[i] >> 4];
            text[2 * i + 1] = hex[out[i] & 15];
        }
        return PyUnicode_FromStringAndSize(text, 32);
    }
    PyObject *data = PyBytes_FromStringAndSize((const char *)p, n);
    if (data == NULL)
        return NULL;
    PyObject *h = PyObject_CallOneArg(hasher, data);
    Py_DECREF(data);
    if (h == NULL)
        return NULL;
    PyObject *text = PyObject_CallMethod(h, "hexdigest", NULL);
    Py_DECREF(h);
    if (text == NULL)
        return NULL;
    if (!PyUnicode_Check(text) || PyUnicode_GET_LENGTH(text) < 32) {
        Py_DECREF(text);
        PyErr_SetString(PyExc_ValueError, "code_rows: the hasher's hexdigest is not 64 hex digits");
        return NULL;
    }
    PyObject *out = PyUnicode_Substring(text, 0, 32);
    Py_DECREF(text);
    return out;
}

/* the str an address maps to in `strs`: a new reference, Py_None where absent or None, NULL on error */
static PyObject *lookup(PyObject *strs, PyObject *key)
{
    PyObject *v = PyDict_GetItemWithError(strs, key);
    if (v == NULL && PyErr_Occurred())
        return NULL;
    return Py_NewRef(v != NULL ? v : Py_None);
}

typedef struct {
    const unsigned char *deopt, *caches;
    int cache_op, line_op, instr_op, enter;
} Tables;

/* Whether an opcode byte (every even offset, as uninstrumented's adaptive[0::2]) is one uninstrumented() must look
 * at: it then runs for this row */
static int suspect(const Tables *t, const unsigned char *code, Py_ssize_t len)
{
    if (t->line_op < 0 && t->enter < 0) /* 3.11: uninstrumented() returns the bytes as they are */
        return 0;
    for (Py_ssize_t k = 0; k < len; k += 2) {
        int op = code[k];
        if (op == t->line_op || op == t->instr_op || op == t->enter)
            return 1;
    }
    return 0;
}

/* One row, Py_None (skipped), or NULL with *fallback set (the reference makes it) or an error raised */
static PyObject *row(PyObject *addr, PyObject *code, int good, PyObject *qual, PyObject *fname, PyObject *line,
                     int quick, PyObject *module, const Tables *t, PyObject *hasher, int *fallback)
{
    *fallback = 0;
    if (code == Py_None || !good || !PyBytes_Check(code)) {
        *fallback = 1;
        return NULL;
    }
    if (qual == Py_None || fname == Py_None)
        return Py_NewRef(Py_None);
    const unsigned char *p = (const unsigned char *)PyBytes_AS_STRING(code);
    Py_ssize_t len = PyBytes_GET_SIZE(code), units = len / 2;
    PyObject *digest;
    if (quick) {
        if (suspect(t, p, len)) {
            *fallback = 1;
            return NULL;
        }
        unsigned char stack[4096], *o = units * 2 <= (Py_ssize_t)sizeof stack ? stack : PyMem_Malloc((size_t)units * 2);
        if (o == NULL)
            return PyErr_NoMemory();
        zen_deopt_into(p, units, t->deopt, t->caches, t->cache_op, o);
        digest = digest32(hasher, o, units * 2);
        if (o != stack)
            PyMem_Free(o);
    } else {
        digest = digest32(hasher, p, len);
    }
    if (digest == NULL)
        return NULL;
    PyObject *hex = PyNumber_ToBase(addr, 16);
    if (hex == NULL) {
        Py_DECREF(digest);
        return NULL;
    }
    PyObject *out = PyList_New(5);
    if (out == NULL) {
        Py_DECREF(hex);
        Py_DECREF(digest);
        return NULL;
    }
    PyList_SET_ITEM(out, 0, hex);
    PyList_SET_ITEM(out, 1, Py_NewRef(module));
    PyList_SET_ITEM(out, 2, Py_NewRef(qual));
    PyList_SET_ITEM(out, 3, Py_NewRef(line));
    PyList_SET_ITEM(out, 4, digest);
    return out;
}

static int table_args(PyObject *tables, Tables *t)
{
    PyObject *deopt, *caches;
    if (!PyArg_ParseTuple(tables, "SSiiii:code_rows tables", &deopt, &caches, &t->cache_op, &t->line_op, &t->instr_op,
                          &t->enter))
        return -1;
    if (PyBytes_GET_SIZE(deopt) != 256 || PyBytes_GET_SIZE(caches) != 256 || t->cache_op < 0 || t->cache_op > 255) {
        PyErr_SetString(PyExc_ValueError, "code_rows: 256-byte tables and an opcode");
        return -1;
    }
    t->deopt = (const unsigned char *)PyBytes_AS_STRING(deopt);
    t->caches = (const unsigned char *)PyBytes_AS_STRING(caches);
    return 0;
}

PyObject *zen_code_rows(PyObject *self, PyObject *args)
{
    PyObject *addrs, *codes, *good, *quals, *qual_strs, *fnames, *fname_strs, *lines, *quick, *modules, *tables, *hasher;
    Tables t;
    if (!PyArg_ParseTuple(args, "O!O!O!O!O!O!O!O!O!O!OO:code_rows", &PyList_Type, &addrs, &PyList_Type, &codes,
                          &PyList_Type, &good, &PyList_Type, &quals, &PyDict_Type, &qual_strs, &PyList_Type, &fnames,
                          &PyDict_Type, &fname_strs, &PyList_Type, &lines, &PyList_Type, &quick, &PyDict_Type, &modules,
                          &tables, &hasher) ||
        table_args(tables, &t) < 0)
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(addrs);
    PyObject *lists[] = {codes, good, quals, fnames, lines, quick};
    for (size_t k = 0; k < sizeof lists / sizeof lists[0]; k++)
        if (PyList_GET_SIZE(lists[k]) != n) {
            PyErr_SetString(PyExc_ValueError, "code_rows: lists of different lengths");
            return NULL;
        }
    PyObject *rows = PyList_New(n), *fallback = PyList_New(0), *question = PyUnicode_FromString("?");
    if (rows == NULL || fallback == NULL || question == NULL)
        goto fail;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *addr = PyList_GET_ITEM(addrs, i);
        int g = PyObject_IsTrue(PyList_GET_ITEM(good, i)), q = PyObject_IsTrue(PyList_GET_ITEM(quick, i));
        if (g < 0 || q < 0)
            goto fail;
        PyObject *qual = lookup(qual_strs, PyList_GET_ITEM(quals, i));
        PyObject *fname = qual == NULL ? NULL : lookup(fname_strs, PyList_GET_ITEM(fnames, i));
        PyObject *module = fname == NULL ? NULL : PyDict_GetItemWithError(modules, addr);
        if (fname == NULL || (module == NULL && PyErr_Occurred())) {
            Py_XDECREF(qual);
            Py_XDECREF(fname);
            goto fail;
        }
        int back;
        PyObject *r = row(addr, PyList_GET_ITEM(codes, i), g, qual, fname, PyList_GET_ITEM(lines, i), q,
                          module != NULL ? module : question, &t, hasher, &back);
        Py_DECREF(qual);
        Py_DECREF(fname);
        if (r == NULL && !back)
            goto fail;
        if (r == NULL) {
            PyObject *at = PyLong_FromSsize_t(i);
            if (at == NULL || PyList_Append(fallback, at) < 0) {
                Py_XDECREF(at);
                goto fail;
            }
            Py_DECREF(at);
            r = Py_NewRef(Py_None);
        }
        PyList_SET_ITEM(rows, i, r);
    }
    Py_DECREF(question);
    return Py_BuildValue("(NN)", rows, fallback);
fail:
    Py_XDECREF(rows);
    Py_XDECREF(fallback);
    Py_XDECREF(question);
    return NULL;
}
