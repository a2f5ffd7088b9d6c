/* Listing normalisation: zen.cpython.code.listing.normalise's loop over instructions, compiled, with what it does
 * first (with_consts' substitution of the constants' displays, _thread_jumps_to_return, the jump labels).
 *
 * The instructions a minor version changed (`_special`, `_Inlined.skip`, the END_FOR that follows a loop) stay in
 * Python: this loop calls `hook` for exactly the instructions the reference would hand them, and after it while
 * the hook says its state needs to see the next one. Everything else is the common case: a renamed opcode and its
 * operand. The reference is the definition; tests/test_native.py compares both on every code object of real images
 * of 3.8-3.14 and on random instruction sequences.
 *
 * listing(instructions, consts, tables, hook) -> list[str] | None
 *   instructions  list of Instruction (6-tuples: offset, op, name, arg, kind, argval)
 *   consts        list of the constants' displays, or None (the argvals are used as they are)
 *   tables        (drop, rename, with_arg, operand_kinds, hooked, unconditional, returns, max_copy): the module's
 *                 DROP, RENAME, _WITH_ARG, _OPERAND_KINDS, {name: None (always) | frozenset of the argvals that
 *                 make it special}, _UNCONDITIONAL, the return opcodes, MAX_COPY
 *   hook          hook(ins, argval, lines, labels) -> int: bit 0 the instruction is handled (skip the common case),
 *                 bit 1 call the hook for the next instruction whatever it is
 * None where an item is not a 6-tuple or its name or kind not a str (the caller runs the reference).
 */
#include "listing.h"

static PyObject *k_jump, *k_const, *k_other, *k_pair, *s_colon, *s_unknown;

typedef struct {
    PyObject *ins;    /* borrowed from the instruction list */
    PyObject *offset; /* new reference: the copy's own offset (see thread), or NULL: the instruction's */
} Item;

#define F_OFFSET(t) PyTuple_GET_ITEM((t), 0)
#define F_NAME(t) PyTuple_GET_ITEM((t), 2)
#define F_ARG(t) PyTuple_GET_ITEM((t), 3)
#define F_KIND(t) PyTuple_GET_ITEM((t), 4)
#define F_ARGVAL(t) PyTuple_GET_ITEM((t), 5)

/* the argval the reference sees after with_consts: consts[arg] if arg < len(consts) else "<const arg>" */
static PyObject *argval_of(PyObject *ins, PyObject *consts, PyObject *nconsts)
{
    PyObject *argval = F_ARGVAL(ins);
    if (consts == Py_None || !zen_same(F_KIND(ins), k_const))
        return Py_NewRef(argval);
    PyObject *arg = F_ARG(ins);
    int lt = PyObject_RichCompareBool(arg, nconsts, Py_LT);
    if (lt < 0)
        return NULL;
    if (lt)
        return PyObject_GetItem(consts, arg);
    return PyUnicode_FromFormat("<const %S>", arg);
}

/* f"{a} {b}" (b formatted as an f-string formats it), in one allocation */
static PyObject *spaced(PyObject *a, PyObject *b)
{
    PyObject *fb = PyUnicode_CheckExact(b) ? Py_NewRef(b) : PyObject_Format(b, NULL);
    if (fb == NULL)
        return NULL;
    PyObject *fa = PyUnicode_CheckExact(a) ? Py_NewRef(a) : PyObject_Format(a, NULL);
    PyObject *out = NULL;
    if (fa != NULL) {
        Py_ssize_t na = PyUnicode_GET_LENGTH(fa), nb = PyUnicode_GET_LENGTH(fb);
        Py_UCS4 most = PyUnicode_MAX_CHAR_VALUE(fa) > PyUnicode_MAX_CHAR_VALUE(fb) ? PyUnicode_MAX_CHAR_VALUE(fa)
                                                                                   : PyUnicode_MAX_CHAR_VALUE(fb);
        out = PyUnicode_New(na + 1 + nb, most);
        if (out != NULL && (PyUnicode_CopyCharacters(out, 0, fa, 0, na) < 0 || PyUnicode_WriteChar(out, na, ' ') < 0 ||
                            PyUnicode_CopyCharacters(out, na + 1, fb, 0, nb) < 0))
            Py_CLEAR(out);
    }
    Py_XDECREF(fa);
    Py_DECREF(fb);
    return out;
}

static int append_new(PyObject *lines, PyObject *line)
{
    if (line == NULL)
        return -1;
    int r = PyList_Append(lines, line);
    Py_DECREF(line);
    return r;
}

static int push(Item **items, Py_ssize_t *n, Py_ssize_t *cap, PyObject *ins, PyObject *offset)
{
    if (*n == *cap) {
        Py_ssize_t grown = *cap * 2 + 16;
        Item *more = PyMem_Realloc(*items, (size_t)grown * sizeof(Item));
        if (more == NULL) {
            Py_XDECREF(offset);
            PyErr_NoMemory();
            return -1;
        }
        *items = more;
        *cap = grown;
    }
    (*items)[*n].ins = ins;
    (*items)[*n].offset = offset;
    (*n)++;
    return 0;
}

/* _exit_block: how many instructions from `n` make a short block that returns (0: none) */
static Py_ssize_t exit_block(PyObject **seq, Py_ssize_t size, Py_ssize_t n, const Tables *t)
{
    Info scratch, *e;
    for (Py_ssize_t k = 0; k < t->max_copy && n + k < size; k++) {
        PyObject *b = seq[n + k];
        if (zen_same(F_KIND(b), k_jump))
            return 0;
        if ((e = zen_info_of(t, F_NAME(b), &scratch)) == NULL)
            return -1;
        if (e->drop)
            return 0;
        if (e->returns)
            return k + 1;
    }
    return 0;
}

/* {offset: index} as the reference's dict comprehension makes it (the last index of a repeated offset) */
static PyObject *offset_dict(PyObject **seq, Py_ssize_t size)
{
    PyObject *at = PyDict_New();
    if (at == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < size; i++) {
        PyObject *idx = PyLong_FromSsize_t(i);
        if (idx == NULL || PyDict_SetItem(at, F_OFFSET(seq[i]), idx) < 0) {
            Py_XDECREF(idx);
            Py_DECREF(at);
            return NULL;
        }
        Py_DECREF(idx);
    }
    return at;
}

/* The offsets as numbers where they are exact ints in increasing order (decode's): a jump's index by binary search,
 * not by a dict of every instruction. NULL (no error) where they are not: the dict then. */
static long long *offset_array(PyObject **seq, Py_ssize_t size)
{
    long long *offs = PyMem_Malloc((size_t)(size ? size : 1) * sizeof(long long));
    if (offs == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < size; i++) {
        PyObject *o = F_OFFSET(seq[i]);
        int overflow = 0;
        offs[i] = PyLong_CheckExact(o) ? PyLong_AsLongLongAndOverflow(o, &overflow) : 0;
        if (!PyLong_CheckExact(o) || overflow || (offs[i] == -1 && PyErr_Occurred()) || (i && offs[i] <= offs[i - 1])) {
            PyErr_Clear();
            PyMem_Free(offs);
            return NULL;
        }
    }
    return offs;
}

/* index of the instruction at offset `argval` (-1: none; -2: error), as `at.get(argval)` */
static Py_ssize_t index_at(PyObject **seq, Py_ssize_t size, long long *offs, PyObject **at, PyObject *argval)
{
    if (offs != NULL && PyLong_CheckExact(argval)) {
        int overflow = 0;
        long long v = PyLong_AsLongLongAndOverflow(argval, &overflow);
        if (v == -1 && PyErr_Occurred())
            return -2;
        if (overflow)
            return -1; /* no offset that large */
        Py_ssize_t lo = 0, hi = size;
        while (lo < hi) {
            Py_ssize_t mid = lo + (hi - lo) / 2;
            if (offs[mid] < v)
                lo = mid + 1;
            else
                hi = mid;
        }
        return lo < size && offs[lo] == v ? lo : -1;
    }
    if (*at == NULL && (*at = offset_dict(seq, size)) == NULL) /* an argval only the dict's equality decides */
        return -2;
    PyObject *found = PyDict_GetItemWithError(*at, argval);
    if (found == NULL)
        return PyErr_Occurred() ? -2 : -1;
    return PyLong_AsSsize_t(found);
}

/* _thread_jumps_to_return: the instructions, each unconditional jump to a short block that returns replaced by a copy
 * of the block (the first copy keeps the jump's offset, the others get -1, -2, ...: never jump targets) */
static int thread(PyObject **seq, Py_ssize_t size, const Tables *t, Item **items, Py_ssize_t *n, Py_ssize_t *cap)
{
    Info scratch, *e;
    int any = 0;
    for (Py_ssize_t i = 0; i < size && !any; i++) {
        if ((e = zen_info_of(t, F_NAME(seq[i]), &scratch)) == NULL)
            return -1;
        any = e->unconditional;
    }
    if (!any) {
        for (Py_ssize_t i = 0; i < size; i++)
            if (push(items, n, cap, seq[i], NULL) < 0)
                return -1;
        return 0;
    }
    PyObject *at = NULL;
    long long *offs = offset_array(seq, size);
    if (offs == NULL && PyErr_Occurred())
        return -1;
    if (offs == NULL && (at = offset_dict(seq, size)) == NULL) /* the reference builds it before anything else */
        return -1;
    long long copies = 0;
    for (Py_ssize_t i = 0; i < size; i++) {
        PyObject *ins = seq[i];
        Py_ssize_t target = -1, len = 0;
        if ((e = zen_info_of(t, F_NAME(ins), &scratch)) == NULL)
            goto fail;
        if (e->unconditional && zen_same(F_KIND(ins), k_jump)) {
            target = index_at(seq, size, offs, &at, F_ARGVAL(ins));
            if (target == -2)
                goto fail;
            if (target >= 0 && (len = exit_block(seq, size, target, t)) < 0)
                goto fail;
        }
        if (len == 0) {
            if (push(items, n, cap, ins, NULL) < 0)
                goto fail;
            continue;
        }
        for (Py_ssize_t k = 0; k < len; k++) {
            copies++;
            PyObject *off = k == 0 ? Py_NewRef(F_OFFSET(ins)) : PyLong_FromLongLong(-copies);
            if (off == NULL || push(items, n, cap, seq[target + k], off) < 0)
                goto fail;
        }
    }
    PyMem_Free(offs);
    Py_XDECREF(at);
    return 0;
fail:
    PyMem_Free(offs);
    Py_XDECREF(at);
    return -1;
}

/* {target offset: "L1", ...} over the jumps' int argvals, numbered in sorted order */
static PyObject *label_table(Item *items, Py_ssize_t n)
{
    PyObject *targets = PySet_New(NULL), *labels = NULL, *order = NULL;
    if (targets == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *ins = items[i].ins, *v = F_ARGVAL(ins);
        if (zen_same(F_KIND(ins), k_jump) && PyLong_Check(v) && PySet_Add(targets, v) < 0)
            goto done;
    }
    order = PySequence_List(targets);
    if (order == NULL || PyList_Sort(order) < 0 || (labels = PyDict_New()) == NULL)
        goto done;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(order); i++) {
        PyObject *name = PyUnicode_FromFormat("L%zd", i + 1);
        if (name == NULL || PyDict_SetItem(labels, PyList_GET_ITEM(order, i), name) < 0) {
            Py_XDECREF(name);
            Py_CLEAR(labels);
            goto done;
        }
        Py_DECREF(name);
    }
done:
    Py_DECREF(targets);
    Py_XDECREF(order);
    return labels;
}

/* whether the hook decides this instruction: a name it always sees, or one it sees with certain argvals */
static int hooked(const Info *name, PyObject *kind, PyObject *argval)
{
    if (zen_same(kind, k_pair))
        return 1;
    if (name->when == NULL)
        return 0;
    if (name->when == Py_None)
        return 1;
    int r = zen_has(name->when, argval);
    if (r < 0 && PyErr_ExceptionMatches(PyExc_TypeError)) { /* unhashable: the hook decides, as the reference does */
        PyErr_Clear();
        return 1;
    }
    return r;
}

/* the common case: a renamed opcode and its operand */
static int common(PyObject *lines, PyObject *labels, const Tables *t, const Info *name, PyObject *kind, PyObject *arg,
                  PyObject *argval)
{
    PyObject *renamed = name->renamed;
    if (zen_same(kind, k_jump)) {
        PyObject *label = PyDict_GetItemWithError(labels, argval);
        if (label == NULL && PyErr_Occurred())
            return -1;
        return append_new(lines, spaced(renamed, label ? label : s_unknown));
    }
    Info scratch, *k = zen_info_of(t, kind, &scratch);
    if (k == NULL)
        return -1;
    if (k->operand)
        return append_new(lines, spaced(renamed, argval));
    if (zen_same(kind, k_other) && name->with_arg)
        return append_new(lines, spaced(renamed, arg));
    return PyList_Append(lines, renamed);
}

static int read_tables(PyObject *tables, Tables *t)
{
    if (!PyTuple_Check(tables) || PyTuple_GET_SIZE(tables) != 8) {
        PyErr_SetString(PyExc_TypeError, "listing: tables is a tuple of eight");
        return -1;
    }
    t->drop = PyTuple_GET_ITEM(tables, 0);
    t->rename = PyTuple_GET_ITEM(tables, 1);
    t->with_arg = PyTuple_GET_ITEM(tables, 2);
    t->operand_kinds = PyTuple_GET_ITEM(tables, 3);
    t->hooked = PyTuple_GET_ITEM(tables, 4);
    t->unconditional = PyTuple_GET_ITEM(tables, 5);
    t->returns = PyTuple_GET_ITEM(tables, 6);
    t->max_copy = PyLong_AsSsize_t(PyTuple_GET_ITEM(tables, 7));
    if (t->max_copy == -1 && PyErr_Occurred())
        return -1;
    if (!PyDict_Check(t->rename) || !PyDict_Check(t->hooked)) {
        PyErr_SetString(PyExc_TypeError, "listing: rename and hooked are dicts");
        return -1;
    }
    return 0;
}

/* the memo as these tables say (emptied where it was filled from others) */
static void memo_for(PyObject *tables)
{
    if (zen_memo_tables != tables) {
        zen_memo_clear();
        zen_memo_tables = Py_NewRef(tables);
    }
}

PyObject *zen_listing(PyObject *self, PyObject *args)
{
    PyObject *instructions, *consts, *tables, *hook;
    Tables t;
    if (!PyArg_ParseTuple(args, "O!OOO:listing", &PyList_Type, &instructions, &consts, &tables, &hook) ||
        read_tables(tables, &t) < 0)
        return NULL;
    /* a copy: whatever the hook does, the items stay where they are and alive */
    PyObject *held = PyList_AsTuple(instructions);
    if (held == NULL)
        return NULL;
    Py_ssize_t size = PyTuple_GET_SIZE(held);
    PyObject **seq = &PyTuple_GET_ITEM(held, 0);
    for (Py_ssize_t i = 0; i < size; i++)
        if (!PyTuple_Check(seq[i]) || PyTuple_GET_SIZE(seq[i]) != 6 || !PyUnicode_CheckExact(F_NAME(seq[i])) ||
            !PyUnicode_CheckExact(F_KIND(seq[i]))) {
            Py_DECREF(held);
            Py_RETURN_NONE;
        }
    memo_for(tables);
    PyObject *nconsts = NULL, *labels = NULL, *lines = NULL, *result = NULL;
    Item *items = NULL;
    Py_ssize_t n = 0, cap = 0;
    if (consts != Py_None) {
        Py_ssize_t len = PyObject_Length(consts);
        if (len < 0 || (nconsts = PyLong_FromSsize_t(len)) == NULL) {
            Py_DECREF(held);
            return NULL;
        }
    }
    if (thread(seq, size, &t, &items, &n, &cap) < 0 || (labels = label_table(items, n)) == NULL ||
        (lines = PyList_New(0)) == NULL)
        goto done;
    int sticky = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *ins = items[i].ins, *offset = items[i].offset ? items[i].offset : F_OFFSET(ins);
        PyObject *label = PyDict_GetItemWithError(labels, offset);
        if (label == NULL && PyErr_Occurred())
            goto done;
        if (label != NULL && append_new(lines, PyUnicode_Concat(label, s_colon)) < 0)
            goto done;
        PyObject *name = F_NAME(ins), *kind = F_KIND(ins);
        Info scratch, *e = zen_info_of(&t, name, &scratch);
        if (e == NULL)
            goto done;
        if (e->drop)
            continue;
        PyObject *argval = argval_of(ins, consts, nconsts);
        if (argval == NULL)
            goto done;
        int call = sticky ? 1 : hooked(e, kind, argval);
        if (call < 0) {
            Py_DECREF(argval);
            goto done;
        }
        if (call) {
            PyObject *got = PyObject_CallFunctionObjArgs(hook, ins, argval, lines, labels, NULL);
            long r = got ? PyLong_AsLong(got) : -1;
            Py_XDECREF(got);
            memo_for(tables); /* again: the hook ran Python, which may have listed with other tables */
            if (r == -1 && PyErr_Occurred()) {
                Py_DECREF(argval);
                goto done;
            }
            sticky = (r & 2) != 0;
            if (r & 1) {
                Py_DECREF(argval);
                continue;
            }
            if ((e = zen_info_of(&t, name, &scratch)) == NULL) { /* `e` was in the memo before the call */
                Py_DECREF(argval);
                goto done;
            }
        }
        int ok = common(lines, labels, &t, e, kind, F_ARG(ins), argval);
        Py_DECREF(argval);
        if (ok < 0)
            goto done;
    }
    result = Py_NewRef(lines);
done:
    for (Py_ssize_t i = 0; i < n; i++)
        Py_XDECREF(items[i].offset);
    PyMem_Free(items);
    Py_XDECREF(nconsts);
    Py_XDECREF(labels);
    Py_XDECREF(lines);
    Py_DECREF(held);
    return result;
}

int zen_listing_init(void)
{
    struct { PyObject **slot; const char *text; } s[] = {
        {&k_jump, "jump"}, {&k_const, "const"}, {&k_other, "other"}, {&k_pair, "local_pair"},
        {&s_colon, ":"}, {&s_unknown, "?"},
    };
    for (size_t i = 0; i < sizeof(s) / sizeof(s[0]); i++) {
        *s[i].slot = PyUnicode_InternFromString(s[i].text);
        if (*s[i].slot == NULL)
            return -1;
    }
    return 0;
}
