/* zen.represent.jsontext._long_number, compiled: whether JSON text may hold an integer of 19 digits or more.
 * The reference maps digits to one byte (bytes.translate, a copy of the whole text) and searches it; here one
 * pass over the caller's buffer, without the GIL (the text is immutable bytes, or a buffer the caller holds). */
#include "native.h"

static int is_digit(unsigned char c) { return c >= '0' && c <= '9'; }

#define RUN 19

/* 1: may hold one, 0: does not. `most`: the reference's limit on runs looked at before answering yes. Any run of
 * RUN digits covers one of every RUN consecutive positions, so only every RUN-th byte is looked at until a digit
 * there; its run is then measured both ways. Runs are met in order, as the reference meets them. */
static int scan(const unsigned char *s, Py_ssize_t len, Py_ssize_t most)
{
    Py_ssize_t n = 0;
    for (Py_ssize_t p = RUN - 1; p < len; p += RUN) {
        if (!is_digit(s[p]))
            continue;
        Py_ssize_t at = p, end = p + 1;
        while (at > 0 && is_digit(s[at - 1]))
            at--;
        while (end < len && is_digit(s[end]))
            end++;
        if (end - at >= RUN) {
            if (++n > most)
                return 1;
            Py_ssize_t i = at - 1;
            while (i >= 0 && (s[i] == ' ' || s[i] == '\t' || s[i] == '\r' || s[i] == '\n' || s[i] == '-'))
                i--;
            if (i < 0 || s[i] == '[' || s[i] == ':' || s[i] == ',')
                return 1;
            if (end == len)
                return 0;
        }
        while (p + RUN < end) /* the next position looked at lies past this run */
            p += RUN;
    }
    return 0;
}

/* long_number(buffer, most) -> bool */
PyObject *zen_long_number(PyObject *self, PyObject *args)
{
    Py_buffer b;
    Py_ssize_t most;
    if (!PyArg_ParseTuple(args, "y*n", &b, &most))
        return NULL;
    int r;
    Py_BEGIN_ALLOW_THREADS
    r = scan(b.buf, b.len, most);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&b);
    return PyBool_FromLong(r);
}
