/* SHA-256 of two streams that absorb the same bytes, in one pass with the CPU's SHA instructions.
 *
 * Why: the tensor writer (zen.represent.safetensors_io) hashes every byte it writes twice, for the tensor's own
 * sha256 (mr.json) and for the file's (the manifest), and so does the check of a case's tensor file. One SHA-256
 * stream is a chain of dependent rounds: on x86 CPUs with the SHA extensions each `sha256rnds2` waits for the one
 * before it, while the unit could start another sooner. OpenSSL (hashlib) hashes
 * one stream at a time, so the two digests cost two chains. Here the rounds of a block of each stream are
 * interleaved, and both chains run in the time of about one (measured: 650 MB, two hashlib streams 0.98 s of CPU,
 * the pair 0.52 s, one stream 0.49 s).
 *
 * Offered only where the CPU has the SHA extensions (`sha256_ni`); elsewhere the caller uses hashlib, which stays
 * the reference: zen.evidence.hashing checks this code against it before first use, and the tests on every length.
 *
 *   Sha256(data=b"")          a hashlib-like object: update(data), digest(), hexdigest(), copy()
 *   update_pair(a, b, data)   a.update(data); b.update(data), with the blocks of a and b interleaved
 *   sha256_ni                 True where the CPU has SHA, SSSE3 and SSE4.1 (the type refuses to be made otherwise)
 */
#include "native.h"
#include <string.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#include <immintrin.h>
#define ZEN_SHA_X86 1
#define TARGET __attribute__((target("sha,sse4.1,ssse3")))
#endif

#define RELEASE_GIL_ABOVE 2048 /* as hashlib: below this the lock's round trip costs more than it frees */

typedef struct {
    PyObject_HEAD
    uint32_t h[8];
    uint8_t buf[64];
    uint32_t fill;  /* bytes waiting in buf */
    uint64_t total; /* bytes absorbed */
    int busy;       /* being updated with the GIL released: another thread must not touch it */
} Sha256;

static const uint32_t H0[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                               0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};

static int have_sha = 0; /* set once at import from CPUID */

#ifdef ZEN_SHA_X86
static const uint32_t K[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

/* The state as the SHA instructions hold it: (A, B, E, F) and (C, D, G, H) */
TARGET static inline void load_state(const uint32_t *h, __m128i *abef, __m128i *cdgh)
{
    __m128i dcba = _mm_shuffle_epi32(_mm_loadu_si128((const __m128i *)&h[0]), 0xB1);
    __m128i efgh = _mm_shuffle_epi32(_mm_loadu_si128((const __m128i *)&h[4]), 0x1B);
    *abef = _mm_alignr_epi8(dcba, efgh, 8);
    *cdgh = _mm_blend_epi16(efgh, dcba, 0xF0);
}

TARGET static inline void store_state(uint32_t *h, __m128i abef, __m128i cdgh)
{
    __m128i feba = _mm_shuffle_epi32(abef, 0x1B);
    __m128i dchg = _mm_shuffle_epi32(cdgh, 0xB1);
    _mm_storeu_si128((__m128i *)&h[0], _mm_blend_epi16(feba, dchg, 0xF0));
    _mm_storeu_si128((__m128i *)&h[4], _mm_alignr_epi8(dchg, feba, 8));
}

/* W[t..t+3] from the four groups before it (FIPS 180-4 6.2.2 step 1) */
#define NEXT_W(w4, w3, w2, w1) \
    _mm_sha256msg2_epu32(_mm_add_epi32(_mm_sha256msg1_epu32((w4), (w3)), _mm_alignr_epi8((w1), (w2), 4)), (w1))
/* four rounds with message group w */
#define ROUNDS4(abef, cdgh, w, i)                                                   \
    do {                                                                            \
        __m128i m_ = _mm_add_epi32((w), _mm_loadu_si128((const __m128i *)&K[4 * (i)])); \
        (cdgh) = _mm_sha256rnds2_epu32((cdgh), (abef), m_);                         \
        (abef) = _mm_sha256rnds2_epu32((abef), (cdgh), _mm_shuffle_epi32(m_, 0x0E)); \
    } while (0)

TARGET static void compress1(uint32_t *h, const uint8_t *p, size_t blocks)
{
    const __m128i swap = _mm_set_epi64x(0x0c0d0e0f08090a0bULL, 0x0405060700010203ULL);
    __m128i abef, cdgh;
    load_state(h, &abef, &cdgh);
    for (; blocks; blocks--, p += 64) {
        __m128i a0 = abef, c0 = cdgh, w[4];
        for (int j = 0; j < 4; j++)
            w[j] = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(p + 16 * j)), swap);
#pragma GCC unroll 16
        for (int i = 0; i < 16; i++) {
            if (i >= 4)
                w[i & 3] = NEXT_W(w[i & 3], w[(i + 1) & 3], w[(i + 2) & 3], w[(i + 3) & 3]);
            ROUNDS4(abef, cdgh, w[i & 3], i);
        }
        abef = _mm_add_epi32(abef, a0);
        cdgh = _mm_add_epi32(cdgh, c0);
    }
    store_state(h, abef, cdgh);
}

/* `blocks` blocks of each stream, their rounds interleaved: two independent chains for the SHA unit */
TARGET static void compress2(uint32_t *ha, const uint8_t *pa, uint32_t *hb, const uint8_t *pb, size_t blocks)
{
    const __m128i swap = _mm_set_epi64x(0x0c0d0e0f08090a0bULL, 0x0405060700010203ULL);
    __m128i abef, cdgh, xabef, xcdgh;
    load_state(ha, &abef, &cdgh);
    load_state(hb, &xabef, &xcdgh);
    for (; blocks; blocks--, pa += 64, pb += 64) {
        __m128i a0 = abef, c0 = cdgh, xa0 = xabef, xc0 = xcdgh, w[4], x[4];
        for (int j = 0; j < 4; j++) {
            w[j] = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(pa + 16 * j)), swap);
            x[j] = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(pb + 16 * j)), swap);
        }
#pragma GCC unroll 16
        for (int i = 0; i < 16; i++) {
            if (i >= 4) {
                w[i & 3] = NEXT_W(w[i & 3], w[(i + 1) & 3], w[(i + 2) & 3], w[(i + 3) & 3]);
                x[i & 3] = NEXT_W(x[i & 3], x[(i + 1) & 3], x[(i + 2) & 3], x[(i + 3) & 3]);
            }
            ROUNDS4(abef, cdgh, w[i & 3], i);
            ROUNDS4(xabef, xcdgh, x[i & 3], i);
        }
        abef = _mm_add_epi32(abef, a0);
        cdgh = _mm_add_epi32(cdgh, c0);
        xabef = _mm_add_epi32(xabef, xa0);
        xcdgh = _mm_add_epi32(xcdgh, xc0);
    }
    store_state(ha, abef, cdgh);
    store_state(hb, xabef, xcdgh);
}

static int detect(void)
{
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & bit_SSSE3) || !(c & bit_SSE4_1))
        return 0;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d))
        return 0;
    return (b & (1u << 29)) != 0; /* CPUID.(EAX=7,ECX=0):EBX.SHA */
}
#else
static void compress1(uint32_t *h, const uint8_t *p, size_t blocks) { (void)h; (void)p; (void)blocks; }
static void compress2(uint32_t *ha, const uint8_t *pa, uint32_t *hb, const uint8_t *pb, size_t blocks)
{
    (void)ha; (void)pa; (void)hb; (void)pb; (void)blocks;
}
static int detect(void) { return 0; }
#endif

/* Bytes into s's partial block until it is full or p ends; the block is hashed when full. Returns bytes taken. */
static size_t top_up(Sha256 *s, const uint8_t *p, size_t n)
{
    size_t take = 64 - s->fill < n ? 64 - s->fill : n;
    memcpy(s->buf + s->fill, p, take);
    s->fill += (uint32_t)take;
    if (s->fill == 64) {
        compress1(s->h, s->buf, 1);
        s->fill = 0;
    }
    return take;
}

/* The same n bytes into a and (when b is not NULL) b; neither may be touched by another thread meanwhile */
static void absorb(Sha256 *a, Sha256 *b, const uint8_t *p, size_t n)
{
    size_t ia = a->fill ? top_up(a, p, n) : 0, ib = (b && b->fill) ? top_up(b, p, n) : 0;
    a->total += n;
    size_t na = (n - ia) / 64;
    if (b != NULL) {
        b->total += n;
        size_t nb = (n - ib) / 64, both = na < nb ? na : nb;
        compress2(a->h, p + ia, b->h, p + ib, both);
        if (nb > both)
            compress1(b->h, p + ib + 64 * both, nb - both);
        ib += 64 * nb;
        if (ib < n) /* a stream whose block was topped up has nothing left when n was short */
            top_up(b, p + ib, n - ib);
        ia += 64 * both;
        na -= both;
    }
    compress1(a->h, p + ia, na);
    ia += 64 * na;
    if (ia < n)
        top_up(a, p + ia, n - ia);
}

static PyObject *sha_new(PyTypeObject *type, PyObject *args, PyObject *kw);

static int feed(Sha256 *a, Sha256 *b, PyObject *data)
{
    if (b == a) /* the same object twice: it absorbs the bytes twice, as two update() calls would */
        return feed(a, NULL, data) < 0 ? -1 : feed(a, NULL, data);
    Py_buffer view;
    if (PyObject_GetBuffer(data, &view, PyBUF_SIMPLE) < 0)
        return -1;
    if (a->busy || (b != NULL && b->busy)) { /* checked and set with the GIL held */
        PyErr_SetString(PyExc_RuntimeError, "Sha256 object updated by two threads at once");
        PyBuffer_Release(&view);
        return -1;
    }
    a->busy = 1;
    if (b != NULL)
        b->busy = 1;
    if (view.len >= RELEASE_GIL_ABOVE) {
        Py_BEGIN_ALLOW_THREADS
        absorb(a, b, view.buf, (size_t)view.len);
        Py_END_ALLOW_THREADS
    } else {
        absorb(a, b, view.buf, (size_t)view.len);
    }
    a->busy = 0;
    if (b != NULL)
        b->busy = 0;
    PyBuffer_Release(&view);
    return 0;
}

static PyObject *sha_update(Sha256 *self, PyObject *data)
{
    if (feed(self, NULL, data) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static void finish(const Sha256 *s, uint8_t out[32])
{
    Sha256 t = *s;
    uint64_t bits = t.total * 8;
    uint8_t pad[72] = {0x80};
    size_t n = (t.fill < 56 ? 56 : 120) - t.fill;
    for (int i = 0; i < 8; i++)
        pad[n + i] = (uint8_t)(bits >> (56 - 8 * i));
    absorb(&t, NULL, pad, n + 8);
    for (int i = 0; i < 8; i++) {
        out[4 * i] = (uint8_t)(t.h[i] >> 24);
        out[4 * i + 1] = (uint8_t)(t.h[i] >> 16);
        out[4 * i + 2] = (uint8_t)(t.h[i] >> 8);
        out[4 * i + 3] = (uint8_t)t.h[i];
    }
}

/* digest/copy of an object another thread is updating would read a state being written: refused, as update is */
static int idle(Sha256 *s)
{
    if (!s->busy)
        return 0;
    PyErr_SetString(PyExc_RuntimeError, "Sha256 object read while another thread updates it");
    return -1;
}

static PyObject *sha_digest(Sha256 *self, PyObject *unused)
{
    uint8_t out[32];
    if (idle(self) < 0)
        return NULL;
    finish(self, out);
    return PyBytes_FromStringAndSize((const char *)out, 32);
}

static PyObject *sha_hexdigest(Sha256 *self, PyObject *unused)
{
    static const char hex[] = "0123456789abcdef";
    uint8_t out[32];
    char text[64];
    if (idle(self) < 0)
        return NULL;
    finish(self, out);
    for (int i = 0; i < 32; i++) {
        text[2 * i] = hex[out[i] >> 4];
        text[2 * i + 1] = hex[out[i] & 15];
    }
    return PyUnicode_FromStringAndSize(text, 64);
}

static PyObject *sha_copy(Sha256 *self, PyObject *unused)
{
    if (idle(self) < 0)
        return NULL;
    Sha256 *c = (Sha256 *)sha_new(Py_TYPE(self), NULL, NULL);
    if (c != NULL) {
        memcpy(c->h, self->h, sizeof self->h);
        memcpy(c->buf, self->buf, sizeof self->buf);
        c->fill = self->fill;
        c->total = self->total;
    }
    return (PyObject *)c;
}

static PyObject *sha_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    PyObject *data = NULL;
    static char *names[] = {"data", NULL};
    if (args != NULL && !PyArg_ParseTupleAndKeywords(args, kw, "|O:Sha256", names, &data))
        return NULL;
    if (!have_sha) {
        PyErr_SetString(PyExc_RuntimeError, "this CPU has no SHA extensions: use hashlib.sha256");
        return NULL;
    }
    Sha256 *s = (Sha256 *)type->tp_alloc(type, 0);
    if (s == NULL)
        return NULL;
    memcpy(s->h, H0, sizeof H0);
    s->fill = 0;
    s->total = 0;
    s->busy = 0;
    if (data != NULL && feed(s, NULL, data) < 0) {
        Py_DECREF(s);
        return NULL;
    }
    return (PyObject *)s;
}

static PyObject *sha_name(Sha256 *self, void *closure) { return PyUnicode_FromString("sha256"); }
static PyObject *sha_size(Sha256 *self, void *closure) { return PyLong_FromLong(32); }

static PyMethodDef sha_methods[] = {
    {"update", (PyCFunction)sha_update, METH_O, "update(data): absorb bytes (any contiguous buffer)"},
    {"digest", (PyCFunction)sha_digest, METH_NOARGS, "digest() -> bytes: of everything absorbed so far"},
    {"hexdigest", (PyCFunction)sha_hexdigest, METH_NOARGS, "hexdigest() -> str: of everything absorbed so far"},
    {"copy", (PyCFunction)sha_copy, METH_NOARGS, "copy() -> Sha256: an independent copy of the state"},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef sha_getset[] = {{"name", (getter)sha_name, NULL, "sha256", NULL},
                                   {"digest_size", (getter)sha_size, NULL, "32", NULL},
                                   {NULL, NULL, NULL, NULL, NULL}};

PyTypeObject zen_sha256_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "zen.native._core.Sha256",
    .tp_basicsize = sizeof(Sha256),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "SHA-256 with the CPU's SHA instructions (hashlib.sha256's update/digest/hexdigest/copy)",
    .tp_new = sha_new,
    .tp_methods = sha_methods,
    .tp_getset = sha_getset,
};

PyObject *zen_sha256_update_pair(PyObject *self, PyObject *args)
{
    PyObject *a, *b, *data;
    if (!PyArg_ParseTuple(args, "O!O!O:update_pair", &zen_sha256_type, &a, &zen_sha256_type, &b, &data))
        return NULL;
    if (feed((Sha256 *)a, (Sha256 *)b, data) < 0)
        return NULL;
    Py_RETURN_NONE;
}

int zen_sha256_init(void)
{
    have_sha = detect();
    return PyType_Ready(&zen_sha256_type);
}

int zen_sha256_ni(void) { return have_sha; }

/* sha256 of n bytes, without an object: for code_rows.c, which is handed the Sha256 type only where
 * zen.evidence.hashing chose it (this CPU has the SHA instructions and the check against hashlib passed) */
void zen_sha256_oneshot(const uint8_t *p, size_t n, uint8_t out[32])
{
    Sha256 s;
    memcpy(s.h, H0, sizeof H0);
    s.fill = 0;
    s.total = 0;
    s.busy = 0;
    absorb(&s, NULL, p, n);
    finish(&s, out);
}
