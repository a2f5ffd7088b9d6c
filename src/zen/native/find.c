/* zen.memory.system.kernel._find_all, compiled: every offset of a byte string in a window of a whole-machine
 * image (the kernel banner's "Linux version ", init_task's "swapper").
 *
 * The reference calls bytes.find on the mmap in a loop: about 1-2 GB/s here, so the two searches over a 1.5 GiB
 * guest were ~1.7 s of a `zen recover --pid`. Here sixteen positions are tested at a time (`search`), without the
 * GIL, reading the caller's buffer (the image's mmap) only inside [start, end). `find_many` searches one window for
 * several needles in one pass (the banner and init_task's two spellings: three passes over each window were 0.38-0.58 s
 * of a recovery from a cached 1.5 GiB guest), each needle's answer the one `find_all` gives for it. */
#define _GNU_SOURCE
#include "native.h"
#include <string.h>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

/* Offsets of needle (nl >= 1 bytes) in s[pos, end), ascending, into at[*got..most). Sixteen positions at a time where
 * SSE2 is there (x86_64 always has it): a position is a candidate when its first byte and the byte nl-1 further on
 * are the needle's first and last, and only candidates are compared (the "generic SIMD" substring search; memmem's
 * two-way search ran at 3-4 GB/s here). The last positions, and other machines, go through memmem. */
static void search(const char *s, Py_ssize_t pos, Py_ssize_t end, const char *needle, Py_ssize_t nl, Py_ssize_t *at,
                   Py_ssize_t *got, Py_ssize_t most)
{
#if defined(__SSE2__)
    const __m128i first = _mm_set1_epi8(needle[0]), last = _mm_set1_epi8(needle[nl - 1]);
    while (*got < most && end - pos >= nl - 1 + 16) {
        __m128i a = _mm_loadu_si128((const __m128i *)(s + pos));
        __m128i b = _mm_loadu_si128((const __m128i *)(s + pos + nl - 1));
        unsigned mask = (unsigned)_mm_movemask_epi8(_mm_and_si128(_mm_cmpeq_epi8(a, first), _mm_cmpeq_epi8(b, last)));
        while (mask && *got < most) {
            int bit = __builtin_ctz(mask);
            if (nl <= 2 || memcmp(s + pos + bit + 1, needle + 1, (size_t)(nl - 2)) == 0)
                at[(*got)++] = pos + bit;
            mask &= mask - 1;
        }
        pos += 16;
    }
#endif
    while (*got < most && end - pos >= nl) {
        const char *hit = memmem(s + pos, (size_t)(end - pos), needle, (size_t)nl);
        if (hit == NULL)
            break;
        at[(*got)++] = hit - s;
        pos = hit - s + 1;
    }
}

/* find_all(buffer, needle, start, end, most) -> list of int: the offsets i, ascending, with
 * start <= i and i + len(needle) <= end where the buffer holds the needle; at most `most` of them. */
PyObject *zen_find_all(PyObject *self, PyObject *args)
{
    Py_buffer b = {0}, n = {0};
    Py_ssize_t start, end, most;
    if (!PyArg_ParseTuple(args, "y*y*nnn", &b, &n, &start, &end, &most))
        return NULL;
    PyObject *out = NULL;
    Py_ssize_t *at = NULL, got = 0;
    if (n.len <= 0 || most < 0) {
        PyErr_SetString(PyExc_ValueError, "find_all: an empty needle, or most < 0");
        goto done;
    }
    /* bytes.find's reading of the bounds: negative ones count from the end, then clamp to the buffer */
    if (start < 0 && (start += b.len) < 0)
        start = 0;
    if (end < 0 && (end += b.len) < 0)
        end = 0;
    if (end > b.len)
        end = b.len;
    if (most > ((Py_ssize_t)1 << 24)) { /* bounds the offsets array; callers ask for thousands */
        PyErr_SetString(PyExc_ValueError, "find_all: most above 2**24");
        goto done;
    }
    at = PyMem_RawMalloc(sizeof(Py_ssize_t) * (size_t)(most ? most : 1));
    if (at == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    const char *base = b.buf, *needle = n.buf;
    Py_ssize_t nl = n.len;
    Py_BEGIN_ALLOW_THREADS
    search(base, start, end, needle, nl, at, &got, most);
    Py_END_ALLOW_THREADS
    out = PyList_New(got);
    for (Py_ssize_t i = 0; out != NULL && i < got; i++) {
        PyObject *v = PyLong_FromSsize_t(at[i]);
        if (v == NULL) {
            Py_CLEAR(out);
            break;
        }
        PyList_SET_ITEM(out, i, v);
    }
done:
    PyMem_RawFree(at);
    PyBuffer_Release(&b);
    PyBuffer_Release(&n);
    return out;
}

#define MANY 8

/* The shared loop of `search_many` for G (1-3, a constant where it is inlined, so that the loop over groups unrolls
 * and its vectors stay in registers) groups of needles: needles of one group have the same first byte, last byte and
 * length, so one candidate mask serves them all (init_task's two spellings). Runs while pos <= stop and no needle is
 * full; returns the position it stopped at, with every hit before it recorded and none at or after it. */
static inline __attribute__((always_inline)) Py_ssize_t
shared_loop(const char *s, Py_ssize_t pos, Py_ssize_t stop, const int G, const Py_ssize_t *gl, const char *gfirst,
            const char *glast, const int *gof, int k, const char **nd, const Py_ssize_t *nl, Py_ssize_t **at,
            Py_ssize_t *got, const Py_ssize_t *most)
{
    __m128i first[3], last[3];
    for (int g = 0; g < G; g++) {
        first[g] = _mm_set1_epi8(gfirst[g]);
        last[g] = _mm_set1_epi8(glast[g]);
    }
    for (; pos <= stop; pos += 16) {
        __m128i a = _mm_loadu_si128((const __m128i *)(s + pos));
        unsigned m[3], any = 0;
        for (int g = 0; g < G; g++) {
            __m128i b = _mm_loadu_si128((const __m128i *)(s + pos + gl[g] - 1));
            m[g] = (unsigned)_mm_movemask_epi8(_mm_and_si128(_mm_cmpeq_epi8(a, first[g]), _mm_cmpeq_epi8(b, last[g])));
            any |= m[g];
        }
        if (!any)
            continue;
        int full = 0;
        for (int i = 0; i < k; i++) {
            Py_ssize_t before = got[i];
            for (unsigned mask = m[gof[i]]; mask; mask &= mask - 1) {
                int bit = __builtin_ctz(mask);
                if (got[i] >= most[i]) {
                    full = 1; /* a hit past this needle's cap in this step */
                    break;
                }
                if (nl[i] <= 2 || memcmp(s + pos + bit + 1, nd[i] + 1, (size_t)(nl[i] - 2)) == 0)
                    at[i][got[i]++] = pos + bit;
            }
            if (got[i] >= most[i] && got[i] > before)
                full = 1;
        }
        if (full) { /* the others finish this step (and the rest) alone, from its start: drop their hits in it */
            for (int i = 0; i < k; i++)
                if (got[i] < most[i])
                    while (got[i] > 0 && at[i][got[i] - 1] >= pos)
                        got[i]--;
            return pos;
        }
    }
    return pos;
}

/* Needles k of s from pos on, together while every one is searching (`shared_loop`, where they form at most three
 * groups). What is left of each (its tail, or all of it once another needle is full) goes through `search` alone, from
 * where the shared loop stopped: every position before that was tested for every needle, so each needle's hits are
 * find_all's, in order. */
static void search_many(const char *s, Py_ssize_t pos, int k, const char **nd, const Py_ssize_t *nl,
                        const Py_ssize_t *end, Py_ssize_t **at, Py_ssize_t *got, const Py_ssize_t *most)
{
#if defined(__SSE2__)
    int active = 0, G = 0, gof[MANY];
    Py_ssize_t gl[3], stop = PY_SSIZE_T_MAX;
    char gfirst[3], glast[3];
    for (int i = 0; i < k; i++) {
        active += got[i] < most[i] && pos < end[i];
        Py_ssize_t si = end[i] - (nl[i] - 1) - 16;
        if (si < stop)
            stop = si;
        int g = 0;
        while (g < G && !(gl[g] == nl[i] && gfirst[g] == nd[i][0] && glast[g] == nd[i][nl[i] - 1]))
            g++;
        if (g == G && G < 3) {
            gl[G] = nl[i];
            gfirst[G] = nd[i][0];
            glast[G] = nd[i][nl[i] - 1];
            G++;
        }
        gof[i] = g; /* g == 3: a fourth kind of needle, no shared loop */
        if (g >= 3)
            active = -1;
    }
    if (active == k && k > 1) {
        switch (G) {
        case 1:
            pos = shared_loop(s, pos, stop, 1, gl, gfirst, glast, gof, k, nd, nl, at, got, most);
            break;
        case 2:
            pos = shared_loop(s, pos, stop, 2, gl, gfirst, glast, gof, k, nd, nl, at, got, most);
            break;
        default:
            pos = shared_loop(s, pos, stop, 3, gl, gfirst, glast, gof, k, nd, nl, at, got, most);
            break;
        }
    }
#endif
    for (int i = 0; i < k; i++)
        if (got[i] < most[i] && pos < end[i])
            search(s, pos, end[i], nd[i], nl[i], at[i], &got[i], most[i]);
}

/* find_many(buffer, needles, start, ends, mosts) -> tuple of lists: for each needle i,
 * find_all(buffer, needles[i], start, ends[i], mosts[i]), found in one pass (at most 8 needles). */
PyObject *zen_find_many(PyObject *self, PyObject *args)
{
    Py_buffer b = {0}, n[MANY];
    PyObject *needles, *ends, *mosts, *out = NULL;
    Py_ssize_t start, end[MANY], most[MANY], nl[MANY], got[MANY] = {0}, *at[MANY] = {NULL};
    const char *nd[MANY];
    int k = 0, held = 0;
    if (!PyArg_ParseTuple(args, "y*O!nO!O!", &b, &PyTuple_Type, &needles, &start, &PyTuple_Type, &ends, &PyTuple_Type,
                          &mosts))
        return NULL;
    k = (int)PyTuple_GET_SIZE(needles);
    if (k < 1 || k > MANY || PyTuple_GET_SIZE(ends) != k || PyTuple_GET_SIZE(mosts) != k) {
        PyErr_SetString(PyExc_ValueError, "find_many: 1 to 8 needles, with as many ends and mosts");
        goto done;
    }
    for (; held < k; held++) {
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(needles, held), &n[held], PyBUF_SIMPLE) < 0)
            goto done;
    }
    if (start < 0 && (start += b.len) < 0) /* as find_all reads it */
        start = 0;
    for (int i = 0; i < k; i++) {
        end[i] = PyLong_AsSsize_t(PyTuple_GET_ITEM(ends, i));
        most[i] = PyLong_AsSsize_t(PyTuple_GET_ITEM(mosts, i));
        if (PyErr_Occurred())
            goto done;
        if (n[i].len <= 0 || most[i] < 0 || most[i] > ((Py_ssize_t)1 << 24)) {
            PyErr_SetString(PyExc_ValueError, "find_many: an empty needle, or most outside [0, 2**24]");
            goto done;
        }
        if (end[i] < 0 && (end[i] += b.len) < 0)
            end[i] = 0;
        if (end[i] > b.len)
            end[i] = b.len;
        nd[i] = n[i].buf;
        nl[i] = n[i].len;
        at[i] = PyMem_RawMalloc(sizeof(Py_ssize_t) * (size_t)(most[i] ? most[i] : 1));
        if (at[i] == NULL) {
            PyErr_NoMemory();
            goto done;
        }
    }
    Py_BEGIN_ALLOW_THREADS
    search_many(b.buf, start, k, nd, nl, end, at, got, most);
    Py_END_ALLOW_THREADS
    out = PyTuple_New(k);
    for (int i = 0; out != NULL && i < k; i++) {
        PyObject *lst = PyList_New(got[i]);
        for (Py_ssize_t j = 0; lst != NULL && j < got[i]; j++) {
            PyObject *v = PyLong_FromSsize_t(at[i][j]);
            if (v == NULL) {
                Py_CLEAR(lst);
                break;
            }
            PyList_SET_ITEM(lst, j, v);
        }
        if (lst == NULL)
            Py_CLEAR(out);
        else
            PyTuple_SET_ITEM(out, i, lst);
    }
done:
    for (int i = 0; i < k && i < MANY; i++)
        PyMem_RawFree(at[i]);
    for (int i = 0; i < held; i++)
        PyBuffer_Release(&n[i]);
    PyBuffer_Release(&b);
    return out;
}
