/* What listing.c and listing_tables.c share: the tables of zen.cpython.code.listing as the compiled loop reads them. */
#ifndef ZEN_LISTING_H
#define ZEN_LISTING_H
#include "native.h"

typedef struct {
    PyObject *drop, *rename, *with_arg, *operand_kinds, *hooked, *unconditional, *returns;
    Py_ssize_t max_copy;
} Tables;

/* What the tables say about one name or kind, looked up once per distinct str object (opcode names and kinds are a
 * few hundred interned objects) instead of six hash lookups per instruction. Entries hold strong references, so
 * a key's address is not reused while it is here; the memo belongs to one tables object (refilled for another). */
typedef struct {
    PyObject *key, *renamed, *when; /* renamed: RENAME.get(key, key); when: hooked.get(key) or NULL */
    char drop, with_arg, operand, unconditional, returns;
} Info;

/* the entry of an exact str `key` (valid during one call of listing), `scratch` where the memo is full; NULL: error */
Info *zen_info_of(const Tables *t, PyObject *key, Info *scratch);
/* the memo serves one tables object: listing empties it when another comes */
void zen_memo_clear(void);
extern PyObject *zen_memo_tables;
/* 1 where `a` equals the interned str `b`, as `a == b` says */
int zen_same(PyObject *a, PyObject *b);
/* `key in container` (a set, frozenset or dict); -1: error */
int zen_has(PyObject *container, PyObject *key);

#endif
