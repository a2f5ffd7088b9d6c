/* zen.native._core: compiled forms of pure-Python hot paths.
 *
 * Each function here has a pure-Python reference in the module named beside it, which stays the
 * fallback (ZEN_PURE=1, or this extension not built) and the definition of what is right: the tests
 * run both on real case files, real code objects and hostile inputs and require the same answers.
 * Nothing here reads memory it was not handed as a Python object; every bound the reference checks
 * is checked here the same way (nesting depth, string lengths, indexes into tables).
 *
 *   record_ok(value, spec, depth, max_depth, max_string)   validate.c
 *       zen.represent.schema._record_ok / _ok / _walk_ok
 *   decode(code, names, localsplus, consts, table, params, Instruction)   decode.c
 *       zen.cpython.code.instructions.decode_pure
 *   deoptimize(adaptive, deopt, caches, cache_op)   decode.c
 *       zen.cpython.code.bytecode.deoptimize_pure
 *   canonical(data, layout, budget, max_depth)   marshal_parse.c, marshal_emit.c
 *       zen.cpython.code.canonical_marshal._canonical_pure
 *   greedy_rows(d_ids, d_ptr, d_vec, g_ids, g_ptr, g_vec, used, topn, ibss), attr_matrix(...)   match.c
 *       zen.attribute.matching's greedy loop and attr_matrix
 *   long_number(text, most)   longnum.c
 *       zen.represent.jsontext._long_number
 *   u64_find(block, vals, sieve, plo, pwidth, mark)   scan.c
 *       zen.memory.scan's word search (find_u64_in, find_u64_in_mapped)
 *   find_all(buffer, needle, start, end, most), find_many(buffer, needles, start, ends, mosts)   find.c
 *       zen.memory.system.kernel._find_all (find_many: one find_all per needle)
 *   listing(instructions, consts, tables, hook)   listing.c, listing_tables.c
 *       zen.cpython.code.listing.normalise_pure (with instructions.with_consts)
 *   code_rows(addrs, codes, good, quals, qual_strs, fnames, fname_strs, lines, quick, modules, tables, hasher)
 *       code_rows.c: zen.cpython.program.system_table._code_rows's loop
 *   Objects(starts, ends, ids, offs, buffers, caches, params): kind, read, str, strs, items, bytes,
 *       code, function   objects.c, code_object.c, functions.c
 *       zen.cpython.interp.Interpreter.kind/.str/.read_within, readers.containers.read_tuple, readers.text,
 *       readers.code.read_code, readers.functions.read_function
 *
 * This file holds the module table; built by setup.py (pip install / install.sh) as zen.native._core.
 */
#include "native.h"

/* ---------------------------------------------------------------- module -------------------- */

static PyMethodDef methods[] = {
    {"record_ok", zen_record_ok, METH_VARARGS, "record_ok(value, spec, depth, max_depth, max_string) -> bool: zen.represent.schema's one-walk check"},
    {"decode", zen_decode, METH_VARARGS, "decode(...) -> list | None: zen.cpython.code.instructions.decode"},
    {"deoptimize", zen_deoptimize, METH_VARARGS, "deoptimize(adaptive, deopt, caches, cache_op) -> bytes: bytecode.deoptimize"},
    {"greedy_rows", zen_greedy_rows, METH_VARARGS, "greedy_rows(...) -> list: zen.attribute.matching's greedy loop"},
    {"attr_matrix", zen_attr_matrix, METH_VARARGS, "attr_matrix(d_ids, d_ptr, g_ids, g_ptr) -> bytes: Attr SS, float64"},
    {"long_number", zen_long_number, METH_VARARGS, "long_number(buffer, most) -> bool: jsontext._long_number"},
    {"u64_find", zen_u64_find, METH_VARARGS, "u64_find(block, vals, sieve, plo, pwidth, mark) -> (indexes, marks): zen.memory.scan"},
    {"find_all", zen_find_all, METH_VARARGS, "find_all(buffer, needle, start, end, most) -> list: kernel._find_all"},
    {"find_many", zen_find_many, METH_VARARGS, "find_many(buffer, needles, start, ends, mosts) -> tuple: find_all per needle, one pass"},
    {"listing", zen_listing, METH_VARARGS, "listing(instructions, consts, tables, hook) -> list | None: listing.normalise"},
    {"canonical", zen_canonical, METH_VARARGS, "canonical(data, layout, budget, max_depth) -> bytes | None: canonical_marshal"},
    {"code_rows", zen_code_rows, METH_VARARGS, "code_rows(...) -> (rows, fallback): system_table's rows"},
    {"update_pair", zen_sha256_update_pair, METH_VARARGS, "update_pair(a, b, data): two Sha256 absorb the same bytes"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_core", "zen's compiled hot paths", -1, methods,
                                    NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__core(void)
{
    if (zen_decode_init() < 0 || zen_canonical_init() < 0 || zen_listing_init() < 0 || zen_sha256_init() < 0)
        return NULL;
    if (PyType_Ready(&zen_objects_type) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && (PyModule_AddObjectRef(m, "Objects", (PyObject *)&zen_objects_type) < 0
                      || PyModule_AddObjectRef(m, "Sha256", (PyObject *)&zen_sha256_type) < 0
                      || PyModule_AddObjectRef(m, "sha256_ni", zen_sha256_ni() ? Py_True : Py_False) < 0))
        Py_CLEAR(m);
    return m;
}
