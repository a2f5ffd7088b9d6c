/* zen.memory.scan's word search, compiled: which aligned 8-byte words of a block are one of a set of values.
 *
 * The reference (find_u64_in, find_u64_in_mapped) does it in numpy passes over a 16 MB block: a subtraction and a
 * compare into temporaries, an index of the survivors, a gather of their words, a table lookup, a sorted search.
 * Every pass writes and reads the block's size again; here each word is loaded once and the same tests run on it
 * in the same order (range, then the table of the values' address bits, then a binary search), without the GIL.
 * The answer is exactly the reference's: the indexes of the words equal to one of the values, ascending (and, for
 * the pointer map, whether each piece of MARK words holds a word in the map's range). The block is read through
 * the buffer the caller holds (a view of the image's mmap), never past its length. */
#include "native.h"
#include <string.h>

typedef struct {
    char *buf;
    Py_ssize_t n, cap;
} Out;

static int out_push(Out *o, int64_t v)
{
    if (o->n + 8 > o->cap) {
        Py_ssize_t cap = o->cap ? o->cap * 2 : 4096;
        char *b = PyMem_RawRealloc(o->buf, (size_t)cap);
        if (b == NULL)
            return -1;
        o->buf = b, o->cap = cap;
    }
    memcpy(o->buf + o->n, &v, 8);
    o->n += 8;
    return 0;
}

static int in_vals(const uint64_t *vals, Py_ssize_t nv, uint64_t w)
{
    Py_ssize_t lo = 0, hi = nv;
    while (lo < hi) {
        Py_ssize_t mid = lo + (hi - lo) / 2;
        if (vals[mid] < w)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < nv && vals[lo] == w;
}

/* An open-addressing table of the values (index + 1 per slot, 0 empty), for blocks long enough that building it
 * costs less than the binary searches it replaces: a hit or a sieve's false positive is then one or two probes of
 * a table that stays in cache, where a search is log2(values) dependent loads. */
typedef struct {
    uint32_t *slot;
    uint64_t mask;
} Table;

static uint64_t slot_of(uint64_t w, uint64_t mask) { return ((w >> 3) * 0x9E3779B97F4A7C15ull >> 32) & mask; }

static int table_build(Table *t, const uint64_t *vals, Py_ssize_t nv)
{
    uint64_t size = 64;
    while (size < (uint64_t)nv * 4)
        size <<= 1;
    t->slot = PyMem_RawCalloc((size_t)size, sizeof(uint32_t));
    if (t->slot == NULL)
        return -1;
    t->mask = size - 1;
    for (Py_ssize_t i = 0; i < nv; i++) {
        uint64_t h = slot_of(vals[i], t->mask);
        while (t->slot[h])
            h = (h + 1) & t->mask;
        t->slot[h] = (uint32_t)i + 1;
    }
    return 0;
}

/* At most size - nv probes: the table is at most a quarter full, so an empty slot ends every walk. */
static int table_has(const Table *t, const uint64_t *vals, uint64_t w)
{
    for (uint64_t h = slot_of(w, t->mask);; h = (h + 1) & t->mask) {
        uint32_t s = t->slot[h];
        if (!s)
            return 0;
        if (vals[s - 1] == w)
            return 1;
    }
}

/* u64_find(block, vals, sieve, plo, pwidth, mark) -> (bytes of int64 word indexes, bytes of marks | None)
 *
 * block:  the words (a C-contiguous buffer, length a multiple of 8; any alignment)
 * vals:   the values, uint64, sorted ascending without repeats (np.unique's answer)
 * sieve:  None, or a bitset of 2**bits bits (bits = log2(len * 8)) over bits 3.. of each value: a word whose bit is
 *         unset is none of the values
 * plo, pwidth: a word is only a hit when plo <= word <= plo + pwidth as well (0, 2**64-1: every word)
 * mark:   0, or the words per piece of the pointer map: marks[i] = 1 where piece i holds a word in [plo, plo+pwidth]
 */
PyObject *zen_u64_find(PyObject *self, PyObject *args)
{
    PyObject *block, *vals_o, *sieve_o;
    unsigned long long plo, pwidth;
    Py_ssize_t mark;
    if (!PyArg_ParseTuple(args, "OOOKKn", &block, &vals_o, &sieve_o, &plo, &pwidth, &mark))
        return NULL;
    Py_buffer b = {0}, v = {0}, s = {0};
    PyObject *result = NULL, *idx = NULL, *marks = NULL;
    Out out = {0};
    Table table = {0}; /* freed at done: declared before the first jump there */
    if (PyObject_GetBuffer(block, &b, PyBUF_C_CONTIGUOUS) < 0 || PyObject_GetBuffer(vals_o, &v, PyBUF_C_CONTIGUOUS) < 0)
        goto done;
    if (sieve_o != Py_None && PyObject_GetBuffer(sieve_o, &s, PyBUF_C_CONTIGUOUS) < 0)
        goto done;
    if (b.len % 8 || v.len % 8 || mark < 0) {
        PyErr_SetString(PyExc_ValueError, "u64_find: the block and the values must be 8-byte words, mark >= 0");
        goto done;
    }
    uint64_t smask = 0;
    if (s.obj != NULL) { /* a power of two bytes, at least one */
        if (s.len <= 0 || (s.len & (s.len - 1)) || s.len > ((Py_ssize_t)1 << 28)) {
            PyErr_SetString(PyExc_ValueError, "u64_find: the sieve must be a power-of-two number of bytes");
            goto done;
        }
        smask = (uint64_t)s.len * 8 - 1;
    }
    const unsigned char *words = b.buf, *sieve = s.obj != NULL ? s.buf : NULL;
    const uint64_t *vals = v.buf;
    Py_ssize_t n = b.len / 8, nv = v.len / 8;
    for (Py_ssize_t i = 1; i < nv; i++)
        if (vals[i] <= vals[i - 1]) {
            PyErr_SetString(PyExc_ValueError, "u64_find: the values must be sorted without repeats");
            goto done;
        }
    Py_ssize_t npieces = mark ? (n + mark - 1) / mark : 0;
    if (mark) {
        marks = PyBytes_FromStringAndSize(NULL, npieces);
        if (marks == NULL)
            goto done;
        memset(PyBytes_AS_STRING(marks), 0, (size_t)npieces);
    }
    unsigned char *m = mark ? (unsigned char *)PyBytes_AS_STRING(marks) : NULL;
    uint64_t vlo = nv ? vals[0] : 1, vwidth = nv ? vals[nv - 1] - vals[0] : 0;
    if (nv >= 16 && nv < ((Py_ssize_t)1 << 28) && n >= 4 * nv && table_build(&table, vals, nv) < 0) {
        PyErr_NoMemory();
        goto done;
    }
    int failed = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) {
        uint64_t w;
        memcpy(&w, words + 8 * i, 8);
        if (w - plo > pwidth)
            continue;
        if (m != NULL)
            m[i / mark] = 1;
        if (!nv || w - vlo > vwidth)
            continue;
        if (sieve != NULL) {
            uint64_t h = (w >> 3) & smask;
            if (!((sieve[h >> 3] >> (h & 7)) & 1))
                continue;
        }
        if ((table.slot != NULL ? table_has(&table, vals, w) : in_vals(vals, nv, w)) && out_push(&out, (int64_t)i) < 0) {
            failed = 1;
            break;
        }
    }
    Py_END_ALLOW_THREADS
    if (failed) {
        PyErr_NoMemory();
        goto done;
    }
    idx = PyBytes_FromStringAndSize(out.buf, out.n);
    if (idx != NULL)
        result = PyTuple_Pack(2, idx, mark ? marks : Py_None);
done:
    PyMem_RawFree(out.buf);
    PyMem_RawFree(table.slot);
    Py_XDECREF(idx);
    Py_XDECREF(marks);
    if (b.obj)
        PyBuffer_Release(&b);
    if (v.obj)
        PyBuffer_Release(&v);
    if (s.obj)
        PyBuffer_Release(&s);
    return result;
}
