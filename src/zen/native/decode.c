/* Bytecode decoding: zen.cpython.code.instructions.decode, compiled (the same table-driven loop, the same
 * instruction tuples, the same placeholders for indexes past a table). */
#include "native.h"


/* Resolutions, as numbered in zen.cpython.code.instructions (_PAIR, _NAME, ... _OTHER). */
enum { H_PAIR = 0, H_NAME, H_CONST, H_LOCAL, H_FREE, H_COMPARE, H_BINOP, H_JREL, H_JABS, H_OTHER };

static PyObject *k_none, *k_name, *k_local, *k_const, *k_jump, *k_other, *k_pair, *k_free, *k_compare, *k_binop;

typedef struct {
    PyObject *name; /* borrowed from the table */
    long ncache, how, shift;
    int backward;
} Row;

/* item `i` of a sequence (borrowed), or a new "<what i>" placeholder when out of range: as the
 * reference writes it. `shown` is the number in the placeholder. Returns a new reference. */
static PyObject *item_or(PyObject *fast, long long i, const char *what, long long shown)
{
    if (i >= 0 && i < PySequence_Fast_GET_SIZE(fast))
        return Py_NewRef(PySequence_Fast_GET_ITEM(fast, (Py_ssize_t)i));
    return PyUnicode_FromFormat("<%s %lld>", what, shown);
}

static PyObject *new_instruction(PyTypeObject *I, long long off, int op, PyObject *name, PyObject *arg,
                                 PyObject *kind, PyObject *argval)
{
    /* as tuple.__new__(I, items) builds a tuple subclass instance: tp_alloc, then the items */
    PyObject *t = I->tp_alloc(I, 6);
    if (t == NULL) {
        Py_XDECREF(arg);
        Py_XDECREF(argval);
        return NULL;
    }
    PyObject *o = PyLong_FromLongLong(off), *p = PyLong_FromLong(op);
    if (o == NULL || p == NULL || arg == NULL || argval == NULL) {
        Py_XDECREF(o);
        Py_XDECREF(p);
        Py_XDECREF(arg);
        Py_XDECREF(argval);
        Py_DECREF(t);
        return NULL;
    }
    PyTuple_SET_ITEM(t, 0, o);
    PyTuple_SET_ITEM(t, 1, p);
    PyTuple_SET_ITEM(t, 2, Py_NewRef(name));
    PyTuple_SET_ITEM(t, 3, arg);
    PyTuple_SET_ITEM(t, 4, Py_NewRef(kind));
    PyTuple_SET_ITEM(t, 5, argval);
    return t;
}

/* The table as `instructions._packed` packs it once per opcode table: (names: tuple of 256 str, rows: bytes of
 * 256 x 4 little-endian int32 (caches, resolution, name-argument shift, backward)).
 * 0: read; 1: a row outside what this decodes (the caller falls back); -1: error set */
static int read_rows(PyObject *table, Row rows[256])
{
    PyObject *names = PyTuple_GET_ITEM(table, 0), *packed = PyTuple_GET_ITEM(table, 1);
    if (PyTuple_GET_SIZE(table) != 2 || !PyTuple_CheckExact(names) || PyTuple_GET_SIZE(names) != 256 ||
        !PyBytes_CheckExact(packed) || PyBytes_GET_SIZE(packed) != 256 * 16) {
        PyErr_SetString(PyExc_ValueError, "decode: the table is (256 names, 256 packed rows)");
        return -1;
    }
    const unsigned char *p = (const unsigned char *)PyBytes_AS_STRING(packed);
    for (int op = 0; op < 256; op++) {
        int32_t v[4];
        for (int j = 0; j < 4; j++, p += 4)
            v[j] = (int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
        rows[op].name = PyTuple_GET_ITEM(names, op);
        rows[op].ncache = v[0];
        rows[op].how = v[1];
        rows[op].shift = v[2];
        rows[op].backward = v[3] != 0;
        if (!PyUnicode_Check(rows[op].name)) {
            PyErr_SetString(PyExc_ValueError, "decode: an opcode name is a str");
            return -1;
        }
        if (rows[op].ncache < 0 || rows[op].ncache > 1000 || rows[op].shift < 0 || rows[op].shift > 63 ||
            rows[op].how < H_PAIR || rows[op].how > H_OTHER)
            return 1; /* a table this does not take: the reference decodes with it */
    }
    return 0;
}

static PyObject *decode_fast(PyObject *code, PyObject *names, PyObject *locals, PyObject *consts, Row *rows,
                             long have_arg, long extended, int after_caches, long unit, long long free_base,
                             long cmp_shift, PyObject *cmp_op, PyObject *binops, long max_out, PyTypeObject *I)
{
    const unsigned char *c = (const unsigned char *)PyBytes_AS_STRING(code);
    Py_ssize_t n = PyBytes_GET_SIZE(code) - 1;
    Py_ssize_t i = 0;
    unsigned long long ext = 0;
    PyObject *out = PyList_New(0);
    if (out == NULL)
        return NULL;
    while (i < n && PyList_GET_SIZE(out) < max_out) {
        int op = c[i];
        if (op == extended) {
            ext = ((ext | c[i + 1]) << 8) & 0xFFFFFFFFULL;
            i += 2;
            continue;
        }
        Row *r = &rows[op];
        PyObject *ins;
        if (op < have_arg) {
            ext = 0;
            ins = new_instruction(I, i, op, r->name, Py_NewRef(Py_None), k_none, Py_NewRef(Py_None));
        } else {
            long long arg = (long long)(ext | c[i + 1]);
            ext = 0;
            PyObject *kind, *argval;
            switch (r->how) {
            case H_NAME:
                kind = k_name;
                argval = item_or(names, arg >> r->shift, "name", arg >> r->shift);
                break;
            case H_LOCAL:
                kind = k_local;
                argval = item_or(locals, arg, "local", arg);
                break;
            case H_CONST:
                kind = k_const;
                argval = item_or(consts, arg, "const", arg);
                break;
            case H_JREL: {
                long long base = i + 2 + (after_caches ? 2 * r->ncache : 0);
                kind = k_jump;
                argval = PyLong_FromLongLong(r->backward ? base - unit * arg : base + unit * arg);
                break;
            }
            case H_OTHER:
                kind = k_other;
                argval = PyLong_FromLongLong(arg);
                break;
            case H_PAIR: {
                PyObject *a = item_or(locals, arg >> 4, "local", arg >> 4);
                PyObject *b = item_or(locals, arg & 15, "local", arg & 15);
                kind = k_pair;
                argval = (a && b) ? PyTuple_Pack(2, a, b) : NULL;
                Py_XDECREF(a);
                Py_XDECREF(b);
                break;
            }
            case H_FREE:
                kind = k_free;
                argval = item_or(locals, arg + free_base, "free", arg);
                break;
            case H_COMPARE:
                kind = k_compare;
                argval = item_or(cmp_op, arg >> cmp_shift, "cmp", arg);
                break;
            case H_BINOP:
                kind = k_binop;
                argval = item_or(binops, arg, "op", arg);
                break;
            default: /* H_JABS */
                kind = k_jump;
                argval = PyLong_FromLongLong(unit * arg);
                break;
            }
            ins = new_instruction(I, i, op, r->name, PyLong_FromLongLong(arg), kind, argval);
        }
        if (ins == NULL || PyList_Append(out, ins) < 0) {
            Py_XDECREF(ins);
            Py_DECREF(out);
            return NULL;
        }
        Py_DECREF(ins);
        i += 2 + 2 * r->ncache;
    }
    return out;
}

/* decode(code, names, localsplus, consts, table, params, Instruction) -> list | None
 * params: (have_argument, extended_arg, after_caches, jump_unit, free_base, compare_arg_shift, cmp_op,
 * binary_ops, max_instructions). None: a case the reference handles and this does not (a negative
 * free_base, which Python would index from the end): the caller decodes it in Python. */
PyObject *zen_decode(PyObject *self, PyObject *args)
{
    PyObject *code, *names, *locals, *consts, *table, *params, *itype;
    if (!PyArg_ParseTuple(args, "SOOOO!O!O!:decode", &code, &names, &locals, &consts, &PyTuple_Type, &table,
                          &PyTuple_Type, &params, &PyType_Type, &itype))
        return NULL;
    PyTypeObject *I = (PyTypeObject *)itype;
    if (!PyType_IsSubtype(I, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "decode: Instruction is a tuple type");
        return NULL;
    }
    long have_arg, extended, unit, cmp_shift, max_out;
    long long free_base;
    int after_caches;
    PyObject *cmp_op, *binops;
    if (!PyArg_ParseTuple(params, "llplLlOOl:decode params", &have_arg, &extended, &after_caches, &unit, &free_base,
                          &cmp_shift, &cmp_op, &binops, &max_out))
        return NULL;
    if (free_base < 0 || free_base > (1LL << 40) || cmp_shift < 0 || cmp_shift > 63 || unit < -4 || unit > 4)
        Py_RETURN_NONE;
    Row rows[256];
    int rr = read_rows(table, rows);
    if (rr < 0)
        return NULL;
    if (rr > 0)
        Py_RETURN_NONE;
    PyObject *f_names = PySequence_Fast(names, "decode: names is a sequence");
    PyObject *f_locals = f_names ? PySequence_Fast(locals, "decode: localsplus is a sequence") : NULL;
    PyObject *f_consts = f_locals ? PySequence_Fast(consts, "decode: consts is a sequence") : NULL;
    PyObject *f_cmp = f_consts ? PySequence_Fast(cmp_op, "decode: cmp_op is a sequence") : NULL;
    PyObject *f_bin = f_cmp ? PySequence_Fast(binops, "decode: binary_ops is a sequence") : NULL;
    PyObject *out = NULL;
    if (f_bin != NULL)
        out = decode_fast(code, f_names, f_locals, f_consts, rows, have_arg, extended, after_caches, unit, free_base,
                          cmp_shift, f_cmp, f_bin, max_out, I);
    Py_XDECREF(f_names);
    Py_XDECREF(f_locals);
    Py_XDECREF(f_consts);
    Py_XDECREF(f_cmp);
    Py_XDECREF(f_bin);
    return out;
}

/* n 16-bit units of `in` de-specialised into `o` (2 * n bytes): each opcode mapped to its base (`base`, 256 bytes)
 * and every inline cache entry after it (`ncache`, 256 bytes: their count per base opcode) made (cache_op, 0) */
void zen_deopt_into(const unsigned char *in, Py_ssize_t n, const unsigned char *base, const unsigned char *ncache,
                    int cache_op, unsigned char *o)
{
    memcpy(o, in, (size_t)n * 2);
    for (Py_ssize_t k = 0; k < n; k++)
        o[2 * k] = base[in[2 * k]];
    for (Py_ssize_t i = 0; i < n;) {
        Py_ssize_t c = ncache[o[2 * i]], j = i + 1 + c < n ? i + 1 + c : n;
        for (Py_ssize_t k = i + 1; c && k < j; k++)
            o[2 * k] = (unsigned char)cache_op, o[2 * k + 1] = 0;
        i = c ? j : i + 1;
    }
}

/* deoptimize(adaptive, deopt, caches, cache_op) -> bytes: zen.cpython.code.bytecode.deoptimize's loop. deopt and
 * caches are 256-byte tables (base opcode; inline cache entries after it), cache_op the CACHE opcode: each opcode
 * mapped to its base and every cache entry after it made (cache_op, 0), over the whole 16-bit units. */
PyObject *zen_deoptimize(PyObject *self, PyObject *args)
{
    Py_buffer code, deopt, caches;
    int cache_op;
    if (!PyArg_ParseTuple(args, "y*y*y*i:deoptimize", &code, &deopt, &caches, &cache_op))
        return NULL;
    PyObject *out = NULL;
    if (deopt.len != 256 || caches.len != 256 || cache_op < 0 || cache_op > 255) {
        PyErr_SetString(PyExc_ValueError, "deoptimize: 256-byte tables and an opcode");
    } else if ((out = PyBytes_FromStringAndSize(NULL, code.len / 2 * 2)) != NULL) {
        zen_deopt_into(code.buf, code.len / 2, deopt.buf, caches.buf, cache_op,
                       (unsigned char *)PyBytes_AS_STRING(out));
    }
    PyBuffer_Release(&code);
    PyBuffer_Release(&deopt);
    PyBuffer_Release(&caches);
    return out;
}

int zen_decode_init(void)
{
    struct { PyObject **slot; const char *text; } kinds[] = {
        {&k_none, "none"}, {&k_name, "name"}, {&k_local, "local"}, {&k_const, "const"}, {&k_jump, "jump"},
        {&k_other, "other"}, {&k_pair, "local_pair"}, {&k_free, "free"}, {&k_compare, "compare"}, {&k_binop, "binop"},
    };
    for (size_t i = 0; i < sizeof(kinds) / sizeof(kinds[0]); i++) {
        *kinds[i].slot = PyUnicode_InternFromString(kinds[i].text);
        if (*kinds[i].slot == NULL)
            return -1;
    }
    return 0;
}
