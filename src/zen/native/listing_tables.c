/* The tables of zen.cpython.code.listing as listing.c asks them, one question per distinct name or kind: what
 * the six set and dict lookups of the reference would answer for it, computed once and remembered. */
#include "listing.h"

/* 1 where `a` equals the interned str `b`, as `a == b` says (an interned `a` is equal only where it is `b`) */
int zen_same(PyObject *a, PyObject *b)
{
    if (a == b)
        return 1;
    if (PyUnicode_CheckExact(a) && PyUnicode_CHECK_INTERNED(a))
        return 0;
    return PyUnicode_Check(a) && PyUnicode_Compare(a, b) == 0;
}

/* `key in container` (a set or a dict); -1: error */
int zen_has(PyObject *container, PyObject *key)
{
    return PyAnySet_Check(container) ? PySet_Contains(container, key) : PyDict_Contains(container, key);
}


#define MEMO_BITS 10
#define MEMO_SIZE (1 << MEMO_BITS)
static Info memo[MEMO_SIZE];
PyObject *zen_memo_tables;
static int memo_used;

void zen_memo_clear(void)
{
    for (int i = 0; i < MEMO_SIZE; i++) {
        Py_XDECREF(memo[i].key);
        Py_XDECREF(memo[i].renamed);
        Py_XDECREF(memo[i].when);
    }
    memset(memo, 0, sizeof(memo));
    memo_used = 0;
    Py_CLEAR(zen_memo_tables);
}


static int fill(const Tables *t, PyObject *key, Info *e)
{
    PyObject *renamed = PyDict_GetItemWithError(t->rename, key), *when;
    if (renamed == NULL && PyErr_Occurred())
        return -1;
    renamed = renamed ? renamed : key;
    when = PyDict_GetItemWithError(t->hooked, key);
    if (when == NULL && PyErr_Occurred())
        return -1;
    int v[5] = {zen_has(t->drop, key), zen_has(t->with_arg, renamed), zen_has(t->operand_kinds, key), zen_has(t->unconditional, key),
                zen_has(t->returns, key)};
    for (int i = 0; i < 5; i++)
        if (v[i] < 0)
            return -1;
    e->key = key;
    e->renamed = renamed;
    e->when = when;
    e->drop = (char)v[0], e->with_arg = (char)v[1], e->operand = (char)v[2], e->unconditional = (char)v[3];
    e->returns = (char)v[4];
    return 0;
}

/* The entry of an exact str `key` (borrowed: valid for this call of listing); `scratch` (references borrowed from the
 * tables and the key) where the memo is full. NULL with an error set on failure. */
Info *zen_info_of(const Tables *t, PyObject *key, Info *scratch)
{
    size_t h = (size_t)(((uintptr_t)key >> 4) * 0x9E3779B97F4A7C15ull >> (64 - MEMO_BITS));
    for (int probe = 0; probe < MEMO_SIZE; probe++, h = (h + 1) & (MEMO_SIZE - 1)) {
        if (memo[h].key == key)
            return &memo[h];
        if (memo[h].key == NULL)
            break;
    }
    if (fill(t, key, scratch) < 0)
        return NULL;
    if (memo_used >= MEMO_SIZE / 2 || memo[h].key != NULL)
        return scratch;
    memo[h] = *scratch;
    Py_INCREF(memo[h].key);
    Py_INCREF(memo[h].renamed);
    Py_XINCREF(memo[h].when);
    memo_used++;
    return &memo[h];
}

