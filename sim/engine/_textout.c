/* The per-record loops of `sim5d run`'s largest outputs, compiled: the engine's records from its
 * log (sim.engine.core.Engine._make_records_py); the text of the Kineto traces
 * (sim.engine.kineto._host_and_gpu_py), their host items (kineto._items, _place, kept as C
 * structs: host_plan, plan_events), their NCCL args (kineto._details) and a rank's records in
 * order; records sorted by their fields (sim.engine.outputs.sort_records); the Chrome trace's
 * complete events (outputs.chrome_trace_parts), timeline.csv's rows (outputs.write_timeline_csv),
 * the slice args' texts and names' keys (sim.engine.slice_args) and the pipeline chart's runs
 * (outputs._chart_runs_py), each the same as its Python copy, the text as UTF-8 bytes
 * (tests/test_textout.py compares every output file with the module and without it, and each
 * function with its copy or an independent truth). A million-record step spends most of its
 * output time making these strings one f-string at a time; here each is appended to one buffer,
 * and the bytes go to the file without being decoded and encoded again.
 *
 * Times are integer nanoseconds written as microseconds the way `us_text` writes them (the
 * integer part, then the three decimals without trailing zeros, ".0" for none). It is exact only
 * for 0 <= ns < 10^15 (US_TEXT_LIMIT_NS): for anything else, or an integer that does not fit in
 * 64 bits, a function returns None and its caller runs the Python loop, which writes the float's
 * repr as json.dumps does. Strings are written as json.dumps writes them with ensure_ascii
 * (CPython's Modules/_json.c, ascii_escape_unichar) or, in the CSV, as csv.writer's default
 * dialect writes them (QUOTE_MINIMAL: Modules/_csv.c).
 *
 * Built by hatch_build.py where a C compiler is present; without it the Python loops run. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

#define US_LIMIT 1000000000000000LL  /* sim.engine.outputs.US_TEXT_LIMIT_NS */

/* The text being written, in a bytes object that grows (its bytes are handed over as they are,
 * not copied: a million-row timeline is 80 MB) */
typedef struct {
    PyObject *o;                               /* the bytes object (owned), NULL before any text */
    char *p;
    Py_ssize_t n, cap;
} Buf;

#define BUF_INIT {NULL, NULL, 0, 0}

#if defined(__GNUC__)
#define COLD __attribute__((noinline, cold))
#define HOT static inline __attribute__((always_inline))
#else
#define COLD
#define HOT static inline
#endif

/* Room for `need` more bytes: the buffer doubled (the rare case, kept out of line) */
COLD static int grow_slow(Buf *b, Py_ssize_t need) {
    Py_ssize_t cap = b->cap ? b->cap : 1 << 16;
    while (cap < b->n + need) cap *= 2;
    if (!b->o) b->o = PyBytes_FromStringAndSize(NULL, cap);
    else if (_PyBytes_Resize(&b->o, cap) < 0) b->o = NULL;          /* (it freed the old one) */
    if (!b->o) {
        b->p = NULL;
        b->n = b->cap = 0;
        return -1;
    }
    b->p = PyBytes_AS_STRING(b->o);
    b->cap = cap;
    return 0;
}

HOT int grow(Buf *b, Py_ssize_t need) { return b->n + need <= b->cap ? 0 : grow_slow(b, need); }

HOT int put(Buf *b, const char *s, Py_ssize_t n) {
    if (grow(b, n)) return -1;
    memcpy(b->p + b->n, s, (size_t)n);
    b->n += n;
    return 0;
}

#define PUT(b, lit) put((b), (lit), (Py_ssize_t)sizeof(lit) - 1)

static const char PAIRS[201] =
    "00010203040506070809101112131415161718192021222324252627282930313233343536373839"
    "40414243444546474849505152535455565758596061626364656667686970717273747576777879"
    "8081828384858687888990919293949596979899";

HOT int put_int(Buf *b, long long v) {
    char tmp[24];
    int i = 24;
    unsigned long long u = v < 0 ? 0ULL - (unsigned long long)v : (unsigned long long)v;
    while (u >= 100) {                         /* two digits at a time */
        unsigned d = (unsigned)(u % 100) * 2;
        u /= 100;
        tmp[--i] = PAIRS[d + 1];
        tmp[--i] = PAIRS[d];
    }
    if (u >= 10) {
        tmp[--i] = PAIRS[u * 2 + 1];
        tmp[--i] = PAIRS[u * 2];
    } else {
        tmp[--i] = (char)('0' + u);
    }
    if (v < 0) tmp[--i] = '-';
    return put(b, tmp + i, 24 - i);
}

/* us_text(ns) for 0 <= ns < US_LIMIT (checked by the caller) */
HOT int put_us(Buf *b, long long ns) {
    int r = (int)(ns % 1000);
    if (put_int(b, ns / 1000)) return -1;
    char t[4] = {'.', (char)('0' + r / 100), (char)('0' + r / 10 % 10), (char)('0' + r % 10)};
    if (r == 0) return PUT(b, ".0");
    return put(b, t, r % 10 ? 4 : r % 100 ? 3 : 2);
}

/* A str's UTF-8 bytes (kept by the str) and their number; NULL with an error if not a str */
static const char *utf8(PyObject *s, Py_ssize_t *n) {
    if (!PyUnicode_Check(s)) {
        PyErr_SetString(PyExc_TypeError, "_textout: expected a str");
        return NULL;
    }
    return PyUnicode_AsUTF8AndSize(s, n);
}

/* A str's UTF-8 bytes as they are */
static int put_str(Buf *b, PyObject *s) {
    Py_ssize_t n;
    const char *c = utf8(s, &n);
    return c ? put(b, c, n) : -1;
}

/* A str as a JSON string, as json.dumps writes it with ensure_ascii (Modules/_json.c) */
static int put_json(Buf *b, PyObject *s) {
    static const char hex[] = "0123456789abcdef";
    if (!PyUnicode_Check(s)) {
        PyErr_SetString(PyExc_TypeError, "_textout: expected a str");
        return -1;
    }
    Py_ssize_t n = PyUnicode_GET_LENGTH(s);
    int kind = PyUnicode_KIND(s);
    const void *data = PyUnicode_DATA(s);
    if (grow(b, 2 + 12 * n)) return -1;           /* the longest escape: a surrogate pair */
    char *o = b->p + b->n;
    *o++ = '"';
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_UCS4 c = PyUnicode_READ(kind, data, i);
        if (c >= ' ' && c <= '~' && c != '\\' && c != '"') {
            *o++ = (char)c;
            continue;
        }
        *o++ = '\\';
        switch (c) {
        case '\\': *o++ = '\\'; break;
        case '"': *o++ = '"'; break;
        case '\b': *o++ = 'b'; break;
        case '\f': *o++ = 'f'; break;
        case '\n': *o++ = 'n'; break;
        case '\r': *o++ = 'r'; break;
        case '\t': *o++ = 't'; break;
        default:
            if (c >= 0x10000) {
                Py_UCS4 v = c - 0x10000;
                Py_UCS4 hi = 0xd800 | ((v >> 10) & 0x3ff);
                *o++ = 'u';
                *o++ = hex[(hi >> 12) & 0xf];
                *o++ = hex[(hi >> 8) & 0xf];
                *o++ = hex[(hi >> 4) & 0xf];
                *o++ = hex[hi & 0xf];
                *o++ = '\\';
                c = 0xdc00 | (v & 0x3ff);
            }
            *o++ = 'u';
            *o++ = hex[(c >> 12) & 0xf];
            *o++ = hex[(c >> 8) & 0xf];
            *o++ = hex[(c >> 4) & 0xf];
            *o++ = hex[c & 0xf];
        }
    }
    *o++ = '"';
    b->n = o - b->p;
    return 0;
}

/* An int object's value; 1 where it is not an int that fits in 64 bits (the caller gives up) */
static int get_ll(PyObject *o, long long *v) {
    int overflow = 0;
    if (!PyLong_Check(o)) return 1;
    *v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (overflow) return 1;
    if (*v == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return 1;
    }
    return 0;
}

/* An int that is a time the loops add offsets to: 64-bit with room to spare (|v| < 2^62 ns, 146
 * years), so that no sum of two overflows; 1 where it is not (the caller gives up) */
static int get_t(PyObject *o, long long *v) {
    return get_ll(o, v) || *v <= -(1LL << 62) || *v >= (1LL << 62);
}

/* The value of a dict entry as an int (a stream's id) */
static int get_id(PyObject *dict, PyObject *key, long long *v) {
    PyObject *o = PyDict_GetItemWithError(dict, key);
    if (!o) {
        if (!PyErr_Occurred()) PyErr_SetObject(PyExc_KeyError, key);
        return -1;
    }
    if (get_ll(o, v)) {
        PyErr_SetString(PyExc_TypeError, "_textout: a stream id is not an int");
        return -1;
    }
    return 0;
}

/* The text written as bytes (or None where the writer gave up), the buffer released */
static PyObject *done(Buf *b, int gave_up) {
    PyObject *out = NULL;
    if (!gave_up && !PyErr_Occurred()) {
        if (!b->o) out = PyBytes_FromStringAndSize("", 0);
        else if (_PyBytes_Resize(&b->o, b->n) == 0) out = b->o;      /* (on failure it freed it) */
        b->o = NULL;
    } else if (gave_up && !PyErr_Occurred()) {
        out = Py_NewRef(Py_None);
    }
    Py_CLEAR(b->o);
    b->p = NULL;
    b->n = b->cap = 0;
    return out;
}

/* Record's fields (sim.engine.core.Record) */
enum { R_RANK, R_STREAM, R_NAME, R_CAT, R_START, R_END, R_VALUE };

#define FAIL(cond) do { if (cond) goto fail; } while (0)
#define GIVE_UP(cond) do { if (cond) { gave_up = 1; goto fail; } } while (0)

/* chrome_events(records, texts, cats, tids) -> bytes or None: chrome_trace_parts' complete events
 * of `records` joined by ",": name, category (`cats`: cat -> its JSON string), pid (the rank),
 * tid (`tids`: stream -> id), ts and dur in microseconds, then `"args":` and each record's
 * `texts` entry (its args as JSON), where texts is not None, and the closing brace. */
static PyObject *chrome_events(PyObject *self, PyObject *args) {
    PyObject *recs, *texts, *cats, *tids;
    if (!PyArg_ParseTuple(args, "O!OO!O!", &PyList_Type, &recs, &texts, &PyDict_Type, &cats, &PyDict_Type, &tids))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(recs);
    if (texts != Py_None && (!PyList_Check(texts) || PyList_GET_SIZE(texts) != n)) {
        PyErr_SetString(PyExc_ValueError, "chrome_events: texts is not a list of one per record");
        return NULL;
    }
    Buf b = BUF_INIT;
    int gave_up = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *r = PyList_GET_ITEM(recs, i);
        long long rank, start, end, tid;
        FAIL(!PyTuple_Check(r) || PyTuple_GET_SIZE(r) < 6);
        GIVE_UP(get_ll(PyTuple_GET_ITEM(r, R_RANK), &rank) || get_ll(PyTuple_GET_ITEM(r, R_START), &start)
                || get_ll(PyTuple_GET_ITEM(r, R_END), &end));
        GIVE_UP(start < 0 || start >= US_LIMIT || end - start < 0 || end - start >= US_LIMIT);
        PyObject *cat = PyDict_GetItemWithError(cats, PyTuple_GET_ITEM(r, R_CAT));
        if (!cat && !PyErr_Occurred()) PyErr_SetObject(PyExc_KeyError, PyTuple_GET_ITEM(r, R_CAT));
        FAIL(!cat || get_id(tids, PyTuple_GET_ITEM(r, R_STREAM), &tid));
        FAIL((i && PUT(&b, ",")) || PUT(&b, "{\"ph\":\"X\",\"name\":") || put_json(&b, PyTuple_GET_ITEM(r, R_NAME))
             || PUT(&b, ",\"cat\":") || put_str(&b, cat) || PUT(&b, ",\"pid\":") || put_int(&b, rank)
             || PUT(&b, ",\"tid\":") || put_int(&b, tid) || PUT(&b, ",\"ts\":") || put_us(&b, start)
             || PUT(&b, ",\"dur\":") || put_us(&b, end - start)
             || (texts != Py_None && (PUT(&b, ",\"args\":") || put_str(&b, PyList_GET_ITEM(texts, i))))
             || PUT(&b, "}"));
    }
    return done(&b, 0);
fail:
    if (!gave_up && !PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "chrome_events: not a Record");
    return done(&b, gave_up);
}

/* A str as csv.writer's default dialect writes a field (QUOTE_MINIMAL): in double quotes, its
 * quotes doubled, where it holds a comma, a double quote, CR or LF; else as it is (UTF-8) */
static int put_csv(Buf *b, PyObject *s) {
    Py_ssize_t n;
    const char *c = utf8(s, &n);
    if (!c) return -1;
    if (!memchr(c, ',', (size_t)n) && !memchr(c, '"', (size_t)n) && !memchr(c, '\r', (size_t)n)
        && !memchr(c, '\n', (size_t)n))
        return put(b, c, n);
    if (grow(b, 2 * n + 2)) return -1;
    char *o = b->p + b->n;
    *o++ = '"';
    for (Py_ssize_t i = 0; i < n; i++) {
        if (c[i] == '"') *o++ = '"';
        *o++ = c[i];
    }
    *o++ = '"';
    b->n = o - b->p;
    return 0;
}

/* timeline_rows(records, pp, round) -> bytes or None: timeline.csv's rows of `records` (in their
 * order), each ended by "\r\n": rank, `pp`[rank] (its pipeline rank's text; "" where absent),
 * stream, name and category (`put_csv`), start, end, duration, and on a mark (stream "mark")
 * `round`(value). */
static PyObject *timeline_rows(PyObject *self, PyObject *args) {
    PyObject *recs, *pp, *round_fn;
    if (!PyArg_ParseTuple(args, "O!O!O", &PyList_Type, &recs, &PyDict_Type, &pp, &round_fn)) return NULL;
    Py_ssize_t n = PyList_GET_SIZE(recs);
    Buf b = BUF_INIT;
    int gave_up = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *r = PyList_GET_ITEM(recs, i);
        long long rank, start, end;
        FAIL(!PyTuple_Check(r) || PyTuple_GET_SIZE(r) < 7);
        GIVE_UP(get_ll(PyTuple_GET_ITEM(r, R_RANK), &rank) || get_ll(PyTuple_GET_ITEM(r, R_START), &start)
                || get_ll(PyTuple_GET_ITEM(r, R_END), &end));
        FAIL(put_int(&b, rank) || PUT(&b, ","));
        PyObject *p = PyDict_GetItemWithError(pp, PyTuple_GET_ITEM(r, R_RANK));
        FAIL(!p && PyErr_Occurred());
        if (p) FAIL(put_str(&b, p));
        FAIL(PUT(&b, ","));
        for (int f = R_STREAM; f <= R_CAT; f++) FAIL(put_csv(&b, PyTuple_GET_ITEM(r, f)) || PUT(&b, ","));
        FAIL(put_int(&b, start) || PUT(&b, ",") || put_int(&b, end) || PUT(&b, ",") || put_int(&b, end - start)
             || PUT(&b, ","));
        PyObject *stream = PyTuple_GET_ITEM(r, R_STREAM);
        if (PyUnicode_Check(stream) && PyUnicode_CompareWithASCIIString(stream, "mark") == 0) {
            PyObject *v = PyObject_CallOneArg(round_fn, PyTuple_GET_ITEM(r, R_VALUE));
            FAIL(!v);
            PyObject *s = PyObject_Str(v);
            Py_DECREF(v);
            FAIL(!s);
            int bad = put_str(&b, s);
            Py_DECREF(s);
            FAIL(bad);
        }
        FAIL(PUT(&b, "\r\n"));
    }
    return done(&b, 0);
fail:
    if (!gave_up && !PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "timeline_rows: not a Record");
    return done(&b, gave_up);
}

/* The concatenation of three str (an args text around its microbatch number) */
static PyObject *concat3(PyObject *a, PyObject *b, PyObject *c) {
    if (PyUnicode_IS_COMPACT_ASCII(a) && PyUnicode_IS_COMPACT_ASCII(b) && PyUnicode_IS_COMPACT_ASCII(c)) {
        Py_ssize_t na = PyUnicode_GET_LENGTH(a), nb = PyUnicode_GET_LENGTH(b), nc = PyUnicode_GET_LENGTH(c);
        PyObject *out = PyUnicode_New(na + nb + nc, 127);
        if (!out) return NULL;
        Py_UCS1 *o = PyUnicode_1BYTE_DATA(out);
        memcpy(o, PyUnicode_1BYTE_DATA(a), (size_t)na);
        memcpy(o + na, PyUnicode_1BYTE_DATA(b), (size_t)nb);
        memcpy(o + na + nb, PyUnicode_1BYTE_DATA(c), (size_t)nc);
        return out;
    }
    PyObject *ab = PyUnicode_Concat(a, b);
    if (!ab) return NULL;
    PyObject *out = PyUnicode_Concat(ab, c);
    Py_DECREF(ab);
    return out;
}

/* sim.engine.slice_args.name_key_py: (the name with the number after its first " mb" replaced by
 * NUL, the number's text) where that number is one or more decimal characters up to the next
 * space or the end (str.isdecimal); else (the name with U+0001 replaced by NUL, ""). New
 * references in *key and *mb; -1 on error. */
static int split_name(PyObject *name, PyObject **key, PyObject **mb) {
    if (!PyUnicode_Check(name)) {
        PyErr_SetString(PyExc_TypeError, "name_key: the name is not a str");
        return -1;
    }
    Py_ssize_t n = PyUnicode_GET_LENGTH(name), i, j;
    int kind = PyUnicode_KIND(name);
    const void *data = PyUnicode_DATA(name);
    for (i = 0; i + 3 <= n; i++)                      /* the first " mb" (str.partition) */
        if (PyUnicode_READ(kind, data, i) == ' ' && PyUnicode_READ(kind, data, i + 1) == 'm'
            && PyUnicode_READ(kind, data, i + 2) == 'b')
            break;
    if (i + 3 <= n) {
        for (j = i + 3; j < n && PyUnicode_READ(kind, data, j) != ' '; j++)
            if (!Py_UNICODE_ISDECIMAL(PyUnicode_READ(kind, data, j))) break;
        if (j > i + 3 && (j == n || PyUnicode_READ(kind, data, j) == ' ')) {
            *mb = PyUnicode_Substring(name, i + 3, j);
            if (!*mb) return -1;
            if (PyUnicode_IS_COMPACT_ASCII(name)) {     /* name[:i+3] + NUL + name[j:] */
                *key = PyUnicode_New(n - (j - i - 3) + 1, 127);
                if (*key) {
                    Py_UCS1 *o = PyUnicode_1BYTE_DATA(*key);
                    memcpy(o, data, (size_t)(i + 3));
                    o[i + 3] = 0;
                    memcpy(o + i + 4, (const Py_UCS1 *)data + j, (size_t)(n - j));
                }
            } else {
                PyObject *head = PyUnicode_Substring(name, 0, i + 3), *rest = PyUnicode_Substring(name, j, n);
                PyObject *nul = PyUnicode_FromOrdinal(0);
                *key = head && rest && nul ? concat3(head, nul, rest) : NULL;
                Py_XDECREF(head);
                Py_XDECREF(rest);
                Py_XDECREF(nul);
            }
            if (!*key) {
                Py_CLEAR(*mb);
                return -1;
            }
            return 0;
        }
    }
    if (PyUnicode_FindChar(name, 1, 0, n, 1) == -1) {
        *key = Py_NewRef(name);
    } else {
        PyObject *one = PyUnicode_FromOrdinal(1), *nul = PyUnicode_FromOrdinal(0);
        *key = one && nul ? PyObject_CallMethod(name, "replace", "OO", one, nul) : NULL;
        Py_XDECREF(one);
        Py_XDECREF(nul);
        if (!*key) return -1;
    }
    *mb = PyUnicode_New(0, 0);
    if (!*mb) {
        Py_CLEAR(*key);
        return -1;
    }
    return 0;
}

static PyObject *name_key(PyObject *self, PyObject *name) {
    PyObject *key, *mb;
    if (split_name(name, &key, &mb)) return NULL;
    PyObject *out = PyTuple_Pack(2, key, mb);
    Py_DECREF(key);
    Py_DECREF(mb);
    return out;
}

/* A SliceArgs table entry, (args, text before, text after, calls); else 0 with a TypeError */
static int entry_ok(PyObject *e) {
    if (PyTuple_Check(e) && PyTuple_GET_SIZE(e) >= 4 && PyTuple_Check(PyTuple_GET_ITEM(e, 3))) return 1;
    PyErr_SetString(PyExc_TypeError, "slice_texts: a table entry is not (args, before, after, calls)");
    return 0;
}

/* slice_texts(records, table_of, text_of) -> [str]: sim.engine.slice_args.SliceArgs.texts's loop
 * (`table_of` its table method, `text_of` its text method, called where a name stands for
 * several calls or is not in the table). */
static PyObject *slice_texts(PyObject *self, PyObject *args) {
    PyObject *recs, *table_of, *text_of, *rank = NULL, *table = NULL;
    if (!PyArg_ParseTuple(args, "O!OO", &PyList_Type, &recs, &table_of, &text_of)) return NULL;
    Py_ssize_t n = PyList_GET_SIZE(recs);
    PyObject *out = PyList_New(n);
    if (!out) return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *r = PyList_GET_ITEM(recs, i), *text = NULL, *e;
        if (!PyTuple_Check(r) || PyTuple_GET_SIZE(r) < 6) {
            PyErr_SetString(PyExc_TypeError, "slice_texts: not a Record");
            goto fail;
        }
        PyObject *rk = PyTuple_GET_ITEM(r, R_RANK), *name = PyTuple_GET_ITEM(r, R_NAME);
        int other = rank == NULL ? 1 : PyObject_RichCompareBool(rk, rank, Py_NE);
        if (other < 0) goto fail;
        if (other) {
            Py_XSETREF(table, PyObject_CallOneArg(table_of, rk));
            if (!table) goto fail;
            if (!PyDict_Check(table)) {
                PyErr_SetString(PyExc_TypeError, "slice_texts: a table is not a dict");
                goto fail;
            }
            Py_XSETREF(rank, Py_NewRef(rk));
        }
        e = PyDict_GetItemWithError(table, name);      /* a name without a microbatch is its own key */
        if (!e && PyErr_Occurred()) goto fail;
        if (!e) {
            PyObject *key, *mb;
            if (split_name(name, &key, &mb)) goto fail;
            if (PyUnicode_GET_LENGTH(mb)) {
                e = PyDict_GetItemWithError(table, key);
                if (!e && PyErr_Occurred()) {
                    Py_DECREF(key);
                    Py_DECREF(mb);
                    goto fail;
                }
            }
            Py_DECREF(key);
            if (e && !entry_ok(e)) {
                Py_DECREF(mb);
                goto fail;
            }
            if (!e || PyTuple_GET_SIZE(PyTuple_GET_ITEM(e, 3)) > 1)
                text = PyObject_CallOneArg(text_of, r);
            else
                text = concat3(PyTuple_GET_ITEM(e, 1), mb, PyTuple_GET_ITEM(e, 2));
            Py_DECREF(mb);
        } else {
            if (!entry_ok(e)) goto fail;
            text = PyTuple_GET_SIZE(PyTuple_GET_ITEM(e, 3)) > 1 ? PyObject_CallOneArg(text_of, r)
                                                                : Py_NewRef(PyTuple_GET_ITEM(e, 1));
        }
        if (!text) goto fail;
        PyList_SET_ITEM(out, i, text);
    }
    Py_XDECREF(rank);
    Py_XDECREF(table);
    return out;
fail:
    Py_XDECREF(rank);
    Py_XDECREF(table);
    Py_DECREF(out);
    return NULL;
}

/* kernel_kinds(records, by_name, of) -> [(kernel name, cpu_op name)]: sim.engine.kineto._Kinds'
 * `of` of each record, looked up by (the name without its microbatch number, stream, cat) in its
 * cache `by_name`, and asked of `of` (which fills it) where it is not there yet. */
static PyObject *kernel_kinds(PyObject *self, PyObject *args) {
    PyObject *recs, *by_name, *of;
    if (!PyArg_ParseTuple(args, "O!O!O", &PyList_Type, &recs, &PyDict_Type, &by_name, &of)) return NULL;
    Py_ssize_t n = PyList_GET_SIZE(recs);
    PyObject *out = PyList_New(n);
    if (!out) return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *r = PyList_GET_ITEM(recs, i), *key, *mb, *k3, *hit;
        if (!PyTuple_Check(r) || PyTuple_GET_SIZE(r) < 6) {
            PyErr_SetString(PyExc_TypeError, "kernel_kinds: not a Record");
            goto fail;
        }
        if (split_name(PyTuple_GET_ITEM(r, R_NAME), &key, &mb)) goto fail;
        Py_DECREF(mb);
        k3 = PyTuple_Pack(3, key, PyTuple_GET_ITEM(r, R_STREAM), PyTuple_GET_ITEM(r, R_CAT));
        Py_DECREF(key);
        if (!k3) goto fail;
        hit = PyDict_GetItemWithError(by_name, k3);
        Py_DECREF(k3);
        if (hit) Py_INCREF(hit);
        else if (!PyErr_Occurred()) hit = PyObject_CallOneArg(of, r);
        if (!hit) goto fail;
        PyList_SET_ITEM(out, i, hit);
    }
    return out;
fail:
    Py_DECREF(out);
    return NULL;
}

/* The pipeline chart's action kinds as bits (sim.engine.outputs._parse_name's compat values) */
enum { K_F = 1, K_B = 2, K_I = 4, K_W = 8, K_OPT = 16 };

static int kind_bit(PyObject *s) {
    if (!PyUnicode_Check(s)) return 0;
    if (PyUnicode_GET_LENGTH(s) == 1) {
        switch (PyUnicode_READ_CHAR(s, 0)) {
        case 'F': return K_F;
        case 'B': return K_B;
        case 'I': return K_I;
        case 'W': return K_W;
        }
        return 0;
    }
    return PyUnicode_CompareWithASCIIString(s, "optimizer") == 0 ? K_OPT : 0;
}

static PyObject *kind_name(int bit) {
    switch (bit) {
    case K_F: return PyUnicode_FromString("F");
    case K_B: return PyUnicode_FromString("B");
    case K_I: return PyUnicode_FromString("I");
    case K_W: return PyUnicode_FromString("W");
    }
    return PyUnicode_FromString("optimizer");
}

/* A mark's name as outputs._MARK_RE reads it, ^\d+([FBI])(\d+)$ ($: or before a final "\n"):
 * the kind's bit and the microbatch's text (new reference), or 0 */
static int mark_parts(PyObject *name, PyObject **mb) {
    Py_ssize_t n = PyUnicode_GET_LENGTH(name), i = 0, j;
    int kind = PyUnicode_KIND(name), bit;
    const void *data = PyUnicode_DATA(name);
    if (n && PyUnicode_READ(kind, data, n - 1) == '\n') n--;
    while (i < n && Py_UNICODE_ISDECIMAL(PyUnicode_READ(kind, data, i))) i++;
    if (i == 0 || i >= n) return 0;
    switch (PyUnicode_READ(kind, data, i)) {
    case 'F': bit = K_F; break;
    case 'B': bit = K_B; break;
    case 'I': bit = K_I; break;
    default: return 0;
    }
    for (j = i + 1; j < n && Py_UNICODE_ISDECIMAL(PyUnicode_READ(kind, data, j)); j++) {}
    if (j == i + 1 || j != n) return 0;
    *mb = PyUnicode_Substring(name, i + 1, n);
    return *mb ? bit : -1;
}

typedef struct {
    int kind, compat, closed;                  /* kind: a bit, 0 while undecided ("?") */
    PyObject *mb, *kernels, *recompute;        /* owned */
    long long start, end;
} Run;

/* chart_runs(records, parsed, parse_name) -> [(kind, mb, start, end, kernels, recompute,
 * closed)] or None: sim.engine.outputs.chart_boxes' loop over a rank's marks and compute
 * kernels, in their order (`parsed`: _PARSED, `parse_name`: _parse_name, as _parse_kernel uses
 * them); None where a kernel's kinds are not ones it knows (the Python loop runs). */
static PyObject *chart_runs(PyObject *self, PyObject *args) {
    PyObject *recs, *parsed, *parse_name, *out = NULL;
    if (!PyArg_ParseTuple(args, "O!O!O", &PyList_Type, &recs, &PyDict_Type, &parsed, &parse_name)) return NULL;
    Py_ssize_t n = PyList_GET_SIZE(recs), nruns = 0, cap = 0;
    Run *runs = NULL;
    int gave_up = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *r = PyList_GET_ITEM(recs, i);
        if (!PyTuple_Check(r) || PyTuple_GET_SIZE(r) < 6) {
            PyErr_SetString(PyExc_TypeError, "chart_runs: not a Record");
            goto done;
        }
        PyObject *name = PyTuple_GET_ITEM(r, R_NAME), *stream = PyTuple_GET_ITEM(r, R_STREAM);
        long long start, end;
        if (!PyUnicode_Check(name) || !PyUnicode_Check(stream)) {
            PyErr_SetString(PyExc_TypeError, "chart_runs: not a Record");
            goto done;
        }
        if (get_ll(PyTuple_GET_ITEM(r, R_START), &start) || get_ll(PyTuple_GET_ITEM(r, R_END), &end)) {
            gave_up = 1;
            goto done;
        }
        if (PyUnicode_CompareWithASCIIString(stream, "mark") == 0) {
            PyObject *mb = NULL;
            int bit = mark_parts(name, &mb);
            if (bit < 0) goto done;
            for (Py_ssize_t k = nruns - 1; bit && k >= 0 && k >= nruns - 4; k--) {
                Run *run = &runs[k];
                int same = run->closed ? 0 : PyUnicode_Compare(run->mb, mb) == 0;
                if (same && (run->kind == bit || (run->kind == 0 && (run->compat & bit)))) {
                    run->closed = 1;
                    break;
                }
            }
            Py_XDECREF(mb);
            if (PyErr_Occurred()) goto done;
            continue;
        }
        /* _parse_kernel: (compat, fixes) remembered by (the name without its microbatch, cat) */
        PyObject *key, *mb, *hit = NULL, *full = NULL;
        if (split_name(name, &key, &mb)) goto done;
        int starts_mb = PyUnicode_GET_LENGTH(name) >= 2 && PyUnicode_READ_CHAR(name, 0) == 'm'
                        && PyUnicode_READ_CHAR(name, 1) == 'b';
        if (!PyUnicode_GET_LENGTH(mb) || starts_mb) {
            Py_DECREF(mb);
            full = PyObject_CallFunctionObjArgs(parse_name, name, PyTuple_GET_ITEM(r, R_CAT), NULL);
            if (!full || !PyTuple_Check(full) || PyTuple_GET_SIZE(full) != 4) {
                Py_DECREF(key);
                Py_XDECREF(full);
                if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "chart_runs: _parse_name's answer");
                goto done;
            }
            mb = Py_NewRef(PyTuple_GET_ITEM(full, 3));
            hit = full;
        } else {
            PyObject *k2 = PyTuple_Pack(2, key, PyTuple_GET_ITEM(r, R_CAT));
            if (!k2) {
                Py_DECREF(key);
                Py_DECREF(mb);
                goto done;
            }
            hit = PyDict_GetItemWithError(parsed, k2);
            if (!hit && !PyErr_Occurred()) {
                full = PyObject_CallFunctionObjArgs(parse_name, name, PyTuple_GET_ITEM(r, R_CAT), NULL);
                PyObject *three = full && PyTuple_Check(full) && PyTuple_GET_SIZE(full) == 4
                                  ? PyTuple_GetSlice(full, 0, 3) : NULL;
                if (three && PyDict_SetItem(parsed, k2, three) == 0) hit = full;
                Py_XDECREF(three);
                if (!hit && !PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "chart_runs: _parse_name's answer");
            }
            Py_DECREF(k2);
            if (!hit) {
                Py_DECREF(key);
                Py_DECREF(mb);
                Py_XDECREF(full);
                goto done;
            }
        }
        Py_DECREF(key);
        PyObject *compat = PyTuple_GET_ITEM(hit, 0);
        int fixes = PyObject_IsTrue(PyTuple_GET_ITEM(hit, 1)), mask = 0, first = 0;
        if (fixes >= 0 && PyTuple_Check(compat) && PyTuple_GET_SIZE(compat) > 0) {
            for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(compat); k++) {
                int bit = kind_bit(PyTuple_GET_ITEM(compat, k));
                if (!bit) mask = -1;
                if (mask >= 0) mask |= bit;
            }
            first = kind_bit(PyTuple_GET_ITEM(compat, 0));
        } else {
            mask = -1;
        }
        int len1 = PyTuple_Check(compat) && PyTuple_GET_SIZE(compat) == 1;
        Py_XDECREF(full);
        if (mask <= 0) {
            Py_DECREF(mb);
            if (!PyErr_Occurred()) gave_up = 1;
            goto done;
        }
        Run *last = nruns ? &runs[nruns - 1] : NULL;
        int same = 0;
        if (last && !last->closed) {
            same = PyUnicode_Compare(last->mb, mb);
            if (same == -1 && PyErr_Occurred()) {
                Py_DECREF(mb);
                goto done;
            }
            same = same == 0 && ((last->kind & mask) || (last->kind == 0 && (last->compat & mask)));
        }
        if (same) {
            Py_DECREF(mb);
            if (last->kind == 0) {
                last->compat &= mask;
                if (fixes) last->kind = first;
            }
            if (end > last->end) last->end = end;
        } else {
            if (nruns == cap) {
                Py_ssize_t c = cap ? 2 * cap : 256;
                Run *p = PyMem_Realloc(runs, (size_t)c * sizeof(Run));
                if (!p) {
                    Py_DECREF(mb);
                    PyErr_NoMemory();
                    goto done;
                }
                runs = p;
                cap = c;
            }
            last = &runs[nruns];
            last->kind = fixes || len1 ? first : 0;
            last->compat = mask;
            last->closed = 0;
            last->mb = mb;
            last->start = start;
            last->end = end;
            last->kernels = PyList_New(0);
            last->recompute = PyList_New(0);
            nruns++;
            if (!last->kernels || !last->recompute) goto done;
        }
        int rec = PyUnicode_GET_LENGTH(name) >= 2 && PyUnicode_READ_CHAR(name, 0) == 'R'
                  && PyUnicode_READ_CHAR(name, 1) == ' ';
        PyObject *iv = PyTuple_Pack(2, PyTuple_GET_ITEM(r, R_START), PyTuple_GET_ITEM(r, R_END));
        int bad = !iv || PyList_Append(rec ? last->recompute : last->kernels, iv) < 0;
        Py_XDECREF(iv);
        if (bad) goto done;
    }
    out = PyList_New(nruns);
    for (Py_ssize_t k = 0; out && k < nruns; k++) {
        Run *run = &runs[k];
        int kind = run->kind;
        if (kind == 0)                         /* "B" if it may be one, else the first by name */
            kind = run->compat & K_B ? K_B : run->compat & K_F ? K_F : run->compat & K_I ? K_I
                   : run->compat & K_W ? K_W : K_OPT;
        PyObject *t = Py_BuildValue("(NOLLOON)", kind_name(kind), run->mb, run->start, run->end, run->kernels,
                                    run->recompute, PyBool_FromLong(run->closed));
        if (!t) {
            Py_CLEAR(out);
            break;
        }
        PyList_SET_ITEM(out, k, t);
    }
done:
    for (Py_ssize_t k = 0; k < nruns; k++) {
        Py_XDECREF(runs[k].mb);
        Py_XDECREF(runs[k].kernels);
        Py_XDECREF(runs[k].recompute);
    }
    PyMem_Free(runs);
    if (!out && gave_up && !PyErr_Occurred()) Py_RETURN_NONE;
    return out;
}

/* ---- the Kineto writer's records in order, host items and events (sim.engine.kineto) ---- */

/* Records sorted as sorted(records, key=attrgetter(fields...)) sorts them: by the listed
 * Record fields in turn (the ints rank, start_ns, end_ns as integers, the strs stream, name, cat
 * by code point), ties kept in their order. The int fields are read once into the array. */
#define SORT_MAX_FIELDS 5
typedef struct {
    long long k[SORT_MAX_FIELDS];              /* the int fields, in the key's order */
    Py_ssize_t at;                             /* the position before sorting: a stable sort */
    PyObject *rec;
} Keyed;

static int order_error;                        /* PyUnicode_Compare failed inside qsort */
static int key_n, key_field[SORT_MAX_FIELDS], key_int[SORT_MAX_FIELDS];   /* the key being sorted by */

static int str_cmp(PyObject *a, PyObject *b) {
    if (a == b) return 0;
    int c = PyUnicode_Compare(a, b);
    if (c == -1 && PyErr_Occurred()) order_error = 1;
    return c;
}

static int cmp_keyed(const void *a, const void *b) {
    const Keyed *x = a, *y = b;
    for (int f = 0; f < key_n; f++) {
        if (key_int[f]) {
            if (x->k[f] != y->k[f]) return x->k[f] < y->k[f] ? -1 : 1;
        } else {
            int c = str_cmp(PyTuple_GET_ITEM(x->rec, key_field[f]), PyTuple_GET_ITEM(y->rec, key_field[f]));
            if (c) return c;
        }
    }
    return x->at < y->at ? -1 : x->at > y->at;
}

/* Set the key from a tuple of Record field indices; -1 with an error if it is not one */
static int set_key(PyObject *fields) {
    if (!PyTuple_Check(fields) || PyTuple_GET_SIZE(fields) < 1 || PyTuple_GET_SIZE(fields) > SORT_MAX_FIELDS) {
        PyErr_SetString(PyExc_ValueError, "_textout: a sort key is a tuple of 1 to 5 Record field indices");
        return -1;
    }
    key_n = (int)PyTuple_GET_SIZE(fields);
    for (int f = 0; f < key_n; f++) {
        long v = PyLong_AsLong(PyTuple_GET_ITEM(fields, f));
        if (v < R_RANK || v > R_END) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "_textout: not a Record field index");
            return -1;
        }
        key_field[f] = (int)v;
        key_int[f] = v == R_RANK || v == R_START || v == R_END;
    }
    return 0;
}

/* One record's entry (its int fields read); 1 to give up (a field not of its type, an int past
 * 64 bits), -1 with an error (not a Record) */
static int keyed(Keyed *e, PyObject *r, Py_ssize_t at) {
    if (!PyTuple_Check(r) || PyTuple_GET_SIZE(r) < 6) {
        PyErr_SetString(PyExc_TypeError, "_textout: not a Record");
        return -1;
    }
    for (int f = 0; f < key_n; f++) {
        PyObject *o = PyTuple_GET_ITEM(r, key_field[f]);
        if (key_int[f] ? get_ll(o, &e->k[f]) : !PyUnicode_Check(o)) return 1;
    }
    e->at = at;
    e->rec = r;
    return 0;
}

/* Stable natural merge sort of v[0..m) by the key, `tmp` m entries of scratch: the runs already
 * in order merged pairwise until one is left, so that input in a few runs (one rank's records,
 * in the order the engine made them: about one run a rank) is sorted in a few passes */
static void merge_runs(Keyed *v, Keyed *tmp, Py_ssize_t m) {
    Py_ssize_t *ends = PyMem_Malloc(sizeof(Py_ssize_t) * (size_t)(m + 1)), runs = 0;
    if (!ends) {                               /* (no memory for the run table: qsort, stable by `at`) */
        qsort(v, (size_t)m, sizeof(Keyed), cmp_keyed);
        return;
    }
    for (Py_ssize_t i = 1; i <= m; i++)
        if (i == m || cmp_keyed(&v[i - 1], &v[i]) > 0) ends[runs++] = i;
    Keyed *src = v, *dst = tmp;
    while (runs > 1 && !order_error) {
        Py_ssize_t out = 0, lo = 0;
        for (Py_ssize_t r = 0; r < runs; r += 2) {
            Py_ssize_t mid = ends[r], hi = r + 1 < runs ? ends[r + 1] : mid, a = lo, b = mid, k = lo;
            while (a < mid && b < hi) dst[k++] = cmp_keyed(&src[b], &src[a]) < 0 ? src[b++] : src[a++];
            while (a < mid) dst[k++] = src[a++];
            while (b < hi) dst[k++] = src[b++];
            ends[out++] = hi;
            lo = hi;
        }
        runs = out;
        Keyed *t = src; src = dst; dst = t;
    }
    if (src != v) memcpy(v, src, sizeof(Keyed) * (size_t)m);
    PyMem_Free(ends);
}

/* Sort v[0..m) by the key unless it is in order already: where the first field is an int of a
 * range not far above m (a rank), first stably by it (counting sort; the engine's records of
 * many ranks come interleaved, each rank's nearly in order), then `merge_runs`. The 1T row's
 * million records: 0.51 s with qsort, 0.24 s so (most of it reading their fields). -1 with an
 * error */
static int sort_keyed(Keyed *v, Py_ssize_t m) {
    order_error = 0;
    Py_ssize_t i = 1;
    while (i < m && cmp_keyed(&v[i - 1], &v[i]) <= 0) i++;
    if (order_error) return -1;
    if (i >= m) return 0;
    Keyed *tmp = PyMem_Malloc(sizeof(Keyed) * (size_t)m);
    if (!tmp) {
        PyErr_NoMemory();
        return -1;
    }
    if (key_int[0]) {
        long long lo = v[0].k[0], hi = v[0].k[0];
        for (i = 1; i < m; i++) {
            if (v[i].k[0] < lo) lo = v[i].k[0];
            if (v[i].k[0] > hi) hi = v[i].k[0];
        }
        /* the range as unsigned: hi - lo of two 64-bit ints may not fit a signed one */
        unsigned long long span = (unsigned long long)hi - (unsigned long long)lo;
        Py_ssize_t *at = span / 4 <= (unsigned long long)m ? PyMem_Calloc((size_t)span + 2, sizeof(Py_ssize_t)) : NULL;
        if (at) {
            for (i = 0; i < m; i++) at[(unsigned long long)v[i].k[0] - (unsigned long long)lo + 1]++;
            for (size_t b = 1; b <= (size_t)span + 1; b++) at[b] += at[b - 1];
            for (i = 0; i < m; i++) tmp[at[(unsigned long long)v[i].k[0] - (unsigned long long)lo]++] = v[i];
            memcpy(v, tmp, sizeof(Keyed) * (size_t)m);
            PyMem_Free(at);
        }
    }
    merge_runs(v, tmp, m);
    PyMem_Free(tmp);
    return order_error ? -1 : 0;
}

/* The records of v[0..m) as a new list */
static PyObject *keyed_list(Keyed *v, Py_ssize_t m) {
    PyObject *out = PyList_New(m);
    if (out)
        for (Py_ssize_t i = 0; i < m; i++) PyList_SET_ITEM(out, i, Py_NewRef(v[i].rec));
    return out;
}

/* sort_records(records, fields) -> list or None: sorted(records, key=attrgetter(the fields))
 * for `fields` a tuple of Record field indices; None where a field is not of its type (an int
 * past 64 bits: the Python sorts) */
static PyObject *sort_records(PyObject *self, PyObject *args) {
    PyObject *recs, *fields, *out = NULL;
    if (!PyArg_ParseTuple(args, "O!O", &PyList_Type, &recs, &fields) || set_key(fields)) return NULL;
    Py_ssize_t n = PyList_GET_SIZE(recs);
    Keyed *v = PyMem_Malloc(sizeof(Keyed) * (size_t)(n + 1));
    if (!v) return PyErr_NoMemory();
    for (Py_ssize_t i = 0; i < n; i++) {
        int got = keyed(&v[i], PyList_GET_ITEM(recs, i), i);
        if (got) {
            PyMem_Free(v);
            if (got < 0) return NULL;
            Py_RETURN_NONE;
        }
    }
    if (!sort_keyed(v, n)) out = keyed_list(v, n);
    PyMem_Free(v);
    return out;
}

/* rank_order(records) -> list or None: kineto.rank_trace_parts' `mine`, the records that are
 * not marks and last more than 0, sorted stably by (start_ns, end_ns, stream, name); None where a
 * time is not a 64-bit int (the Python sorts). Records already in that order (the usual case)
 * are only checked. */
static PyObject *rank_order(PyObject *self, PyObject *recs) {
    if (!PyList_Check(recs)) {
        PyErr_SetString(PyExc_TypeError, "rank_order: expected a list");
        return NULL;
    }
    static const int fields[4] = {R_START, R_END, R_STREAM, R_NAME};
    key_n = 4;
    for (int f = 0; f < 4; f++) {
        key_field[f] = fields[f];
        key_int[f] = f < 2;
    }
    Py_ssize_t n = PyList_GET_SIZE(recs), m = 0;
    Keyed *v = PyMem_Malloc(sizeof(Keyed) * (size_t)(n + 1));
    PyObject *out = NULL;
    if (!v) return PyErr_NoMemory();
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *r = PyList_GET_ITEM(recs, i);
        int got = keyed(&v[m], r, m);
        if (got) {
            PyMem_Free(v);
            if (got < 0) return NULL;
            Py_RETURN_NONE;
        }
        if (v[m].k[1] <= v[m].k[0] || PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(r, R_STREAM), "mark") == 0)
            continue;
        m++;
    }
    if (!sort_keyed(v, m)) out = keyed_list(v, m);
    PyMem_Free(v);
    return out;
}

/* ---- the pipeline chart's lanes, the Chrome trace's slices and its arrows' ends (sim.engine.outputs) ---- */

/* Whether the str `s` equals the ASCII text `lit` */
static int str_is(PyObject *s, const char *lit) { return PyUnicode_CompareWithASCIIString(s, lit) == 0; }

/* Whether the str `s` starts with the ASCII text `lit` of `n` characters */
static int str_starts(PyObject *s, const char *lit, Py_ssize_t n) {
    if (PyUnicode_GET_LENGTH(s) < n) return 0;
    int kind = PyUnicode_KIND(s);
    const void *d = PyUnicode_DATA(s);
    for (Py_ssize_t i = 0; i < n; i++)
        if (PyUnicode_READ(kind, d, i) != (Py_UCS4)(unsigned char)lit[i]) return 0;
    return 1;
}

/* A Record's stream and category if both are str; 1 to give up, -1 with an error (not a Record) */
static int stream_cat(PyObject *r, PyObject **stream, PyObject **cat) {
    if (!PyTuple_Check(r) || PyTuple_GET_SIZE(r) < 6) {
        PyErr_SetString(PyExc_TypeError, "_textout: not a Record");
        return -1;
    }
    *stream = PyTuple_GET_ITEM(r, R_STREAM);
    *cat = PyTuple_GET_ITEM(r, R_CAT);
    return !PyUnicode_Check(*stream) || !PyUnicode_Check(*cat);
}

/* chart_lane(records) -> (marks and compute kernels, [(start_ns, end_ns)] of the communication
 * on the compute stream) or None: sim.engine.outputs._lane_py's pass over one rank's records,
 * the first in the chart's order (outputs.in_chart_order: by start_ns, marks first, end_ns,
 * ties in their order); None where a time is not a 64-bit int or a stream or category not a
 * str (the Python loop runs). */
static PyObject *chart_lane(PyObject *self, PyObject *recs) {
    if (!PyList_Check(recs)) {
        PyErr_SetString(PyExc_TypeError, "chart_lane: expected a list");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(recs), m = 0;
    Keyed *v = PyMem_Malloc(sizeof(Keyed) * (size_t)(n + 1));
    PyObject *comm = PyList_New(0), *mine = NULL, *out = NULL;
    int gave_up = 0;
    if (!v || !comm) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *r = PyList_GET_ITEM(recs, i), *stream, *cat;
        int got = stream_cat(r, &stream, &cat), mark = 0;
        if (got) {
            gave_up = got > 0;
            goto done;
        }
        if (str_is(stream, "compute")) {
            if (str_starts(cat, "comm:", 5)) {
                PyObject *t = PyTuple_Pack(2, PyTuple_GET_ITEM(r, R_START), PyTuple_GET_ITEM(r, R_END));
                int bad = !t || PyList_Append(comm, t) < 0;
                Py_XDECREF(t);
                if (bad) goto done;
                continue;
            }
        } else if (str_is(stream, "mark")) {
            mark = 1;
        } else {
            continue;
        }
        if (get_ll(PyTuple_GET_ITEM(r, R_START), &v[m].k[0]) || get_ll(PyTuple_GET_ITEM(r, R_END), &v[m].k[2])) {
            gave_up = 1;
            goto done;
        }
        v[m].k[1] = !mark;
        v[m].at = m;
        v[m].rec = r;
        m++;
    }
    key_n = 3;
    for (int f = 0; f < 3; f++) key_int[f] = 1;
    if (sort_keyed(v, m) || !(mine = keyed_list(v, m))) goto done;
    out = PyTuple_Pack(2, mine, comm);
done:
    PyMem_Free(v);
    Py_XDECREF(mine);
    Py_XDECREF(comm);
    if (!out && gave_up && !PyErr_Occurred()) Py_RETURN_NONE;
    return out;
}

/* trace_shown(records) -> (the records the Chrome trace shows, sorted by (rank, start_ns,
 * stream), {rank: the set of their streams}, the set of their categories, their latest end_ns
 * or 0) or None: sim.engine.outputs._trace_shown_py's records that are not marks and are on the
 * compute stream or last more than 0, sorted as outputs.sort_records sorts them; None where a
 * time or rank is not a 64-bit int or a stream or category not a str (the Python runs). */
static PyObject *trace_shown(PyObject *self, PyObject *recs) {
    if (!PyList_Check(recs)) {
        PyErr_SetString(PyExc_TypeError, "trace_shown: expected a list");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(recs), m = 0;
    Keyed *v = PyMem_Malloc(sizeof(Keyed) * (size_t)(n + 1));
    PyObject *shown = NULL, *used = PyDict_New(), *cats = PySet_New(NULL), *streams = NULL, *out = NULL;
    long long last = 0;
    int gave_up = 0;
    if (!v || !used || !cats) {
        if (!v) PyErr_NoMemory();
        goto done;
    }
    key_n = 3;
    key_field[0] = R_RANK, key_field[1] = R_START, key_field[2] = R_STREAM;
    key_int[0] = key_int[1] = 1, key_int[2] = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *r = PyList_GET_ITEM(recs, i), *stream, *cat;
        long long start, end;
        int got = stream_cat(r, &stream, &cat);
        if (!got && str_is(stream, "mark")) continue;
        if (!got) got = get_ll(PyTuple_GET_ITEM(r, R_START), &start) || get_ll(PyTuple_GET_ITEM(r, R_END), &end);
        if (!got && end <= start && !str_is(stream, "compute")) continue;
        if (!got) got = keyed(&v[m], r, m);
        if (got) {
            gave_up = got > 0;
            goto done;
        }
        if (!m || end > last) last = end;
        m++;
    }
    if (sort_keyed(v, m)) goto done;
    for (Py_ssize_t i = 0; i < m; i++) {       /* each rank's streams (its records are together) */
        if (!i || v[i].k[0] != v[i - 1].k[0]) {
            Py_XDECREF(streams);
            streams = PySet_New(NULL);
            if (!streams || PyDict_SetItem(used, PyTuple_GET_ITEM(v[i].rec, R_RANK), streams) < 0) goto done;
        }
        if (PySet_Add(streams, PyTuple_GET_ITEM(v[i].rec, R_STREAM)) < 0
            || PySet_Add(cats, PyTuple_GET_ITEM(v[i].rec, R_CAT)) < 0)
            goto done;
    }
    if ((shown = keyed_list(v, m))) out = Py_BuildValue("(OOOL)", shown, used, cats, last);
done:
    PyMem_Free(v);
    Py_XDECREF(shown);
    Py_XDECREF(used);
    Py_XDECREF(cats);
    Py_XDECREF(streams);
    if (!out && gave_up && !PyErr_Occurred()) Py_RETURN_NONE;
    return out;
}

/* Whether the characters [a, a + n) of `name` are the str `word`'s */
static int word_is(PyObject *name, Py_ssize_t a, Py_ssize_t n, PyObject *word) {
    if (PyUnicode_GET_LENGTH(word) != n) return 0;
    int kn = PyUnicode_KIND(name), kw = PyUnicode_KIND(word);
    const void *dn = PyUnicode_DATA(name), *dw = PyUnicode_DATA(word);
    for (Py_ssize_t i = 0; i < n; i++)
        if (PyUnicode_READ(kn, dn, a + i) != PyUnicode_READ(kw, dw, i)) return 0;
    return 1;
}

/* Whether a kernel named `name` consumes what an arrow brings, as outputs._flow_ends_py reads its
 * name (`name.split()`'s words): its first word one of `kinds` ("F", or "B" and "I"), a word that
 * is `word` (mb<n>), and, where `layers` is not None, a second word L<digits> only with a layer
 * in `layers`. 1 or 0; 2 to give up (no word: Python raises; a layer in other digits than
 * ASCII's or of 19 or more), -1 with an error. */
static int consumes(PyObject *name, int act, PyObject *word, PyObject *layers) {
    if (!PyUnicode_Check(name)) return 2;
    Py_ssize_t n = PyUnicode_GET_LENGTH(name), i = 0, words = 0, l1 = 0, n1 = 0;
    int kind = PyUnicode_KIND(name), first = 0, has = 0;
    const void *d = PyUnicode_DATA(name);
    while (i < n) {
        while (i < n && Py_UNICODE_ISSPACE(PyUnicode_READ(kind, d, i))) i++;
        if (i >= n) break;
        Py_ssize_t a = i;
        while (i < n && !Py_UNICODE_ISSPACE(PyUnicode_READ(kind, d, i))) i++;
        if (words == 0 && i - a == 1) {
            Py_UCS4 c = PyUnicode_READ(kind, d, a);
            first = act ? c == 'F' : c == 'B' || c == 'I';
        }
        if (words == 1) l1 = a, n1 = i - a;
        if (!has) has = word_is(name, a, i - a, word);
        words++;
    }
    if (!words) return 2;
    if (!first || !has) return 0;
    if (layers == Py_None || n1 < 2 || PyUnicode_READ(kind, d, l1) != 'L') return 1;
    long long layer = 0;
    for (Py_ssize_t k = l1 + 1; k < l1 + n1; k++) {
        Py_UCS4 c = PyUnicode_READ(kind, d, k);
        if (!Py_UNICODE_ISDIGIT(c)) return 1;          /* not str.isdigit(): no layer to check */
        if (c < '0' || c > '9' || n1 > 19) return 2;
        layer = layer * 10 + (c - '0');
    }
    PyObject *o = PyLong_FromLongLong(layer);
    int in = o ? PySequence_Contains(layers, o) : -1;
    Py_XDECREF(o);
    return in < 0 ? -1 : in;
}

/* flow_ends(shown, items) -> [time] or None: sim.engine.outputs._flow_ends_py's search for each
 * item (rank, t, act, word, layers): among the rank's compute-stream kernels that are not
 * communication in `shown` (sorted by rank, then start_ns), from the first starting at or
 * after t, the first that `consumes`; its start_ns + 1 (+ 0 where it lasts 1 ns or less), or t
 * where none does. None to give up (the Python runs). */
static PyObject *flow_ends(PyObject *self, PyObject *args) {
    PyObject *recs, *items, *out = NULL;
    if (!PyArg_ParseTuple(args, "O!O!", &PyList_Type, &recs, &PyList_Type, &items)) return NULL;
    Py_ssize_t n = PyList_GET_SIZE(recs), m = 0;
    Keyed *v = PyMem_Malloc(sizeof(Keyed) * (size_t)(n + 1));   /* k[0] rank, k[1] start, k[2] end */
    int gave_up = 0;
    if (!v) return PyErr_NoMemory();
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *r = PyList_GET_ITEM(recs, i), *stream, *cat;
        int got = stream_cat(r, &stream, &cat);
        if (!got && (!str_is(stream, "compute") || str_starts(cat, "comm:", 5))) continue;
        if (!got)
            got = get_ll(PyTuple_GET_ITEM(r, R_RANK), &v[m].k[0]) || get_ll(PyTuple_GET_ITEM(r, R_START), &v[m].k[1])
                  || get_ll(PyTuple_GET_ITEM(r, R_END), &v[m].k[2]);
        if (got) {
            gave_up = got > 0;
            goto done;
        }
        v[m++].rec = r;
    }
    Py_ssize_t k = PyList_GET_SIZE(items);
    out = PyList_New(k);
    if (!out) goto done;
    for (Py_ssize_t q = 0; q < k; q++) {
        PyObject *it = PyList_GET_ITEM(items, q), *t_obj, *end = NULL;
        long long rank, t;
        if (!PyTuple_Check(it) || PyTuple_GET_SIZE(it) != 5 || !PyUnicode_Check(PyTuple_GET_ITEM(it, 3))) {
            PyErr_SetString(PyExc_TypeError, "flow_ends: an item is (rank, t, act, word, layers)");
            goto fail;
        }
        t_obj = PyTuple_GET_ITEM(it, 1);
        int act = PyObject_IsTrue(PyTuple_GET_ITEM(it, 2));
        if (act < 0) goto fail;
        if (get_ll(PyTuple_GET_ITEM(it, 0), &rank) || get_ll(t_obj, &t)) goto give_up;
        Py_ssize_t lo = 0, hi = m;               /* the first kernel of (rank, start >= t) */
        while (lo < hi) {
            Py_ssize_t mid = lo + (hi - lo) / 2;
            if (v[mid].k[0] < rank || (v[mid].k[0] == rank && v[mid].k[1] < t)) lo = mid + 1;
            else hi = mid;
        }
        for (Py_ssize_t j = lo; j < m && v[j].k[0] == rank && !end; j++) {
            int c = consumes(PyTuple_GET_ITEM(v[j].rec, R_NAME), act, PyTuple_GET_ITEM(it, 3), PyTuple_GET_ITEM(it, 4));
            if (c < 0) goto fail;
            if (c == 2) goto give_up;
            if (c) end = PyLong_FromLongLong(v[j].k[1] + (v[j].k[2] - v[j].k[1] > 1));
            if (c && !end) goto fail;
        }
        PyList_SET_ITEM(out, q, end ? end : Py_NewRef(t_obj));
    }
    goto done;
give_up:
    gave_up = 1;
fail:
    Py_CLEAR(out);
done:
    PyMem_Free(v);
    if (!out && gave_up && !PyErr_Occurred()) Py_RETURN_NONE;
    return out;
}

/* group_by_rank(records, by_rank, stream) -> None: each record whose rank is a key of the dict
 * `by_rank` appended to that key's list, in order; where `stream` is not None, only the
 * records on that stream (sim.engine.outputs.records_by_rank's and memory_series' passes) */
static PyObject *group_by_rank(PyObject *self, PyObject *args) {
    PyObject *recs, *by_rank, *stream;
    if (!PyArg_ParseTuple(args, "O!O!O", &PyList_Type, &recs, &PyDict_Type, &by_rank, &stream)) return NULL;
    Py_ssize_t n = PyList_GET_SIZE(recs);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *r = PyList_GET_ITEM(recs, i);
        if (!PyTuple_Check(r) || PyTuple_GET_SIZE(r) < 6) {
            PyErr_SetString(PyExc_TypeError, "group_by_rank: not a Record");
            return NULL;
        }
        if (stream != Py_None) {
            int same = PyObject_RichCompareBool(PyTuple_GET_ITEM(r, R_STREAM), stream, Py_EQ);
            if (same < 0) return NULL;
            if (!same) continue;
        }
        PyObject *mine = PyDict_GetItemWithError(by_rank, PyTuple_GET_ITEM(r, R_RANK));
        if (!mine) {
            if (PyErr_Occurred()) return NULL;
            continue;
        }
        if (!PyList_Check(mine)) {
            PyErr_SetString(PyExc_TypeError, "group_by_rank: a rank's entry is not a list");
            return NULL;
        }
        if (PyList_Append(mine, r) < 0) return NULL;
    }
    Py_RETURN_NONE;
}

/* flow_events(items, pp_tid, compute_tid) -> bytes or None: sim.engine.outputs._trace_tail_json's
 * pipeline arrows, each item (id, name, src, dst, sent_ns, end_ns) an "s" event on the sender's
 * pp thread at sent_ns and an "f" event bound to the enclosing slice on the receiver's compute
 * thread at end_ns, joined by ","; None where a rank or time is not an int it writes (the
 * Python writes them). */
static PyObject *flow_events(PyObject *self, PyObject *args) {
    PyObject *items;
    long long pp_tid, compute_tid;
    if (!PyArg_ParseTuple(args, "O!LL", &PyList_Type, &items, &pp_tid, &compute_tid)) return NULL;
    Buf b = BUF_INIT;
    int gave_up = 0;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(items); i++) {
        PyObject *it = PyList_GET_ITEM(items, i);
        long long id, src, dst, sent, end;
        if (!PyTuple_Check(it) || PyTuple_GET_SIZE(it) != 6) {
            PyErr_SetString(PyExc_TypeError, "flow_events: an item is (id, name, src, dst, sent_ns, end_ns)");
            goto fail;
        }
        GIVE_UP(get_ll(PyTuple_GET_ITEM(it, 0), &id) || get_ll(PyTuple_GET_ITEM(it, 2), &src)
                || get_ll(PyTuple_GET_ITEM(it, 3), &dst) || get_ll(PyTuple_GET_ITEM(it, 4), &sent)
                || get_ll(PyTuple_GET_ITEM(it, 5), &end));
        GIVE_UP(sent < 0 || sent >= US_LIMIT || end < 0 || end >= US_LIMIT);
        PyObject *name = PyTuple_GET_ITEM(it, 1);
        FAIL((i && PUT(&b, ",")) || PUT(&b, "{\"ph\":\"s\",\"id\":") || put_int(&b, id) || PUT(&b, ",\"name\":")
             || put_json(&b, name) || PUT(&b, ",\"cat\":\"pp\",\"pid\":") || put_int(&b, src)
             || PUT(&b, ",\"tid\":") || put_int(&b, pp_tid) || PUT(&b, ",\"ts\":") || put_us(&b, sent)
             || PUT(&b, "},{\"ph\":\"f\",\"bp\":\"e\",\"id\":") || put_int(&b, id) || PUT(&b, ",\"name\":")
             || put_json(&b, name) || PUT(&b, ",\"cat\":\"pp\",\"pid\":") || put_int(&b, dst)
             || PUT(&b, ",\"tid\":") || put_int(&b, compute_tid) || PUT(&b, ",\"ts\":") || put_us(&b, end)
             || PUT(&b, "}"));
    }
    return done(&b, 0);
fail:
    return done(&b, gave_up);
}

/* counter_events(head, key, points, divisor) -> bytes or None: a counter track's events as
 * outputs._trace_tail_json and link_events_json write them, joined by ",": for each (t, v) of
 * `points`, `head` (the event's text up to "ts":), t in microseconds, then "args":{key: the repr
 * of round(v / divisor, 6)} (round(v, 6) where divisor is None); None where a time is not an
 * int it writes (the Python writes them). */
static PyObject *counter_events(PyObject *self, PyObject *args) {
    PyObject *head, *key, *points, *divisor;
    if (!PyArg_ParseTuple(args, "UUO!O", &head, &key, &PyList_Type, &points, &divisor)) return NULL;
    Buf b = BUF_INIT;
    int gave_up = 0;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(points); i++) {
        PyObject *pt = PyList_GET_ITEM(points, i), *v = NULL, *rounded = NULL, *text = NULL;
        long long t;
        if (!PyTuple_Check(pt) || PyTuple_GET_SIZE(pt) != 2) {
            PyErr_SetString(PyExc_TypeError, "counter_events: a point is (t, value)");
            goto fail;
        }
        GIVE_UP(get_ll(PyTuple_GET_ITEM(pt, 0), &t) || t < 0 || t >= US_LIMIT);
        v = divisor == Py_None ? Py_NewRef(PyTuple_GET_ITEM(pt, 1)) : PyNumber_TrueDivide(PyTuple_GET_ITEM(pt, 1), divisor);
        rounded = v ? PyObject_CallMethod(v, "__round__", "i", 6) : NULL;
        text = rounded ? PyObject_Repr(rounded) : NULL;
        int bad = !text || (i && PUT(&b, ",")) || put_str(&b, head) || put_us(&b, t) || PUT(&b, ",\"args\":{")
                  || put_json(&b, key) || PUT(&b, ":") || put_str(&b, text) || PUT(&b, "}}");
        Py_XDECREF(v);
        Py_XDECREF(rounded);
        Py_XDECREF(text);
        FAIL(bad);
    }
    return done(&b, 0);
fail:
    return done(&b, gave_up);
}

/* One host item (kineto._Item) in C: its sort key, its calls, its place on the host thread */
enum { CALL_LAUNCH, CALL_RECORD, CALL_WAIT };

typedef struct {
    long long due, prio, seq, start, cost;
    int ncalls, launch;                        /* launch: the index of its launch call */
    unsigned char what[4];
    PyObject *rec[4];                          /* owned */
} PlanItem;

typedef struct {
    Py_ssize_t n, n_records;                   /* items; record calls among them */
    PlanItem *items;
} Plan;

#define PLAN_NAME "sim5d._textout.plan"

static void plan_free(Plan *p) {
    if (!p) return;
    for (Py_ssize_t i = 0; i < p->n; i++)
        for (int k = 0; k < p->items[i].ncalls; k++) Py_XDECREF(p->items[i].rec[k]);
    PyMem_Free(p->items);
    PyMem_Free(p);
}

static void plan_capsule_free(PyObject *cap) { plan_free(PyCapsule_GetPointer(cap, PLAN_NAME)); }

static void add_call(PlanItem *it, int what, PyObject *rec) {
    if (what == CALL_LAUNCH) it->launch = it->ncalls;
    it->what[it->ncalls] = (unsigned char)what;
    it->rec[it->ncalls++] = Py_NewRef(rec);
}

static int cmp_plan(const void *a, const void *b) {
    const PlanItem *x = a, *y = b;
    if (x->due != y->due) return x->due < y->due ? -1 : 1;
    if (x->prio != y->prio) return x->prio < y->prio ? -1 : 1;
    return x->seq < y->seq ? -1 : x->seq > y->seq;
}

typedef struct {
    long long start;
    PyObject *stream;
    Py_ssize_t at;                             /* the position before sorting: a stable sort */
    PyObject *rec;
} Other;

static int cmp_others(const void *a, const void *b) {
    const Other *x = a, *y = b;
    if (x->start != y->start) return x->start < y->start ? -1 : 1;
    int c = str_cmp(x->stream, y->stream);
    if (c) return c;
    return x->at < y->at ? -1 : x->at > y->at;
}

/* A set of object addresses (open addressing; the table is sized for what goes in) */
typedef struct {
    size_t mask;
    void **key;
    long long *val;
} PtrMap;

static int ptrmap_init(PtrMap *m, Py_ssize_t most) {
    size_t cap = 16;
    while (cap < 2 * (size_t)most + 2) cap *= 2;
    m->mask = cap - 1;
    m->key = PyMem_Calloc(cap, sizeof(void *));
    m->val = PyMem_Malloc(cap * sizeof(long long));
    if (!m->key || !m->val) {
        PyMem_Free(m->key);
        PyMem_Free(m->val);
        m->key = NULL;
        m->val = NULL;
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

static size_t ptrmap_slot(const PtrMap *m, const void *k) {
    size_t h = ((size_t)k >> 4) * 0x9E3779B97F4A7C15ULL;
    size_t i = (h ^ (h >> 29)) & m->mask;
    while (m->key[i] && m->key[i] != k) i = (i + 1) & m->mask;
    return i;
}

static void ptrmap_put(PtrMap *m, void *k, long long v) {
    size_t i = ptrmap_slot(m, k);
    m->key[i] = k;
    m->val[i] = v;
}

static int ptrmap_get(const PtrMap *m, const void *k, long long *v) {
    size_t i = ptrmap_slot(m, k);
    if (!m->key[i]) return 0;
    *v = m->val[i];
    return 1;
}

static void ptrmap_free(PtrMap *m) {
    PyMem_Free(m->key);
    PyMem_Free(m->val);
}

/* kineto._binding_sources, _items and _place on one rank's records (`mine` in order, `comp` its
 * compute-stream ones, `recvs` its receives) as a Plan; NULL with an error, or NULL without one
 * where a time is not a 64-bit integer (the Python runs) */
static Plan *make_plan(PyObject *mine, PyObject *comp, PyObject *recvs, long long runtime_ns, long long launch_ns) {
    Py_ssize_t nc = PyList_GET_SIZE(comp), nm = PyList_GET_SIZE(mine), nr = PyList_GET_SIZE(recvs);
    long long *ends = PyMem_Malloc(sizeof(long long) * (size_t)(nc + 1));
    PyObject **waits = PyMem_Calloc((size_t)nc + 1, sizeof(PyObject *));     /* borrowed */
    Other *others = PyMem_Malloc(sizeof(Other) * (size_t)(nm + nr + 1));
    Plan *plan = PyMem_Calloc(1, sizeof(Plan));
    PyObject *ends_of = NULL;                   /* end time -> the record a kernel starting then waited for */
    PtrMap waited = {0, NULL, NULL};            /* the records waited for */
    Py_ssize_t n_others = 0, n_waited = 0;
    int ok = 0;
    if (!ends || !waits || !others || !plan) {
        PyErr_NoMemory();
        goto done;
    }
    plan->items = PyMem_Calloc((size_t)(nc + nm + nr) + 1, sizeof(PlanItem));
    if (!plan->items) {
        PyErr_NoMemory();
        goto done;
    }
    ends_of = PyDict_New();
    if (!ends_of) goto done;
#define REC_OK(r) (PyTuple_Check(r) && PyTuple_GET_SIZE(r) >= 6 && PyUnicode_Check(PyTuple_GET_ITEM(r, R_STREAM)))
#define BAD_REC() do { PyErr_SetString(PyExc_TypeError, "host_plan: not a Record"); goto done; } while (0)
    for (Py_ssize_t i = 0; i < nc; i++) {
        PyObject *r = PyList_GET_ITEM(comp, i);
        if (!REC_OK(r)) BAD_REC();
        if (get_t(PyTuple_GET_ITEM(r, R_END), &ends[i])) goto done;
    }
    /* _binding_sources: per end time, the non-compute record with the largest (start, stream),
     * then the receives */
    order_error = 0;
    for (Py_ssize_t i = 0; i < nm; i++) {
        PyObject *r = PyList_GET_ITEM(mine, i);
        long long start, bstart;
        if (!REC_OK(r)) BAD_REC();
        PyObject *stream = PyTuple_GET_ITEM(r, R_STREAM);
        if (PyUnicode_CompareWithASCIIString(stream, "compute") == 0) continue;
        if (get_t(PyTuple_GET_ITEM(r, R_START), &start)) goto done;
        others[n_others] = (Other){start, stream, n_others, r};
        n_others++;
        PyObject *best = PyDict_GetItemWithError(ends_of, PyTuple_GET_ITEM(r, R_END));
        if (!best && PyErr_Occurred()) goto done;
        int better = best == NULL;
        if (best) {
            if (get_t(PyTuple_GET_ITEM(best, R_START), &bstart)) goto done;
            if (start != bstart) {
                better = start > bstart;
            } else {
                int c = str_cmp(stream, PyTuple_GET_ITEM(best, R_STREAM));
                if (order_error) goto done;
                better = c > 0;
            }
        }
        if (better && PyDict_SetItem(ends_of, PyTuple_GET_ITEM(r, R_END), r) < 0) goto done;
    }
    for (Py_ssize_t i = 0; i < nr; i++) {
        PyObject *r = PyList_GET_ITEM(recvs, i);
        long long start;
        if (!REC_OK(r)) BAD_REC();
        if (get_t(PyTuple_GET_ITEM(r, R_START), &start)) goto done;
        others[n_others] = (Other){start, PyTuple_GET_ITEM(r, R_STREAM), n_others, r};
        n_others++;
        if (PyDict_SetItem(ends_of, PyTuple_GET_ITEM(r, R_END), r) < 0) goto done;
    }
    long long prev = 0;
    for (Py_ssize_t i = 0; i < nc; i++) {
        PyObject *r = PyList_GET_ITEM(comp, i);
        long long start;
        if (get_t(PyTuple_GET_ITEM(r, R_START), &start)) goto done;
        if (start > prev) {
            PyObject *src = PyDict_GetItemWithError(ends_of, PyTuple_GET_ITEM(r, R_START));
            if (!src && PyErr_Occurred()) goto done;
            if (src) {
                waits[i] = src;
                n_waited++;
            }
        }
        prev = ends[i];
    }
    if (ptrmap_init(&waited, n_waited)) goto done;
    for (Py_ssize_t i = 0; i < nc; i++)
        if (waits[i]) ptrmap_put(&waited, waits[i], 1);
    /* _items: each compute kernel (after its wait), then the others by (start, stream) */
    Py_ssize_t n = 0;
    for (Py_ssize_t i = 0; i < nc; i++) {
        PyObject *r = PyList_GET_ITEM(comp, i);
        PlanItem *it = &plan->items[n];
        get_t(PyTuple_GET_ITEM(r, R_START), &it->due);
        it->prio = 1;
        it->seq = n;
        if (waits[i]) add_call(it, CALL_WAIT, waits[i]);
        add_call(it, CALL_LAUNCH, r);
        plan->n = ++n;
    }
    qsort(others, (size_t)n_others, sizeof(Other), cmp_others);
    if (order_error) goto done;
    for (Py_ssize_t k = 0; k < n_others; k++) {
        PyObject *r = others[k].rec;
        long long start = others[k].start, one;
        Py_ssize_t lo = 0, hi = nc;            /* bisect.bisect_right(ends, start) */
        while (lo < hi) {
            Py_ssize_t mid = (lo + hi) / 2;
            if (start < ends[mid]) hi = mid;
            else lo = mid + 1;
        }
        Py_ssize_t j = lo - 1;
        PlanItem *it = &plan->items[n];
        if (j >= 0) {
            add_call(it, CALL_RECORD, PyList_GET_ITEM(comp, j));
            add_call(it, CALL_WAIT, PyList_GET_ITEM(comp, j));
            plan->n_records++;
        }
        add_call(it, CALL_LAUNCH, r);
        if (ptrmap_get(&waited, r, &one)) {
            add_call(it, CALL_RECORD, r);
            plan->n_records++;
        }
        it->due = j >= 0 ? ends[j] : start;
        it->prio = 0;
        it->seq = n;
        plan->n = ++n;
    }
    qsort(plan->items, (size_t)n, sizeof(PlanItem), cmp_plan);
    /* _place: as late as possible, one after another, each ending by its due */
    long long nxt = 0;
    for (Py_ssize_t k = n - 1; k >= 0; k--) {
        PlanItem *it = &plan->items[k];
        it->cost = runtime_ns * it->ncalls + launch_ns;
        long long end = k == n - 1 || it->due < nxt ? it->due : nxt;
        it->start = nxt = end - it->cost;
    }
    ok = 1;
done:
#undef REC_OK
#undef BAD_REC
    PyMem_Free(ends);
    PyMem_Free(waits);
    PyMem_Free(others);
    ptrmap_free(&waited);
    Py_XDECREF(ends_of);
    if (!ok) {
        plan_free(plan);
        return NULL;
    }
    return plan;
}

/* host_plan(mine, comp, recvs, runtime_ns, launch_ns) -> (the launched records in host order,
 * the plan, the first item's host start, the last one's host end (None, None for no item), the
 * number of the items' calls) or
 * None (a time that is not a 64-bit integer: the Python runs). The plan is what `plan_events`
 * writes and `plan_items` gives as kineto._Items. */
static PyObject *host_plan(PyObject *self, PyObject *args) {
    PyObject *mine, *comp, *recvs;
    long long runtime_ns, launch_ns;
    if (!PyArg_ParseTuple(args, "O!O!O!LL", &PyList_Type, &mine, &PyList_Type, &comp, &PyList_Type, &recvs,
                          &runtime_ns, &launch_ns))
        return NULL;
    if (runtime_ns < 0 || runtime_ns >= US_LIMIT || launch_ns < 0 || launch_ns >= US_LIMIT) Py_RETURN_NONE;
    Plan *plan = make_plan(mine, comp, recvs, runtime_ns, launch_ns);
    if (!plan) {
        if (PyErr_Occurred()) return NULL;
        Py_RETURN_NONE;
    }
    PyObject *cap = PyCapsule_New(plan, PLAN_NAME, plan_capsule_free);
    if (!cap) {
        plan_free(plan);
        return NULL;
    }
    PyObject *launched = PyList_New(plan->n);
    if (!launched) {
        Py_DECREF(cap);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < plan->n; i++) {
        PlanItem *it = &plan->items[i];
        PyList_SET_ITEM(launched, i, Py_NewRef(it->rec[it->launch]));
    }
    PyObject *first = Py_None, *last = Py_None, *calls;
    long long n_calls = 0;
    for (Py_ssize_t i = 0; i < plan->n; i++) n_calls += plan->items[i].ncalls;
    calls = PyLong_FromLongLong(n_calls);
    if (plan->n) {
        PlanItem *end = &plan->items[plan->n - 1];
        first = PyLong_FromLongLong(plan->items[0].start);
        last = PyLong_FromLongLong(end->start + end->cost);
    }
    PyObject *out = first && last && calls ? PyTuple_Pack(5, launched, cap, first, last, calls) : NULL;
    if (plan->n) {
        Py_XDECREF(first);
        Py_XDECREF(last);
    }
    Py_XDECREF(calls);
    Py_DECREF(launched);
    Py_DECREF(cap);
    return out;
}

static Plan *plan_of(PyObject *cap) { return PyCapsule_GetPointer(cap, PLAN_NAME); }

/* plan_items(plan, item_type) -> (items, starts, costs): the plan as kineto._items' _Items (made
 * as `item_type`) and kineto._place's starts and host times */
static PyObject *plan_items(PyObject *self, PyObject *args) {
    PyObject *cap, *out = NULL, *lst = NULL, *starts = NULL, *costs = NULL, *names[3] = {NULL, NULL, NULL};
    PyTypeObject *cls;
    if (!PyArg_ParseTuple(args, "OO!", &cap, &PyType_Type, &cls)) return NULL;
    Plan *plan = plan_of(cap);
    if (!plan) return NULL;
    if (!PyType_IsSubtype(cls, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "plan_items: item_type is not a tuple type");
        return NULL;
    }
    names[CALL_LAUNCH] = PyUnicode_InternFromString("launch");
    names[CALL_RECORD] = PyUnicode_InternFromString("record");
    names[CALL_WAIT] = PyUnicode_InternFromString("wait");
    lst = PyList_New(plan->n);
    starts = PyList_New(plan->n);
    costs = PyList_New(plan->n);
    if (!names[0] || !names[1] || !names[2] || !lst || !starts || !costs) goto done;
    for (Py_ssize_t i = 0; i < plan->n; i++) {
        PlanItem *it = &plan->items[i];
        PyObject *calls = PyTuple_New(it->ncalls), *item = cls->tp_alloc(cls, 5);
        if (!calls || !item) {
            Py_XDECREF(calls);
            Py_XDECREF(item);
            goto done;
        }
        PyList_SET_ITEM(lst, i, item);
        PyTuple_SET_ITEM(item, 3, calls);
        PyTuple_SET_ITEM(item, 4, Py_NewRef(it->rec[it->launch]));
        for (int k = 0; k < it->ncalls; k++) {
            PyObject *pair = PyTuple_Pack(2, names[it->what[k]], it->rec[k]);
            if (!pair) goto done;
            PyTuple_SET_ITEM(calls, k, pair);
        }
        long long nums[3] = {it->due, it->prio, it->seq};
        for (int k = 0; k < 3; k++) {
            PyObject *v = PyLong_FromLongLong(nums[k]);
            if (!v) goto done;
            PyTuple_SET_ITEM(item, k, v);
        }
        PyObject *a = PyLong_FromLongLong(it->start), *b = PyLong_FromLongLong(it->cost);
        if (!a || !b) {
            Py_XDECREF(a);
            Py_XDECREF(b);
            goto done;
        }
        PyList_SET_ITEM(starts, i, a);
        PyList_SET_ITEM(costs, i, b);
    }
    out = PyTuple_Pack(3, lst, starts, costs);
done:
    for (int k = 0; k < 3; k++) Py_XDECREF(names[k]);
    Py_XDECREF(lst);
    Py_XDECREF(starts);
    Py_XDECREF(costs);
    return out;
}

/* nccl_extras(launched, texts, comm, senders, make, memo_of) -> list: kineto._details' loop, the
 * text Kineto's NCCL args add to each launched record's args ("" for a compute kernel): for a
 * communication record (not on the compute stream, or of a "comm:" category) its call
 * `comm(record)` -- a receive's ("pp-recv") is its sender's, `senders[name]`, or none -- and where
 * there is one, `make(call, is_receive, with_dtype)`, with_dtype where its `texts` entry has no
 * "dtype" key. `comm`'s answer is looked up first in `memo_of(the record's rank)`, a dict by the
 * name's key (name_key) of what `comm` answers for every record of that name (it fills it), and
 * asked of `comm` only where it is not there. Each call object's texts are made once (`comm` gives
 * the same object for every record of a name that is one call: a rank's thousands of records are
 * a few dozen calls). */
typedef struct {
    PyObject *info;                            /* owned: no other call gets its address meanwhile */
    PyObject *text[4];                         /* owned, by is_receive * 2 + with_dtype */
} Extra;

/* `comm(r)` of a Record `r` (a new reference), looked up first in its rank's memo (nccl_extras):
 * *memo holds memo_of(*memo_rank), the last rank's, made again when the rank changes */
static PyObject *memo_comm(PyObject *comm, PyObject *memo_of, PyObject **memo, long long *memo_rank, PyObject *r) {
    long long rank;
    if (!PyTuple_Check(r) || PyTuple_GET_SIZE(r) <= R_NAME || !PyUnicode_Check(PyTuple_GET_ITEM(r, R_NAME))
        || get_ll(PyTuple_GET_ITEM(r, R_RANK), &rank))
        return PyObject_CallOneArg(comm, r);           /* (not a Record of a machine-int rank: comm's own way) */
    if (!*memo || rank != *memo_rank) {
        Py_CLEAR(*memo);
        *memo = PyObject_CallOneArg(memo_of, PyTuple_GET_ITEM(r, R_RANK));
        if (!*memo) return NULL;
        if (!PyDict_Check(*memo)) {
            Py_CLEAR(*memo);
            PyErr_SetString(PyExc_TypeError, "nccl_extras: memo_of() did not give a dict");
            return NULL;
        }
        *memo_rank = rank;
    }
    PyObject *key, *mb;
    if (split_name(PyTuple_GET_ITEM(r, R_NAME), &key, &mb)) return NULL;
    Py_DECREF(mb);
    PyObject *hit = PyDict_GetItemWithError(*memo, key);
    Py_DECREF(key);
    if (hit) return Py_NewRef(hit);
    if (PyErr_Occurred()) return NULL;
    return PyObject_CallOneArg(comm, r);
}

static PyObject *nccl_extras(PyObject *self, PyObject *args) {
    PyObject *launched, *texts, *comm, *senders, *make, *memo_of, *memo = NULL;
    long long memo_rank = 0;
    if (!PyArg_ParseTuple(args, "O!O!OO!OO", &PyList_Type, &launched, &PyList_Type, &texts, &comm, &PyDict_Type,
                          &senders, &make, &memo_of))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(launched), n_cache = 0;
    if (PyList_GET_SIZE(texts) != n) {
        PyErr_SetString(PyExc_ValueError, "nccl_extras: lists of different lengths");
        return NULL;
    }
    PtrMap seen = {0, NULL, NULL};             /* call -> its index in `cache` */
    Extra *cache = PyMem_Calloc((size_t)n + 1, sizeof(Extra));
    PyObject *empty = PyUnicode_New(0, 0), *dtype = PyUnicode_FromString("\"dtype\":");
    PyObject *prefix = PyUnicode_FromString("comm:"), *out = PyList_New(n);
    int ok = 0;
    if (!cache) PyErr_NoMemory();
    if (!cache || !empty || !dtype || !prefix || !out || ptrmap_init(&seen, n)) goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *r = PyList_GET_ITEM(launched, i), *info, *text = PyList_GET_ITEM(texts, i);
        PyList_SET_ITEM(out, i, Py_NewRef(empty));
        if (!PyTuple_Check(r) || PyTuple_GET_SIZE(r) < 6 || !PyUnicode_Check(PyTuple_GET_ITEM(r, R_STREAM))
            || !PyUnicode_Check(PyTuple_GET_ITEM(r, R_CAT)) || !PyUnicode_Check(text)) {
            PyErr_SetString(PyExc_TypeError, "nccl_extras: not a Record and its text");
            goto done;
        }
        PyObject *stream = PyTuple_GET_ITEM(r, R_STREAM);
        if (PyUnicode_CompareWithASCIIString(stream, "compute") == 0) {
            Py_ssize_t comm_cat = PyUnicode_Tailmatch(PyTuple_GET_ITEM(r, R_CAT), prefix, 0, PY_SSIZE_T_MAX, -1);
            if (comm_cat < 0) goto done;
            if (!comm_cat) continue;
        }
        int recv = PyUnicode_CompareWithASCIIString(stream, "pp-recv") == 0;
        if (recv) {
            PyObject *sender = PyDict_GetItemWithError(senders, PyTuple_GET_ITEM(r, R_NAME));
            if (!sender) {
                if (PyErr_Occurred()) goto done;
                continue;
            }
            r = sender;
        }
        info = memo_comm(comm, memo_of, &memo, &memo_rank, r);
        if (!info) goto done;
        if (info == Py_None) {
            Py_DECREF(info);
            continue;
        }
        int has = PySequence_Contains(text, dtype);
        if (has < 0) {
            Py_DECREF(info);
            goto done;
        }
        long long at;
        Extra *e;
        if (ptrmap_get(&seen, info, &at)) {
            e = &cache[at];
            Py_DECREF(info);
        } else {
            e = &cache[n_cache];
            e->info = info;
            ptrmap_put(&seen, info, n_cache++);
        }
        int slot = recv * 2 + !has;
        if (!e->text[slot]) {
            PyObject *t = PyObject_CallFunctionObjArgs(make, e->info, recv ? Py_True : Py_False,
                                                       has ? Py_False : Py_True, NULL);
            if (!t) goto done;
            if (!PyUnicode_Check(t)) {
                Py_DECREF(t);
                PyErr_SetString(PyExc_TypeError, "nccl_extras: make() did not give a str");
                goto done;
            }
            e->text[slot] = t;
        }
        PyObject *old = PyList_GET_ITEM(out, i);
        PyList_SET_ITEM(out, i, Py_NewRef(e->text[slot]));
        Py_DECREF(old);
    }
    ok = 1;
done:
    if (cache)
        for (Py_ssize_t k = 0; k < n_cache; k++) {
            Py_XDECREF(cache[k].info);
            for (int j = 0; j < 4; j++) Py_XDECREF(cache[k].text[j]);
        }
    PyMem_Free(cache);
    ptrmap_free(&seen);
    Py_XDECREF(memo);
    Py_XDECREF(empty);
    Py_XDECREF(dtype);
    Py_XDECREF(prefix);
    if (!ok) Py_CLEAR(out);
    return out;
}

/* A kernel's args after its own (kineto._joined): the args object's text without its braces,
 * after a comma (nothing for "{}"), then its NCCL args text */
static int put_detail(Buf *b, PyObject *text, PyObject *extra) {
    Py_ssize_t n;
    const char *c = utf8(text, &n);                       /* JSON, ASCII: '{' ... '}' */
    if (!c) return -1;
    if (n > 2 && (PUT(b, ",") || put(b, c + 1, n - 2))) return -1;
    return put_str(b, extra);
}

/* plan_events(plan, off, texts, extras, kinds, streams, device, runtime_ns, launch_ns, host_pid,
 *             host_tid, cbids)
 * -> (the events joined by ",", as bytes; the set of stream ids of the launched kernels) or None.
 * sim.engine.kineto._host_and_gpu_py's loop on the plan's items (`host_plan`), the host times
 * and the kernels' times shifted by `off`: `kinds` each item's (kernel name, cpu_op name) as JSON
 * strings, `texts` and `extras` each kernel's args (kineto._details), `cbids` CUPTI's ids of
 * (cudaLaunchKernel, cudaEventRecord, cudaStreamWaitEvent). None where a time is one us_text's
 * positional text does not write (the Python loop runs). */
static PyObject *plan_events(PyObject *self, PyObject *args) {
    PyObject *cap, *texts, *extras, *kinds, *streams, *cbid;
    long long device, off, runtime_ns, launch_ns, host_pid, host_tid, cb_launch, cb_record, cb_wait;
    if (!PyArg_ParseTuple(args, "OLO!O!O!O!LLLLLO!", &cap, &off, &PyList_Type, &texts, &PyList_Type, &extras,
                          &PyList_Type, &kinds, &PyDict_Type, &streams, &device, &runtime_ns, &launch_ns,
                          &host_pid, &host_tid, &PyTuple_Type, &cbid))
        return NULL;
    Plan *plan = plan_of(cap);
    if (!plan) return NULL;
    Py_ssize_t n = plan->n;
    if (PyList_GET_SIZE(texts) != n || PyList_GET_SIZE(extras) != n || PyList_GET_SIZE(kinds) != n
        || PyTuple_GET_SIZE(cbid) != 3) {
        PyErr_SetString(PyExc_ValueError, "plan_events: lists of different lengths");
        return NULL;
    }
    if (get_ll(PyTuple_GET_ITEM(cbid, 0), &cb_launch) || get_ll(PyTuple_GET_ITEM(cbid, 1), &cb_record)
        || get_ll(PyTuple_GET_ITEM(cbid, 2), &cb_wait) || runtime_ns < 0 || runtime_ns >= US_LIMIT
        || launch_ns < 0 || launch_ns >= US_LIMIT || off <= -(1LL << 62) || off >= (1LL << 62))
        Py_RETURN_NONE;
    Buf b = BUF_INIT;
    if (grow(&b, 1024 * (n + 1))) return NULL;      /* about 900 bytes an item: no copying as it grows */
    int gave_up = 0;
    long long corr = 0;
    PtrMap recorded = {0, NULL, NULL};         /* record -> correlation of its last cudaEventRecord */
    PyObject *used = PySet_New(NULL), *text = NULL;
    unsigned char seen[256] = {0};             /* stream ids below 256 already in `used` */
    FAIL(!used || ptrmap_init(&recorded, plan->n_records));
    for (Py_ssize_t i = 0; i < n; i++) {
        PlanItem *it = &plan->items[i];
        PyObject *kind = PyList_GET_ITEM(kinds, i);
        FAIL(!PyTuple_Check(kind) || PyTuple_GET_SIZE(kind) != 2);
        PyObject *kname = PyTuple_GET_ITEM(kind, 0), *op = PyTuple_GET_ITEM(kind, 1);
        PyObject *launch = it->rec[it->launch];
        long long t = it->start + off, cost = it->cost, ext = i + 1;
        GIVE_UP(t < 0 || t >= US_LIMIT || cost < 0 || cost >= US_LIMIT);
        if (i) FAIL(PUT(&b, ","));
        FAIL(PUT(&b, "{\"ph\":\"X\",\"cat\":\"cpu_op\",\"name\":") || put_str(&b, op) || PUT(&b, ",\"pid\":")
             || put_int(&b, host_pid) || PUT(&b, ",\"tid\":") || put_int(&b, host_tid) || PUT(&b, ",\"ts\":")
             || put_us(&b, t) || PUT(&b, ",\"dur\":") || put_us(&b, cost) || PUT(&b, ",\"args\":{\"External id\":")
             || put_int(&b, ext) || PUT(&b, "}}"));
        t += runtime_ns;
        for (int k = 0; k < it->ncalls; k++) {
            PyObject *rec = it->rec[k];
            corr++;
            GIVE_UP(t >= US_LIMIT);
            if (it->what[k] != CALL_LAUNCH) {
                int record = it->what[k] == CALL_RECORD;
                FAIL(PUT(&b, ",{\"ph\":\"X\",\"cat\":\"cuda_runtime\",\"name\":\"")
                     || (record ? PUT(&b, "cudaEventRecord") : PUT(&b, "cudaStreamWaitEvent"))
                     || PUT(&b, "\",\"pid\":") || put_int(&b, host_pid) || PUT(&b, ",\"tid\":")
                     || put_int(&b, host_tid) || PUT(&b, ",\"ts\":") || put_us(&b, t) || PUT(&b, ",\"dur\":")
                     || put_us(&b, runtime_ns) || PUT(&b, ",\"args\":{\"cbid\":")
                     || put_int(&b, record ? cb_record : cb_wait) || PUT(&b, ",\"correlation\":")
                     || put_int(&b, corr) || PUT(&b, ",\"External id\":") || put_int(&b, ext) || PUT(&b, "}}"));
                t += runtime_ns;
                GIVE_UP(t >= US_LIMIT);
                if (record) {
                    ptrmap_put(&recorded, rec, corr);
                    continue;
                }
                long long waiting, waited, rec_corr = -1;
                ptrmap_get(&recorded, rec, &rec_corr);
                FAIL(get_id(streams, PyTuple_GET_ITEM(launch, R_STREAM), &waiting)
                     || get_id(streams, PyTuple_GET_ITEM(rec, R_STREAM), &waited));
                FAIL(PUT(&b, ",{\"ph\":\"X\",\"cat\":\"cuda_sync\",\"name\":\"Stream Wait Event\",\"pid\":")
                     || put_int(&b, device) || PUT(&b, ",\"tid\":") || put_int(&b, waiting) || PUT(&b, ",\"ts\":")
                     || put_us(&b, t) || PUT(&b, ",\"dur\":0.0,\"args\":{\"cuda_sync_kind\":\"Stream Wait Event\","
                                                 "\"stream\":")
                     || put_int(&b, waiting) || PUT(&b, ",\"correlation\":") || put_int(&b, corr)
                     || PUT(&b, ",\"device\":") || put_int(&b, device) || PUT(&b, ",\"wait_on_stream\":")
                     || put_int(&b, waited) || PUT(&b, ",\"wait_on_cuda_event_record_corr_id\":")
                     || put_int(&b, rec_corr) || PUT(&b, "}}"));
                continue;
            }
            long long sid, start, end;
            FAIL(get_id(streams, PyTuple_GET_ITEM(rec, R_STREAM), &sid));
            if (sid < 0 || sid >= 256 || !seen[sid]) {
                PyObject *s = PyLong_FromLongLong(sid);
                int bad = !s || PySet_Add(used, s) < 0;
                Py_XDECREF(s);
                FAIL(bad);
                if (sid >= 0 && sid < 256) seen[sid] = 1;
            }
            GIVE_UP(get_t(PyTuple_GET_ITEM(rec, R_START), &start) || get_t(PyTuple_GET_ITEM(rec, R_END), &end));
            long long ts = start + off, dur = end - start;
            GIVE_UP(ts < 0 || ts >= US_LIMIT || dur < 0 || dur >= US_LIMIT);
            FAIL(PUT(&b, ",{\"ph\":\"X\",\"cat\":\"cuda_runtime\",\"name\":\"cudaLaunchKernel\",\"pid\":")
                 || put_int(&b, host_pid) || PUT(&b, ",\"tid\":") || put_int(&b, host_tid) || PUT(&b, ",\"ts\":")
                 || put_us(&b, t) || PUT(&b, ",\"dur\":") || put_us(&b, launch_ns) || PUT(&b, ",\"args\":{\"cbid\":")
                 || put_int(&b, cb_launch) || PUT(&b, ",\"correlation\":") || put_int(&b, corr)
                 || PUT(&b, ",\"External id\":") || put_int(&b, ext) || PUT(&b, "}},{\"ph\":\"s\",\"id\":")
                 || put_int(&b, corr) || PUT(&b, ",\"pid\":") || put_int(&b, host_pid) || PUT(&b, ",\"tid\":")
                 || put_int(&b, host_tid) || PUT(&b, ",\"ts\":") || put_us(&b, t)
                 || PUT(&b, ",\"cat\":\"ac2g\",\"name\":\"ac2g\"},{\"ph\":\"X\",\"cat\":\"kernel\",\"name\":")
                 || put_str(&b, kname) || PUT(&b, ",\"pid\":") || put_int(&b, device) || PUT(&b, ",\"tid\":")
                 || put_int(&b, sid) || PUT(&b, ",\"ts\":") || put_us(&b, ts) || PUT(&b, ",\"dur\":")
                 || put_us(&b, dur) || PUT(&b, ",\"args\":{\"External id\":") || put_int(&b, ext)
                 || PUT(&b, ",\"device\":") || put_int(&b, device) || PUT(&b, ",\"stream\":") || put_int(&b, sid)
                 || PUT(&b, ",\"correlation\":") || put_int(&b, corr)
                 || put_detail(&b, PyList_GET_ITEM(texts, i), PyList_GET_ITEM(extras, i))
                 || PUT(&b, ",\"sim5d_name\":") || put_json(&b, PyTuple_GET_ITEM(rec, R_NAME))
                 || PUT(&b, "}},{\"ph\":\"f\",\"id\":") || put_int(&b, corr) || PUT(&b, ",\"pid\":")
                 || put_int(&b, device) || PUT(&b, ",\"tid\":") || put_int(&b, sid) || PUT(&b, ",\"ts\":")
                 || put_us(&b, ts) || PUT(&b, ",\"cat\":\"ac2g\",\"name\":\"ac2g\",\"bp\":\"e\"}"));
            t += launch_ns;
        }
    }
    ptrmap_free(&recorded);
    text = done(&b, 0);
    if (!text) {
        Py_DECREF(used);
        return NULL;
    }
    PyObject *out = PyTuple_Pack(2, text, used);
    Py_DECREF(text);
    Py_DECREF(used);
    return out;
fail:
    if (!gave_up && !PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "plan_events: unexpected item");
    ptrmap_free(&recorded);
    Py_XDECREF(used);
    return done(&b, gave_up);
}

/* ---- the engine's records from its log (sim.engine.core.Engine._make_records) ---- */

/* A Record (a 7-field named tuple of `cls`) of these fields, owned by the caller; start and end
 * as new ints */
static PyObject *new_record(PyTypeObject *cls, PyObject *rank, PyObject *stream, PyObject *name, PyObject *cat,
                            long long start, long long end, PyObject *value) {
    PyObject *r = cls->tp_alloc(cls, 7), *s = PyLong_FromLongLong(start), *e = PyLong_FromLongLong(end);
    if (!r || !s || !e) {
        Py_XDECREF(r);
        Py_XDECREF(s);
        Py_XDECREF(e);
        Py_DECREF(name);
        return NULL;
    }
    PyTuple_SET_ITEM(r, R_RANK, Py_NewRef(rank));
    PyTuple_SET_ITEM(r, R_STREAM, Py_NewRef(stream));
    PyTuple_SET_ITEM(r, R_NAME, name);                  /* (the caller's reference, given) */
    PyTuple_SET_ITEM(r, R_CAT, Py_NewRef(cat));
    PyTuple_SET_ITEM(r, R_START, s);
    PyTuple_SET_ITEM(r, R_END, e);
    PyTuple_SET_ITEM(r, R_VALUE, Py_NewRef(value));
    return r;
}

static int add_new(PyObject *out, PyObject *rec) {
    if (!rec) return -1;
    int bad = PyList_Append(out, rec);
    Py_DECREF(rec);
    return bad;
}

/* make_records(log, members, keep, record_type, join_name) -> list or None: Engine._make_records
 * (its docstring): `members` {representative: its ranks} (empty without symmetry), `keep` a set
 * of ranks or None for every rank, `join_name(name, mb)` core._join_name for a name of a
 * two-action template; None where a time is not a 64-bit integer (the Python runs). */
static PyObject *make_records(PyObject *self, PyObject *args) {
    PyObject *log, *members, *keep, *join, *out = NULL;
    PyTypeObject *cls;
    if (!PyArg_ParseTuple(args, "O!O!OO!O", &PyList_Type, &log, &PyDict_Type, &members, &keep, &PyType_Type, &cls,
                          &join))
        return NULL;
    if (keep != Py_None && !PyAnySet_Check(keep)) {
        PyErr_SetString(PyExc_TypeError, "make_records: keep is a set or None");
        return NULL;
    }
    int gave_up = 0;
    out = PyList_New(0);
    if (!out) return NULL;
    Py_ssize_t n = PyList_GET_SIZE(log);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *x = PyList_GET_ITEM(log, i), *rank, *run = NULL;
        long long start = 0;
        int is_record = Py_IS_TYPE(x, cls);
        if (!PyTuple_Check(x) || PyTuple_GET_SIZE(x) < (is_record ? 7 : 3)) goto bad;
        rank = PyTuple_GET_ITEM(x, 0);
        if (!is_record) {
            if (get_t(PyTuple_GET_ITEM(x, 1), &start)) goto give_up;
            run = PyTuple_GET_ITEM(x, 2);
            if (!PyTuple_Check(run) || PyTuple_GET_SIZE(run) < 2 || !PyTuple_Check(PyTuple_GET_ITEM(run, 1))) goto bad;
        }
        PyObject *ranks = PyDict_GetItemWithError(members, rank);      /* the ranks it stands for */
        if (!ranks && PyErr_Occurred()) goto fail;
        if (ranks && !PyTuple_Check(ranks) && !PyList_Check(ranks)) goto bad;
        Py_ssize_t nq = ranks ? PySequence_Fast_GET_SIZE(ranks) : 1;
        for (Py_ssize_t k = 0; k < nq; k++) {
            PyObject *q = ranks ? PySequence_Fast_GET_ITEM(ranks, k) : rank;
            if (keep != Py_None) {
                int in = PySet_Contains(keep, q);
                if (in < 0) goto fail;
                if (!in) continue;
            }
            int same = q == rank;
            if (!same) {
                same = PyObject_RichCompareBool(q, rank, Py_EQ);
                if (same < 0) goto fail;
            }
            if (is_record) {
                if (same) {
                    if (PyList_Append(out, x)) goto fail;
                    continue;
                }
                PyObject *r = cls->tp_alloc(cls, 7);       /* x._replace(rank=q) */
                if (!r) goto fail;
                for (int f = 0; f < 7; f++) PyTuple_SET_ITEM(r, f, Py_NewRef(f == R_RANK ? q : PyTuple_GET_ITEM(x, f)));
                if (add_new(out, r)) goto fail;
                continue;
            }
            PyObject *parts = PyTuple_GET_ITEM(run, 1);
            for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(parts); j++) {
                PyObject *p = PyTuple_GET_ITEM(parts, j);
                long long a, b, at;
                if (!PyTuple_Check(p) || PyTuple_GET_SIZE(p) != 6) goto bad;
                PyObject *stream = PyTuple_GET_ITEM(p, 0), *name = PyTuple_GET_ITEM(p, 1);
                if (stream != Py_None) {              /* (stream, name, cat, start offset, end offset, value) */
                    if (get_t(PyTuple_GET_ITEM(p, 3), &a) || get_t(PyTuple_GET_ITEM(p, 4), &b)) goto give_up;
                    if (add_new(out, new_record(cls, q, stream, Py_NewRef(name), PyTuple_GET_ITEM(p, 2), start + a,
                                                start + b, PyTuple_GET_ITEM(p, 5))))
                        goto fail;
                    continue;
                }
                /* a Block's: (None, its template's run, its offset, mb, ...) */
                PyObject *mb = PyTuple_GET_ITEM(p, 3), *pre = name, *pparts;
                if (get_t(PyTuple_GET_ITEM(p, 2), &at)) goto give_up;
                at += start;
                if (at <= -(1LL << 62) || at >= (1LL << 62)) goto give_up;      /* (the sums below) */
                if (!PyTuple_Check(pre) || PyTuple_GET_SIZE(pre) < 2 || !PyTuple_Check(pparts = PyTuple_GET_ITEM(pre, 1)))
                    goto bad;
                for (Py_ssize_t m = 0; m < PyTuple_GET_SIZE(pparts); m++) {
                    PyObject *pp = PyTuple_GET_ITEM(pparts, m), *nm;
                    if (!PyTuple_Check(pp) || PyTuple_GET_SIZE(pp) != 6) goto bad;
                    if (get_t(PyTuple_GET_ITEM(pp, 3), &a) || get_t(PyTuple_GET_ITEM(pp, 4), &b)) goto give_up;
                    nm = PyTuple_GET_ITEM(pp, 1);
                    if (PyUnicode_CheckExact(nm)) nm = Py_NewRef(nm);
                    else if (PyUnicode_CheckExact(mb)) nm = PyUnicode_Join(mb, nm);    /* mb.join(name) */
                    else nm = PyObject_CallFunctionObjArgs(join, nm, mb, NULL);
                    if (!nm) goto fail;
                    if (add_new(out, new_record(cls, q, PyTuple_GET_ITEM(pp, 0), nm, PyTuple_GET_ITEM(pp, 2), at + a,
                                                at + b, PyTuple_GET_ITEM(pp, 5))))
                        goto fail;
                }
            }
        }
    }
    return out;
give_up:
    gave_up = 1;
    goto fail;
bad:
    PyErr_SetString(PyExc_TypeError, "make_records: not an engine log entry");
fail:
    Py_XDECREF(out);
    if (gave_up && !PyErr_Occurred()) Py_RETURN_NONE;
    return NULL;
}

/* ---- the engine's busy intervals (sim.engine.core.Engine.busy_intervals) ---- */

typedef struct {
    long long *v;
    Py_ssize_t n, cap;
} I64s;                                        /* a growing array of int64 */

static int i64_add(I64s *a, long long x) {
    if (a->n == a->cap) {
        Py_ssize_t cap = a->cap ? 2 * a->cap : 256;
        long long *v = PyMem_Realloc(a->v, sizeof(long long) * (size_t)cap);
        if (!v) {
            PyErr_NoMemory();
            return -1;
        }
        a->v = v;
        a->cap = cap;
    }
    a->v[a->n++] = x;
    return 0;
}

typedef struct {
    PyObject *index;                           /* rank -> its position in `lists` (first seen first) */
    I64s *lists;                               /* 4 per rank: kernel starts, ends, comm starts, ends */
    Py_ssize_t n, cap;
} Busy;

/* The 4 arrays of `rank`, made when first asked for; NULL with an error */
static I64s *busy_of(Busy *b, PyObject *rank) {
    PyObject *at = PyDict_GetItemWithError(b->index, rank);
    if (at) return &b->lists[4 * PyLong_AsSsize_t(at)];
    if (PyErr_Occurred()) return NULL;
    if (b->n == b->cap) {
        Py_ssize_t cap = b->cap ? 2 * b->cap : 64;
        I64s *l = PyMem_Realloc(b->lists, sizeof(I64s) * 4 * (size_t)cap);
        if (!l) {
            PyErr_NoMemory();
            return NULL;
        }
        memset(l + 4 * b->cap, 0, sizeof(I64s) * 4 * (size_t)(cap - b->cap));
        b->lists = l;
        b->cap = cap;
    }
    PyObject *i = PyLong_FromSsize_t(b->n);
    int bad = !i || PyDict_SetItem(b->index, rank, i) < 0;
    Py_XDECREF(i);
    if (bad) return NULL;
    return &b->lists[4 * b->n++];
}

/* busy_intervals(log, record_type) -> {rank: (kernel starts, kernel ends, comm starts, comm
 * ends)} as native int64 bytes, or None: Engine.busy_intervals_py before its symmetry step (the
 * same values in the same order, as arrays instead of lists of ints): the log's Records as
 * metrics.intervals_by_rank counts them (marks left out; kernels the compute stream's records
 * not of a "comm:" category, the rest communication), then each run's merged intervals (its
 * `busy`, field 5) placed at its start. None where a time is not a 64-bit integer (the Python
 * runs). */
static PyObject *busy_intervals(PyObject *self, PyObject *args) {
    PyObject *log, *out = NULL, *prefix = NULL;
    PyTypeObject *cls;
    int gave_up = 0;
    Busy b = {NULL, NULL, 0, 0};
    if (!PyArg_ParseTuple(args, "O!O!", &PyList_Type, &log, &PyType_Type, &cls)) return NULL;
    b.index = PyDict_New();
    prefix = PyUnicode_FromString("comm:");
    if (!b.index || !prefix) goto fail;
    Py_ssize_t n = PyList_GET_SIZE(log);
    for (int pass = 0; pass < 2; pass++) {
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *x = PyList_GET_ITEM(log, i);
            I64s *l;
            long long s, e;
            int is_record = Py_IS_TYPE(x, cls);
            if (!PyTuple_Check(x) || PyTuple_GET_SIZE(x) < (is_record ? 7 : 3)) goto bad;
            if (is_record != (pass == 0)) continue;
            if (is_record) {
                PyObject *stream = PyTuple_GET_ITEM(x, R_STREAM), *cat = PyTuple_GET_ITEM(x, R_CAT);
                if (!PyUnicode_Check(stream) || !PyUnicode_Check(cat)) goto bad;
                if (PyUnicode_CompareWithASCIIString(stream, "mark") == 0) continue;
                int kernel = PyUnicode_CompareWithASCIIString(stream, "compute") == 0;
                if (kernel) {
                    Py_ssize_t comm = PyUnicode_Tailmatch(cat, prefix, 0, PY_SSIZE_T_MAX, -1);
                    if (comm < 0) goto fail;
                    kernel = !comm;
                }
                if (get_t(PyTuple_GET_ITEM(x, R_START), &s) || get_t(PyTuple_GET_ITEM(x, R_END), &e)) goto give_up;
                if (!(l = busy_of(&b, PyTuple_GET_ITEM(x, R_RANK)))) goto fail;
                if (i64_add(&l[kernel ? 0 : 2], s) || i64_add(&l[kernel ? 1 : 3], e)) goto fail;
                continue;
            }
            PyObject *run = PyTuple_GET_ITEM(x, 2), *busy;
            long long start;
            if (!PyTuple_Check(run) || PyTuple_GET_SIZE(run) < 6) goto bad;
            busy = PyTuple_GET_ITEM(run, 5);
            if (busy == Py_None) continue;
            if (!PyTuple_Check(busy) || PyTuple_GET_SIZE(busy) != 2) goto bad;
            if (get_t(PyTuple_GET_ITEM(x, 1), &start)) goto give_up;
            if (!(l = busy_of(&b, PyTuple_GET_ITEM(x, 0)))) goto fail;
            for (int kind = 0; kind < 2; kind++) {          /* kernels, then communication */
                PyObject *ivs = PyTuple_GET_ITEM(busy, kind);
                if (!PyTuple_Check(ivs) && !PyList_Check(ivs)) goto bad;
                for (Py_ssize_t k = 0; k < PySequence_Fast_GET_SIZE(ivs); k++) {
                    PyObject *iv = PySequence_Fast_GET_ITEM(ivs, k);
                    if (!PyTuple_Check(iv) || PyTuple_GET_SIZE(iv) != 2) goto bad;
                    if (get_t(PyTuple_GET_ITEM(iv, 0), &s) || get_t(PyTuple_GET_ITEM(iv, 1), &e)) goto give_up;
                    if (i64_add(&l[2 * kind], start + s) || i64_add(&l[2 * kind + 1], start + e)) goto fail;
                }
            }
        }
    }
    out = PyDict_New();
    if (!out) goto fail;
    {
        PyObject *rank, *at;
        Py_ssize_t pos = 0;
        while (PyDict_Next(b.index, &pos, &rank, &at)) {
            I64s *l = &b.lists[4 * PyLong_AsSsize_t(at)];
            PyObject *t = PyTuple_New(4);
            if (!t) goto fail;
            for (int k = 0; k < 4; k++) {
                PyObject *v = PyBytes_FromStringAndSize((const char *)l[k].v, (Py_ssize_t)sizeof(long long) * l[k].n);
                if (!v) {
                    Py_DECREF(t);
                    goto fail;
                }
                PyTuple_SET_ITEM(t, k, v);
            }
            int bad = PyDict_SetItem(out, rank, t) < 0;
            Py_DECREF(t);
            if (bad) goto fail;
        }
    }
    goto done;
give_up:
    gave_up = 1;
    goto fail;
bad:
    PyErr_SetString(PyExc_TypeError, "busy_intervals: not an engine log entry");
fail:
    Py_CLEAR(out);
done:
    for (Py_ssize_t k = 0; k < 4 * b.n; k++) PyMem_Free(b.lists[k].v);
    PyMem_Free(b.lists);
    Py_XDECREF(b.index);
    Py_XDECREF(prefix);
    if (!out && gave_up && !PyErr_Occurred()) Py_RETURN_NONE;
    return out;
}

/* keep_freed_memory(mmap_threshold, trim_threshold) -> bool: glibc's malloc told (mallopt(3))
 * to serve blocks below `mmap_threshold` bytes from its heap and to keep up to `trim_threshold`
 * bytes freed at its top, instead of giving each large block back to the system when it is freed
 * and taking fresh pages, each faulted in again, for the next (what the output writers did for
 * every Kineto rank's 15 MB text on the 1T row). False where this is not glibc or it refused. */
static PyObject *keep_freed_memory(PyObject *self, PyObject *args) {
    int mmap_threshold, trim_threshold;
    if (!PyArg_ParseTuple(args, "ii", &mmap_threshold, &trim_threshold)) return NULL;
#if defined(__GLIBC__)
    return PyBool_FromLong(mallopt(M_MMAP_THRESHOLD, mmap_threshold) == 1
                           && mallopt(M_TRIM_THRESHOLD, trim_threshold) == 1);
#else
    Py_RETURN_FALSE;
#endif
}

static PyMethodDef methods[] = {
    {"keep_freed_memory", keep_freed_memory, METH_VARARGS, "glibc's malloc keeps freed memory (mallopt)."},
    {"chrome_events", chrome_events, METH_VARARGS, "The Chrome trace's complete events as one text."},
    {"timeline_rows", timeline_rows, METH_VARARGS, "timeline.csv's rows as one text."},
    {"name_key", name_key, METH_O, "sim.engine.slice_args.name_key_py, compiled."},
    {"slice_texts", slice_texts, METH_VARARGS, "sim.engine.slice_args.SliceArgs.texts's loop."},
    {"chart_runs", chart_runs, METH_VARARGS, "sim.engine.outputs.chart_boxes' loop."},
    {"kernel_kinds", kernel_kinds, METH_VARARGS, "sim.engine.kineto._Kinds.of of each record."},
    {"busy_intervals", busy_intervals, METH_VARARGS, "sim.engine.core.Engine.busy_intervals_py, compiled."},
    {"make_records", make_records, METH_VARARGS, "sim.engine.core.Engine._make_records, compiled."},
    {"rank_order", rank_order, METH_O, "sim.engine.kineto's records of a rank in order."},
    {"chart_lane", chart_lane, METH_O, "sim.engine.outputs._lane_py, compiled."},
    {"trace_shown", trace_shown, METH_O, "sim.engine.outputs._trace_head_py's shown records, compiled."},
    {"flow_events", flow_events, METH_VARARGS, "The Chrome trace's pipeline arrows as one text."},
    {"counter_events", counter_events, METH_VARARGS, "A counter track's events as one text."},
    {"group_by_rank", group_by_rank, METH_VARARGS, "Records appended to their rank's list."},
    {"flow_ends", flow_ends, METH_VARARGS, "sim.engine.outputs._flow_ends_py's search, compiled."},
    {"sort_records", sort_records, METH_VARARGS, "Records sorted by some of their fields, stably."},
    {"host_plan", host_plan, METH_VARARGS, "sim.engine.kineto's host items, placed, as a plan."},
    {"plan_items", plan_items, METH_VARARGS, "A plan's items as sim.engine.kineto._Items."},
    {"nccl_extras", nccl_extras, METH_VARARGS, "sim.engine.kineto._details' NCCL args texts."},
    {"plan_events", plan_events, METH_VARARGS, "sim.engine.kineto._host_and_gpu_py's events of a plan."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_textout", NULL, -1, methods};

PyMODINIT_FUNC PyInit__textout(void) { return PyModule_Create(&module); }
