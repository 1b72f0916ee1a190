/* topics._gather: the memory-bound inner loop of SubscriptionIndex.match, and the index's
 * records and buckets off the cyclic collector's lists, in C (issue 42 item 3).
 *
 * Why C and not mypyc (docs/performance-topics.md, "Where the match time goes, and what the C
 * loop does about it"): at a million subscriptions ``match`` waits for memory, not for
 * instructions.  A random topic reads about 36 places that are not in the CPU caches (the
 * dict slots, entries and key strings of its lookups, the filters' buckets, about 10 records
 * and their client id strings).  The interpreter (and mypyc's code, which calls the same C API
 * one object at a time) takes those misses one after the other.  Here they are taken level by
 * level: the lookups' slots, entries, key strings and buckets (prefetch_lookups, from CPython's
 * own dict layout where this file knows it), then every record of every bucket, then every
 * record's client id string, and only then is the result built, so that the misses of one
 * level are in flight together (a few rounds of memory latency instead of about 30).
 * Measured at 1M subscriptions: match p50 3.6 us against 10.5 us for the same loop in Python.
 *
 * ``setup(record class, result class)``: ``topics._index._Sub`` and ``MatchResult``; the offsets
 * of their slots are read from their member descriptors, once.
 *
 * ``match(buckets, topic, specs)``: the whole of ``SubscriptionIndex.match`` but negative
 * entries and shared subscriptions, for an ASCII ``str`` topic of at most 64 levels (else
 * None: the caller runs its Python loop): builds the key of each wildcard shape in ``specs``,
 * then ``collect``.  O(levels x shapes + matched records).
 *
 * ``gather(buckets, keys)``: ``collect`` for keys computed by the caller (the filters' tree).
 * ``buckets`` is the index's dict filter -> bucket (a record, a tuple of records or a dict
 * client id -> record).  Returns the dict client id -> list of that client's matching records,
 * newest first (by ``seq``, descending), as ``SubscriptionIndex.match`` builds it in Python; or
 * None when a bucket holds something else than exact ``_Sub`` records with exact ``str``
 * client ids (never, from the index: the caller then takes its pure-Python path).
 * O(keys + matched records); memory O(matched records) for the duration of the call.
 *
 * ``record``, ``append``, ``untrack``: a record, a bucket tuple, and any of the index's dicts,
 * untracked by the cyclic collector (see ``record``: why that is safe, and what it saves).
 *
 * References: every bucket found is held (a new reference) while the call runs, and every
 * record too (a dict bucket could change if a collection ran a finalizer during an
 * allocation), so nothing borrowed can go away under the loop.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

/* The dict's own layout (CPython's internal header, for the version compiled against) lets the
 * lookups be prefetched too: slot, then entry, then key string and value, for all the keys at
 * once, before the ordinary lookups (PyDict_GetItemWithError) run on cached lines.  Only read,
 * never written; for CPython versions whose layout this code has been checked with. */
#if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030D0000 && !defined(Py_LIMITED_API)
#define Py_BUILD_CORE 1
#include "internal/pycore_dict.h"
#undef Py_BUILD_CORE
#define DICT_PREFETCH 1
#endif

#define STACK 64

static PyTypeObject *sub_type = NULL;
static PyTypeObject *result_type = NULL;
static Py_ssize_t clients_off = -1;
static Py_ssize_t shared_off = -1;
static Py_ssize_t cid_off = -1;
static Py_ssize_t filter_off = -1;
static Py_ssize_t options_off = -1;
static Py_ssize_t seq_off = -1;

#if defined(__GNUC__) || defined(__clang__)
#define PREFETCH(p) __builtin_prefetch((const void *)(p), 1, 3)
#else
#define PREFETCH(p) ((void)0)
#endif

/* a growable array of object pointers, on the stack up to STACK */
typedef struct {
    PyObject **items;
    Py_ssize_t n, cap;
    PyObject *stack[STACK];
} Vec;

static void vec_init(Vec *v) {
    v->items = v->stack;
    v->n = 0;
    v->cap = STACK;
}

static int vec_push(Vec *v, PyObject *o) {
    if (v->n == v->cap) {
        Py_ssize_t cap = v->cap * 2;
        PyObject **items;
        if (v->items == v->stack) {
            items = PyMem_Malloc(cap * sizeof(PyObject *));
            if (items != NULL) {
                memcpy(items, v->stack, v->n * sizeof(PyObject *));
            }
        } else {
            items = PyMem_Realloc(v->items, cap * sizeof(PyObject *));
        }
        if (items == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        v->items = items;
        v->cap = cap;
    }
    v->items[v->n++] = o;
    return 0;
}

static void vec_free(Vec *v) {
    if (v->items != v->stack) {
        PyMem_Free(v->items);
    }
}

static int slot_offset(PyObject *cls, const char *name, Py_ssize_t *off) {
    PyObject *d = PyObject_GetAttrString(cls, name);
    if (d == NULL) {
        return -1;
    }
    if (!Py_IS_TYPE(d, &PyMemberDescr_Type) || ((PyMemberDescrObject *)d)->d_member->type != T_OBJECT_EX) {
        PyErr_Format(PyExc_TypeError, "%s is not an object slot", name);
        Py_DECREF(d);
        return -1;
    }
    *off = ((PyMemberDescrObject *)d)->d_member->offset;
    Py_DECREF(d);
    return 0;
}

static PyObject *setup(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs) {
    Py_ssize_t c, s, rc, rs, f, o;
    if (nargs != 2 || !PyType_Check(args[0]) || !PyType_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "setup(record class, result class)");
        return NULL;
    }
    if (slot_offset(args[0], "client_id", &c) < 0 || slot_offset(args[0], "seq", &s) < 0 ||
        slot_offset(args[0], "topic_filter", &f) < 0 || slot_offset(args[0], "options", &o) < 0 ||
        slot_offset(args[1], "clients", &rc) < 0 || slot_offset(args[1], "shared", &rs) < 0) {
        return NULL;
    }
    Py_XSETREF(sub_type, (PyTypeObject *)Py_NewRef(args[0]));
    Py_XSETREF(result_type, (PyTypeObject *)Py_NewRef(args[1]));
    cid_off = c;
    seq_off = s;
    filter_off = f;
    options_off = o;
    clients_off = rc;
    shared_off = rs;
    Py_RETURN_NONE;
}

#define SLOT(o, off) (*(PyObject **)((char *)(o) + (off)))

static long seq_of(PyObject *rec) {
    PyObject *s = SLOT(rec, seq_off);
    return s == NULL ? -1 : PyLong_AsLong(s);
}

/* newest first: insertion sort by seq, descending (a client's matching records are few) */
static int sort_newest_first(PyObject *lst) {
    Py_ssize_t n = PyList_GET_SIZE(lst);
    PyObject **a = ((PyListObject *)lst)->ob_item;
    for (Py_ssize_t i = 1; i < n; i++) {
        PyObject *x = a[i];
        long k = seq_of(x);
        if (k == -1 && PyErr_Occurred()) {
            return -1;
        }
        Py_ssize_t j = i;
        while (j > 0) {
            long kj = seq_of(a[j - 1]);
            if (kj == -1 && PyErr_Occurred()) {
                return -1;
            }
            if (kj >= k) {
                break;
            }
            a[j] = a[j - 1];
            j--;
        }
        a[j] = x;
    }
    return 0;
}

/* set_dict_prefetch(flag): on by default where available; off to measure what it saves */
static int dict_prefetch = 1;

static PyObject *set_dict_prefetch(PyObject *Py_UNUSED(module), PyObject *flag) {
    int on = PyObject_IsTrue(flag);
    if (on < 0) {
        return NULL;
    }
#ifdef DICT_PREFETCH
    dict_prefetch = on;
    return Py_NewRef(on ? Py_True : Py_False);
#else
    return Py_NewRef(Py_False);
#endif
}

#ifdef DICT_PREFETCH
/* Prefetch what looking up keys[0:n] (exact str) in dict d will read, in three rounds over all
 * the keys: the index slot of each key's first probe; the entry it names; the entry's key
 * string (compared with the key) and its value (the bucket).  A later probe (a collision)
 * is not prefetched.  O(n); reads only; computes (and caches) each key's hash. */
static void prefetch_lookups(PyObject *d, PyObject *const *keys, Py_ssize_t n) {
    PyDictObject *mp = (PyDictObject *)d;
    PyDictKeysObject *dk = mp->ma_keys;
    if (mp->ma_values != NULL || n > STACK) {
        return;
    }
    size_t mask = ((size_t)1 << dk->dk_log2_size) - 1;
    int width = dk->dk_log2_index_bytes - dk->dk_log2_size; /* log2 of an index's bytes */
    size_t slot[STACK];
    Py_ssize_t ix[STACK];
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *k = keys[i];
        Py_hash_t h = PyUnicode_CheckExact(k) ? ((PyASCIIObject *)k)->hash : -1;
        if (h == -1) {
            if (!PyUnicode_CheckExact(k) || (h = PyObject_Hash(k)) == -1) {
                PyErr_Clear();
                slot[i] = (size_t)-1;
                continue;
            }
        }
        slot[i] = (size_t)h & mask;
        PREFETCH(dk->dk_indices + (slot[i] << width));
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        ix[i] = -1;
        if (slot[i] == (size_t)-1) {
            continue;
        }
        switch (width) {
        case 0: ix[i] = ((const int8_t *)dk->dk_indices)[slot[i]]; break;
        case 1: ix[i] = ((const int16_t *)dk->dk_indices)[slot[i]]; break;
        case 2: ix[i] = ((const int32_t *)dk->dk_indices)[slot[i]]; break;
        default: ix[i] = (Py_ssize_t)((const int64_t *)dk->dk_indices)[slot[i]]; break;
        }
        if (ix[i] >= 0) {
            PREFETCH(DK_IS_UNICODE(dk) ? (const void *)&DK_UNICODE_ENTRIES(dk)[ix[i]] : (const void *)&DK_ENTRIES(dk)[ix[i]]);
        }
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (ix[i] < 0) {
            continue;
        }
        PyObject *k, *v;
        if (DK_IS_UNICODE(dk)) {
            k = DK_UNICODE_ENTRIES(dk)[ix[i]].me_key;
            v = DK_UNICODE_ENTRIES(dk)[ix[i]].me_value;
        } else {
            k = DK_ENTRIES(dk)[ix[i]].me_key;
            v = DK_ENTRIES(dk)[ix[i]].me_value;
        }
        if (k != NULL) {
            PREFETCH(k);
            PREFETCH((const char *)k + 64); /* a filter's characters past the header */
        }
        if (v != NULL) {
            PREFETCH(v);
        }
    }
}
#endif

/* the records under keys[0:nkeys] of buckets: a new dict client id -> records newest first,
 * None (fall back), or NULL with an exception */
static PyObject *collect(PyObject *buckets, PyObject *const *keys, Py_ssize_t nkeys) {
    PyObject *result = NULL, *out = NULL;
    Vec found, recs, cids;
    Py_ssize_t held = 0;  /* records in recs.items[0:held] hold a reference */
    int multi = 0;
    vec_init(&found);
    vec_init(&recs);
    vec_init(&cids);

#ifdef DICT_PREFETCH
    if (dict_prefetch) {
        prefetch_lookups(buckets, keys, nkeys);
    }
#endif
    /* 1. the lookups; each bucket found is prefetched before the next lookup */
    for (Py_ssize_t i = 0; i < nkeys; i++) {
        PyObject *b = PyDict_GetItemWithError(buckets, keys[i]);
        if (b == NULL) {
            if (PyErr_Occurred()) {
                goto done;
            }
            continue;
        }
        PREFETCH(b);
        Py_INCREF(b);
        if (vec_push(&found, b) < 0) {
            Py_DECREF(b);
            goto done;
        }
    }
    /* 2. the records of every bucket, each prefetched */
    for (Py_ssize_t i = 0; i < found.n; i++) {
        PyObject *b = found.items[i];
        if (PyTuple_CheckExact(b)) {
            for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(b); j++) {
                PyObject *r = PyTuple_GET_ITEM(b, j);
                PREFETCH(r);
                if (vec_push(&recs, r) < 0) {
                    goto done;
                }
            }
        } else if (PyDict_CheckExact(b)) {
            Py_ssize_t pos = 0;
            PyObject *k, *r;
            while (PyDict_Next(b, &pos, &k, &r)) {
                PREFETCH(r);
                if (vec_push(&recs, r) < 0) {
                    goto done;
                }
            }
        } else if (vec_push(&recs, b) < 0) {
            goto done;
        }
    }
    /* 3. every record's client id, prefetched; the records held */
    for (; held < recs.n; held++) {
        PyObject *r = recs.items[held];
        if (!Py_IS_TYPE(r, sub_type)) {
            goto fallback;
        }
        PyObject *cid = SLOT(r, cid_off);
        if (cid == NULL) {
            goto fallback;
        }
        PREFETCH(cid);
        Py_INCREF(r);
        if (vec_push(&cids, cid) < 0) {
            goto done;
        }
    }
    /* 4. the result: client id -> [records] */
    result = _PyDict_NewPresized(recs.n);
    if (result == NULL) {
        goto done;
    }
    for (Py_ssize_t j = 0; j < recs.n; j++) {
        PyObject *cid = cids.items[j];
        if (!PyUnicode_CheckExact(cid)) {
            goto fallback;
        }
        PyObject *lst = PyList_New(1);
        if (lst == NULL) {
            goto done;
        }
        PyList_SET_ITEM(lst, 0, Py_NewRef(recs.items[j]));
        PyObject *got = PyDict_SetDefault(result, cid, lst);
        if (got == NULL) {
            Py_DECREF(lst);
            goto done;
        }
        if (got != lst) {  /* a client with two or more records here */
            multi = 1;
            if (PyList_Append(got, recs.items[j]) < 0) {
                Py_DECREF(lst);
                goto done;
            }
        }
        Py_DECREF(lst);
    }
    if (multi) {
        Py_ssize_t pos = 0;
        PyObject *k, *lst;
        while (PyDict_Next(result, &pos, &k, &lst)) {
            if (PyList_GET_SIZE(lst) > 1 && sort_newest_first(lst) < 0) {
                goto done;
            }
        }
    }
    out = result;
    result = NULL;
    goto done;
fallback:
    out = Py_NewRef(Py_None);
done:
    Py_XDECREF(result);
    for (Py_ssize_t j = 0; j < held; j++) {
        Py_DECREF(recs.items[j]);
    }
    for (Py_ssize_t i = 0; i < found.n; i++) {
        Py_DECREF(found.items[i]);
    }
    vec_free(&found);
    vec_free(&recs);
    vec_free(&cids);
    return out;
}

static PyObject *gather(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyDict_CheckExact(args[0]) || !PyList_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, "gather(buckets: dict, keys: list)");
        return NULL;
    }
    if (sub_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "gather() before setup()");
        return NULL;
    }
    return collect(args[0], ((PyListObject *)args[1])->ob_item, PyList_GET_SIZE(args[1]));
}

#define MAX_LEVELS 64

/* the key of one shape for an ASCII topic: its levels (start[i], end[i]) with '+' at the
 * shape's positions, cut to k levels, then '/#' (or '#') for a tail; NULL with an exception,
 * or NULL without one when the spec does not fit the topic (fall back) */
static PyObject *shape_key(const char *s, const Py_ssize_t *start, const Py_ssize_t *end, Py_ssize_t n,
                           PyObject *spec) {
    if (!PyTuple_CheckExact(spec) || PyTuple_GET_SIZE(spec) < 2) {
        return NULL;
    }
    Py_ssize_t k = PyLong_AsSsize_t(PyTuple_GET_ITEM(spec, 0));
    int tail = PyObject_IsTrue(PyTuple_GET_ITEM(spec, 1));
    if (k < 0 || tail < 0 || k > n || (!tail && k != n)) {
        return NULL;
    }
    char plus[MAX_LEVELS];
    memset(plus, 0, (size_t)n);
    for (Py_ssize_t j = 2; j < PyTuple_GET_SIZE(spec); j++) {
        Py_ssize_t p = PyLong_AsSsize_t(PyTuple_GET_ITEM(spec, j));
        if (p < 0 || p >= k) {
            return NULL;
        }
        plus[p] = 1;
    }
    Py_ssize_t len = 0;
    for (Py_ssize_t i = 0; i < k; i++) {
        len += (plus[i] ? 1 : end[i] - start[i]) + (i > 0);
    }
    if (tail) {
        len += 1 + (k > 0);
    }
    PyObject *key = PyUnicode_New(len, 127);
    if (key == NULL) {
        return NULL;
    }
    char *d = (char *)PyUnicode_1BYTE_DATA(key);
    for (Py_ssize_t i = 0; i < k; i++) {
        if (i > 0) {
            *d++ = '/';
        }
        if (plus[i]) {
            *d++ = '+';
        } else {
            memcpy(d, s + start[i], (size_t)(end[i] - start[i]));
            d += end[i] - start[i];
        }
    }
    if (tail) {
        if (k > 0) {
            *d++ = '/';
        }
        *d++ = '#';
    }
    return key;
}

/* match(buckets, topic, specs): the result of SubscriptionIndex.match before negative entries
 * and shared subscriptions, as a MatchResult (its ``shared`` a new empty dict), or None (fall
 * back: a topic that is not an ASCII str, or deeper than MAX_LEVELS).  ``specs``: a tuple of
 * ``(levels, ends with '#', *'+' positions)`` per wildcard shape that can match the topic's
 * length (_Shapes.for_length).  O(levels x shapes + matched records). */
static PyObject *match(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3 || !PyDict_CheckExact(args[0]) || !PyUnicode_Check(args[1]) || !PyTuple_CheckExact(args[2])) {
        PyErr_SetString(PyExc_TypeError, "match(buckets: dict, topic: str, specs: tuple)");
        return NULL;
    }
    if (sub_type == NULL || result_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "match() before setup()");
        return NULL;
    }
    PyObject *buckets = args[0], *topic = args[1], *specs = args[2];
    if (!PyUnicode_CheckExact(topic) || !PyUnicode_IS_ASCII(topic)) {
        Py_RETURN_NONE;
    }
    const char *s = (const char *)PyUnicode_1BYTE_DATA(topic);
    Py_ssize_t len = PyUnicode_GET_LENGTH(topic);
    Py_ssize_t start[MAX_LEVELS], end[MAX_LEVELS], n = 0;
    start[0] = 0;
    for (Py_ssize_t i = 0; i < len; i++) {
        if (s[i] == '/') {
            if (n + 1 >= MAX_LEVELS) {
                Py_RETURN_NONE;
            }
            end[n++] = i;
            start[n] = i + 1;
        }
    }
    end[n++] = len;
    Py_ssize_t nspecs = PyTuple_GET_SIZE(specs);
    PyObject *kstack[STACK];
    PyObject **keys = kstack;
    PyObject *clients = NULL, *out = NULL;
    Py_ssize_t nkeys = 0;
    if (nspecs + 1 > STACK) {
        keys = PyMem_Malloc((size_t)(nspecs + 1) * sizeof(PyObject *));
        if (keys == NULL) {
            return PyErr_NoMemory();
        }
    }
    keys[nkeys++] = Py_NewRef(topic);
    for (Py_ssize_t i = 0; i < nspecs; i++) {
        PyObject *key = shape_key(s, start, end, n, PyTuple_GET_ITEM(specs, i));
        if (key == NULL) {
            if (!PyErr_Occurred()) {
                out = Py_NewRef(Py_None);
            }
            goto done;
        }
        keys[nkeys++] = key;
    }
    clients = collect(buckets, keys, nkeys);
    if (clients == NULL || clients == Py_None) {
        out = clients;
        clients = NULL;
        goto done;
    }
    PyObject *shared = PyDict_New();
    if (shared == NULL) {
        goto done;
    }
    out = result_type->tp_alloc(result_type, 0);
    if (out == NULL) {
        Py_DECREF(shared);
        goto done;
    }
    SLOT(out, clients_off) = clients;
    SLOT(out, shared_off) = shared;
    clients = NULL;
done:
    Py_XDECREF(clients);
    for (Py_ssize_t i = 0; i < nkeys; i++) {
        Py_DECREF(keys[i]);
    }
    if (keys != kstack) {
        PyMem_Free(keys);
    }
    return out;
}

/* record(topic_filter, options, client_id, seq): a new record (``_Sub``) with these slots,
 * not tracked by the cyclic garbage collector.  O(1).
 *
 * Untracked: the collector never traverses it, so a full collection's pass over a million
 * subscriptions skips them (and the tuples and dicts holding only records: CPython untracks
 * those itself at their first collection).  The record refers to two strings, a small int
 * and the caller's options object; a reference cycle through a record (options that refer
 * back to the record ``match`` returned) would not be collected: the index's options never
 * do (the broker's are frozen values made before the record). */
static PyObject *record(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "record(topic_filter, options, client_id, seq)");
        return NULL;
    }
    if (sub_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "record() before setup()");
        return NULL;
    }
    PyObject *r = sub_type->tp_alloc(sub_type, 0);
    if (r == NULL) {
        return NULL;
    }
    PyObject_GC_UnTrack(r);
    SLOT(r, filter_off) = Py_NewRef(args[0]);
    SLOT(r, options_off) = Py_NewRef(args[1]);
    SLOT(r, cid_off) = Py_NewRef(args[2]);
    SLOT(r, seq_off) = Py_NewRef(args[3]);
    return r;
}

/* append(bucket, rec): a new tuple, the records of ``bucket`` (a tuple, or one record) then
 * ``rec``, not tracked by the cyclic collector (it holds records, which never refer back to
 * a bucket: no cycle can pass through it; CPython itself never untracks a tuple of instances
 * of a class).  O(len(bucket)). */
static PyObject *append(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "append(bucket, rec)");
        return NULL;
    }
    PyObject *b = args[0], *t;
    if (PyTuple_CheckExact(b)) {
        Py_ssize_t n = PyTuple_GET_SIZE(b);
        t = PyTuple_New(n + 1);
        if (t == NULL) {
            return NULL;
        }
        for (Py_ssize_t i = 0; i < n; i++) {
            PyTuple_SET_ITEM(t, i, Py_NewRef(PyTuple_GET_ITEM(b, i)));
        }
        PyTuple_SET_ITEM(t, n, Py_NewRef(args[1]));
    } else {
        t = PyTuple_Pack(2, b, args[1]);
        if (t == NULL) {
            return NULL;
        }
    }
    PyObject_GC_UnTrack(t);
    return t;
}

static PyObject *untrack(PyObject *Py_UNUSED(module), PyObject *obj) {
    if (PyObject_GC_IsTracked(obj)) {
        PyObject_GC_UnTrack(obj);
    }
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"setup", (PyCFunction)(void (*)(void))setup, METH_FASTCALL,
     "setup(record class, result class): their slots (client_id, seq; clients, shared)"},
    {"match", (PyCFunction)(void (*)(void))match, METH_FASTCALL,
     "match(buckets, topic, specs) -> MatchResult before negatives and shared, or None"},
    {"gather", (PyCFunction)(void (*)(void))gather, METH_FASTCALL,
     "gather(buckets, keys) -> dict client id -> records newest first, or None"},
    {"record", (PyCFunction)(void (*)(void))record, METH_FASTCALL,
     "record(topic_filter, options, client_id, seq) -> a new record, not tracked by the collector"},
    {"append", (PyCFunction)(void (*)(void))append, METH_FASTCALL,
     "append(bucket, rec) -> a new tuple of the bucket's records and rec, not tracked by the collector"},
    {"set_dict_prefetch", (PyCFunction)set_dict_prefetch, METH_O,
     "set_dict_prefetch(flag) -> whether the dict lookups are prefetched now (benchmarks)"},
    {"untrack", (PyCFunction)untrack, METH_O, "untrack(obj): take obj off the cyclic collector's lists"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "topics._gather", "The memory-bound loop of SubscriptionIndex.match (see topics/_gather.c).",
    -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__gather(void) {
    return PyModule_Create(&module_def);
}
