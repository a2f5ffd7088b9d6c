/* zen.memory.system.kernel._find_all, compiled: every offset of a byte string in a window of a whole-machine
 * image (the kernel banner's "Linux version ", init_task's "swapper").
 *
 * The reference calls bytes.find on the mmap in a loop: about 1-2 GB/s here, so the two searches over a 1.5 GiB
 * guest were ~1.7 s of a `zen recover --pid`. Here sixteen positions are tested at a time (`search`), without the
 * GIL, reading the caller's buffer (the image's mmap) only inside [start, end). */
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
