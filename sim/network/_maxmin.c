/* Max-min fair rates by progressive filling, compiled: sim.network.flow's numpy filling
 * (`_fill_numpy`) with the same IEEE double operations on each link's numbers in the same order,
 * so the rates and the iteration count are equal bit for bit (tests/test_maxmin_kernel.py
 * compares them on random problems). Built by hatch_build.py where a C compiler is present;
 * without it sim.network.flow runs the numpy filling.
 *
 * The numpy filling recomputes every link's saturation level at each iteration; this one
 * recomputes those of the links a newly frozen flow crosses and keeps the rest in a heap:
 * O(entries x log links) per problem instead of O(iterations x entries).
 *
 * Compiled without floating-point contraction (-ffp-contract=off): `used + level * k` fused
 * into one multiply-add would round once where numpy rounds twice. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* The network's link ids -> local numbers 0..L-1, -1 between calls (only entries a call set are
 * reset): kept, as a fresh array per call costs its initialisation on a 16,384-GPU graph. */
static int32_t *slot = NULL;
static Py_ssize_t slot_size = 0;

/* Scratch memory kept between calls (0: the fill's, 1: its caller's): a problem of thousands of
 * entries needs a few hundred kB, which malloc would map and unmap at every call (page faults
 * were half of a 3,000-entry fill). The module runs with the GIL held: one call at a time. */
static void *arena[2] = {NULL, NULL};
static size_t arena_size[2] = {0, 0};

static void *scratch(int which, size_t bytes) {
    if (bytes > arena_size[which]) {
        void *p = realloc(arena[which], bytes);
        if (!p) return NULL;
        arena[which] = p;
        arena_size[which] = bytes;
    }
    return arena[which];
}

static int ensure_slots(Py_ssize_t E) {
    if (E <= slot_size) return 0;
    int32_t *s = (int32_t *)realloc(slot, (size_t)E * sizeof(int32_t));
    if (!s) return -1;
    for (Py_ssize_t i = slot_size; i < E; i++) s[i] = -1;
    slot = s;
    slot_size = E;
    return 0;
}

/* A 4-ary min-heap of (key, link) entries (fewer levels than a binary one, the four children of
 * an entry side by side in memory). A link's entry may be stale: its key lower than the link's
 * saturation level now (freezing flows below a link's level raises it), fixed when it reaches
 * the top; a level that falls (by rounding) gets a new entry. Which of equal keys comes first
 * does not matter: an iteration takes every link within 1e-12 of the lowest. */
typedef struct { double key; int64_t link; } HEnt;
typedef struct { HEnt *e; Py_ssize_t size; } Heap;

static void heap_push(Heap *q, double x, int64_t l) {
    HEnt *e = q->e;
    Py_ssize_t i = q->size++;
    while (i > 0) {
        Py_ssize_t p = (i - 1) / 4;
        if (!(x < e[p].key)) break;
        e[i] = e[p];
        i = p;
    }
    e[i].key = x;
    e[i].link = l;
}

/* Put (x, l) at place i or below it (the entries below i in order). */
static void sift_down(Heap *q, Py_ssize_t i, double x, int64_t l) {
    HEnt *e = q->e;
    const Py_ssize_t n = q->size;
    for (;;) {
        Py_ssize_t c = 4 * i + 1;
        if (c >= n) break;
        Py_ssize_t end = c + 4 < n ? c + 4 : n, b = c;
        double bk = e[c].key;
        for (Py_ssize_t k = c + 1; k < end; k++)
            if (e[k].key < bk) { bk = e[k].key; b = k; }
        if (!(bk < x)) break;
        e[i] = e[b];
        i = b;
    }
    e[i].key = x;
    e[i].link = l;
}

static void heap_pop(Heap *q) {
    Py_ssize_t n = --q->size;
    if (n) sift_down(q, 0, q->e[n].key, q->e[n].link);
}

/* The filling on numbered links: cap[L] each link's capacity; flow f's entries are the links
 * ae[fstart[f] .. fstart[f + 1]); *level_io the start level (then the last level). Sets rate[f] for
 * every flow with an entry; returns the iterations, or -1 on no memory; *froze_all = 0 where an
 * iteration froze no flow (a NaN capacity).
 *
 * Each link keeps what its frozen flows take (used) and how many unfrozen flows it carries (cnt);
 * its saturation level (cap - used) / cnt changes only when one of its flows freezes. An
 * iteration takes the lowest (the first by a scan of the entries, the next ones from a heap),
 * freezes the flows on every link within 1e-12 of it, and updates the links those flows cross:
 * O(entries x log links) in all. */
static long long fill_core(Py_ssize_t L, const double *cap, const int64_t *ae, const int64_t *fstart,
                           Py_ssize_t F, double *level_io, double *rate, int *froze_all) {
    /* int64: lstart[L+1] lflow[n] cnt[L] kcnt[L] sat[L] touched[L]; double: used[L] satl[L];
     * (double, int64): heap[L+n]; char: frozen[F] insat[L] */
    const Py_ssize_t n = fstart[F];
    const int64_t *flink = ae;
    size_t words = (size_t)L * 9 + (size_t)n * 3 + 1;
    void *mem = scratch(0, words * 8 + (size_t)F + (size_t)L + 1);
    if (!mem) return -1;
    int64_t *lstart = (int64_t *)mem, *lflow = lstart + L + 1, *cnt = lflow + n, *kcnt = cnt + L;
    int64_t *sat = kcnt + L, *touched = sat + L;
    double *used = (double *)(touched + L), *satl = used + L;
    HEnt *heap = (HEnt *)(satl + L);
    char *frozen = (char *)(heap + L + n), *insat = frozen + F;

    /* the first iteration on the entries as they come (one iteration is often all: a
     * collective's equal flows); the links' lists and a heap only where more follow */
    double level = *level_io;
    long long it = 1;
    *froze_all = 1;
    int nan = 0;
    for (Py_ssize_t l = 0; l < L; l++) cnt[l] = kcnt[l] = 0;
    for (Py_ssize_t j = 0; j < n; j++) cnt[ae[j]]++;
    double m = INFINITY;
    for (Py_ssize_t l = 0; l < L; l++) {
        used[l] = 0.0;
        satl[l] = cnt[l] ? (cap[l] - 0.0) / (double)cnt[l] : INFINITY;
        if (satl[l] != satl[l]) nan = 1;
        else if (cnt[l] && satl[l] < m) m = satl[l];
    }
    if (nan || !n) { *froze_all = !n; return n ? it : 0; }           /* numpy's min: NaN */
    if (m > level) level = m;
    double thr = m + fabs(m) * 1e-12;                                 /* (m < 0 below a start level) */
    for (Py_ssize_t l = 0; l < L; l++) insat[l] = cnt[l] && satl[l] <= thr;
    Py_ssize_t remaining = 0;
    for (Py_ssize_t f = 0; f < F; f++) {
        char z = 0;
        for (int64_t j = fstart[f]; j < fstart[f + 1]; j++) z |= insat[ae[j]];
        frozen[f] = z;
        if (z) {
            rate[f] = level;
            for (int64_t j = fstart[f]; j < fstart[f + 1]; j++) kcnt[ae[j]]++;
        } else {
            remaining += fstart[f + 1] - fstart[f];
        }
    }
    for (Py_ssize_t l = 0; l < L; l++) {
        insat[l] = 0;
        if (!kcnt[l]) continue;
        cnt[l] -= kcnt[l];
        used[l] = used[l] + level * (double)kcnt[l];
        kcnt[l] = 0;
        satl[l] = cnt[l] > 0 ? (cap[l] - used[l]) / (double)cnt[l] : INFINITY;
        if (satl[l] != satl[l]) nan = 1;
    }
    if (!remaining) { *level_io = level; return it; }

    /* each link's unfrozen flows, by counting sort */
    for (Py_ssize_t l = 0; l <= L; l++) lstart[l] = 0;
    for (Py_ssize_t f = 0; f < F; f++)
        if (!frozen[f])
            for (int64_t j = fstart[f]; j < fstart[f + 1]; j++) lstart[ae[j] + 1]++;
    for (Py_ssize_t l = 0; l < L; l++) lstart[l + 1] += lstart[l];
    for (Py_ssize_t l = 0; l < L; l++) kcnt[l] = lstart[l];         /* (kcnt as a cursor) */
    for (Py_ssize_t f = 0; f < F; f++)
        if (!frozen[f])
            for (int64_t j = fstart[f]; j < fstart[f + 1]; j++) lflow[kcnt[ae[j]]++] = f;
    for (Py_ssize_t l = 0; l < L; l++) kcnt[l] = 0;

    Heap q = {heap, 0};
    for (Py_ssize_t l = 0; l < L; l++)
        if (cnt[l] > 0) { heap[q.size].key = satl[l]; heap[q.size++].link = l; }
    for (Py_ssize_t i = q.size / 4 + 1; i-- > 0;)
        if (i < q.size) sift_down(&q, i, heap[i].key, heap[i].link);
    while (remaining > 0) {
        it++;
        if (nan) { *froze_all = 0; break; }                           /* numpy's min: NaN */
        /* the lowest saturation level: drop the entries of links no unfrozen flow crosses,
         * move stale ones to their link's level now */
        while (q.size) {
            int64_t l = heap[0].link;
            double x = heap[0].key;
            if (!cnt[l] || x > satl[l]) heap_pop(&q);              /* (x > now: an older entry) */
            else if (x < satl[l]) sift_down(&q, 0, satl[l], l);   /* (its level now, larger) */
            else break;
        }
        if (!q.size) { *froze_all = 0; break; }
        m = heap[0].key;
        if (m > level) level = m;
        thr = m + fabs(m) * 1e-12;
        Py_ssize_t nsat = 0, nt = 0;
        while (q.size && heap[0].key <= thr) {
            int64_t l = heap[0].link;
            double x = heap[0].key;
            if (cnt[l] && !insat[l] && x < satl[l]) { sift_down(&q, 0, satl[l], l); continue; }
            heap_pop(&q);
            if (!cnt[l] || insat[l] || x > satl[l]) continue;
            insat[l] = 1;
            sat[nsat++] = l;
        }
        Py_ssize_t froze = 0;
        for (Py_ssize_t i = 0; i < nsat; i++) {
            int64_t l = sat[i];
            insat[l] = 0;
            for (int64_t j = lstart[l]; j < lstart[l + 1]; j++) {
                int64_t f = lflow[j];
                if (frozen[f]) continue;
                frozen[f] = 1;
                rate[f] = level;
                froze++;
                for (int64_t x = fstart[f]; x < fstart[f + 1]; x++) {
                    int64_t k = flink[x];
                    if (!kcnt[k]++) touched[nt++] = k;
                }
                remaining -= fstart[f + 1] - fstart[f];
            }
        }
        if (!froze) { *froze_all = 0; break; }
        for (Py_ssize_t i = 0; i < nt; i++) {
            int64_t k = touched[i];
            cnt[k] -= kcnt[k];
            used[k] = used[k] + level * (double)kcnt[k];
            kcnt[k] = 0;
            if (cnt[k] > 0) {
                double old = satl[k];
                satl[k] = (cap[k] - used[k]) / (double)cnt[k];
                if (satl[k] != satl[k]) nan = 1;
                else if (satl[k] < old) heap_push(&q, satl[k], k);
            } else {
                satl[k] = INFINITY;
            }
        }
    }
    *level_io = level;
    return it;
}

/* Number the links of entries edge_of[0..n) in order of first appearance: ae[j] the number of
 * entry j's link, links[l] the id of link l; returns L. (The fill's arithmetic is per link: the
 * numbering changes no result.) Leaves slot[] all -1. */
static Py_ssize_t number_links(const int64_t *edge_of, Py_ssize_t n, int64_t *ae, int64_t *links) {
    Py_ssize_t L = 0;
    for (Py_ssize_t j = 0; j < n; j++) {
        int64_t e = edge_of[j];
        if (slot[e] < 0) { slot[e] = (int32_t)L; links[L++] = e; }
        ae[j] = slot[e];
    }
    for (Py_ssize_t l = 0; l < L; l++) slot[links[l]] = -1;
    return L;
}

static int check_ids(const int64_t *ids, Py_ssize_t n, int64_t limit) {
    for (Py_ssize_t j = 0; j < n; j++)
        if (ids[j] < 0 || ids[j] >= limit) {
            PyErr_SetString(PyExc_ValueError, "_maxmin: a link or flow id out of range");
            return -1;
        }
    return 0;
}

/* fill(capacity, flow_of, edge_of, n_flows, start_level, caps, rate) -> (iterations, level, froze)
 * capacity: float64[E]; flow_of, edge_of: int64[n] (one entry per flow and link it crosses);
 * caps: float64[n_flows] each flow's cap (inf: none; a cap is a private link), or empty;
 * rate: writable float64[>= n_flows], set for every flow that has an entry (others untouched).
 * froze is False where an iteration froze no flow (a NaN capacity): the caller reports it. */
static PyObject *fill(PyObject *self, PyObject *args) {
    Py_buffer cb, fb, eb, kb, rb;
    Py_ssize_t F;
    double level;
    if (!PyArg_ParseTuple(args, "y*y*y*ndy*w*", &cb, &fb, &eb, &F, &level, &kb, &rb)) return NULL;
    PyObject *result = NULL;
    void *mem;
    const Py_ssize_t E = cb.len / 8, n = fb.len / 8;
    const double *capacity = (const double *)cb.buf, *caps = (const double *)kb.buf;
    const int64_t *edge_of = (const int64_t *)eb.buf, *flow_of = (const int64_t *)fb.buf;
    const int capped = kb.len > 0;
    if (eb.len != fb.len || F < 0 || rb.len < F * 8 || (capped && kb.len != F * 8)) {
        PyErr_SetString(PyExc_ValueError, "fill: flow_of and edge_of differ in length, or rate or caps "
                                          "do not have one number per flow");
        goto done;
    }
    if (check_ids(edge_of, n, E) || check_ids(flow_of, n, F)) goto done;
    if (ensure_slots(E) < 0) { PyErr_NoMemory(); goto done; }
    /* le, ae, links, cap: n+F each (cap: a link per distinct link and per capped flow); fstart F+1 */
    mem = scratch(1, (((size_t)n + (size_t)F) * 4 + (size_t)F + 1) * 8);
    if (!mem) { PyErr_NoMemory(); goto done; }
    int64_t *le = (int64_t *)mem, *ae = le + n + F, *links = ae + n + F, *fstart = links + n + F;
    double *cap = (double *)(fstart + F + 1);
    Py_ssize_t L = number_links(edge_of, n, le, links);
    for (Py_ssize_t l = 0; l < L; l++) cap[l] = capacity[links[l]];
    /* the entries grouped by flow (counting sort), a flow's cap (a private link) after its links */
    for (Py_ssize_t f = 0; f <= F; f++) fstart[f] = 0;
    for (Py_ssize_t j = 0; j < n; j++) fstart[flow_of[j] + 1]++;
    for (Py_ssize_t f = 0; f < F; f++)
        fstart[f + 1] += fstart[f] + (capped && isfinite(caps[f]));
    for (Py_ssize_t j = 0; j < n; j++) ae[fstart[flow_of[j]]++] = le[j];   /* (fstart: cursors) */
    for (Py_ssize_t f = 0; f < F; f++) {
        if (capped && isfinite(caps[f])) {
            cap[L] = caps[f];
            ae[fstart[f]++] = L++;
        }
    }
    for (Py_ssize_t f = F; f > 0; f--) fstart[f] = fstart[f - 1];        /* (cursors at ends: back) */
    fstart[0] = 0;
    int froze_all;
    long long it = fill_core(L, cap, ae, fstart, F, &level, (double *)rb.buf, &froze_all);
    if (it < 0) { PyErr_NoMemory(); goto done; }
    result = Py_BuildValue("LdO", it, level, froze_all ? Py_True : Py_False);
done:
    PyBuffer_Release(&cb);
    PyBuffer_Release(&fb);
    PyBuffer_Release(&eb);
    PyBuffer_Release(&kb);
    PyBuffer_Release(&rb);
    return result;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* resolve(capacity, inc_edge, lens, rate, caps, floor, out) -> (iterations, level, froze) or
 * None: sim.network.flow.FlowNetwork's partial re-solve after departures. Flows slower than
 * floor * (1 - 1e-12) keep their rate; the others are filled from `floor` on the capacity the
 * kept ones leave, each link's kept rates summed in ascending order (as numpy's lexsort then
 * bincount). inc_edge: int64, each flow's links end to end (lens[f] of them); rate, caps:
 * float64[F] (caps inf = none); out: writable float64[F], every flow's new rate. None (out
 * untouched) where no flow keeps its rate. */
static PyObject *resolve(PyObject *self, PyObject *args) {
    Py_buffer cb, eb, lb, rb, kb, ob;
    double floor_;
    if (!PyArg_ParseTuple(args, "y*y*y*y*y*dw*", &cb, &eb, &lb, &rb, &kb, &floor_, &ob)) return NULL;
    PyObject *result = NULL;
    void *mem;
    const Py_ssize_t E = cb.len / 8, n = eb.len / 8, F = lb.len / 8;
    const double *capacity = (const double *)cb.buf, *old = (const double *)rb.buf;
    const double *caps = (const double *)kb.buf;
    const int64_t *edge = (const int64_t *)eb.buf, *lens = (const int64_t *)lb.buf;
    double *out = (double *)ob.buf;
    if (rb.len != F * 8 || kb.len != F * 8 || ob.len != F * 8) {
        PyErr_SetString(PyExc_ValueError, "resolve: rate, caps and out must have one number per flow");
        goto done;
    }
    const double thr = floor_ * (1.0 - 1e-12);
    int64_t total = 0;
    Py_ssize_t n_sub = 0;
    for (Py_ssize_t f = 0; f < F; f++) {
        if (lens[f] < 0) { PyErr_SetString(PyExc_ValueError, "resolve: a negative path length"); goto done; }
        total += lens[f];
        n_sub += !(old[f] < thr);
    }
    if (total != n) { PyErr_SetString(PyExc_ValueError, "resolve: path lengths do not add up to the entries"); goto done; }
    if (n_sub == F) { result = Py_None; Py_INCREF(result); goto done; }
    if (ensure_slots(E) < 0) { PyErr_NoMemory(); goto done; }

    /* int64: ae[n+F] fstart[n+F] links[n+F] sub[F] kcnt[n+F+1] pl[n] (double) cap[n+F] kept[n]
     * pr[n] pcap[n+F] */
    size_t words = (size_t)(n + F) * 6 + (size_t)F + 1 + (size_t)n * 3 + 8;
    mem = scratch(1, words * 8);
    if (!mem) { PyErr_NoMemory(); goto done; }
    int64_t *ae = (int64_t *)mem, *fstart = ae + n + F, *links = fstart + n + F, *sub = links + n + F;
    int64_t *kcnt = sub + F, *pl = kcnt + n + F + 1;
    double *cap = (double *)(pl + n), *kept = cap + n + F, *pr = kept + n, *pcap = pr + n;

    /* the re-solved flows' entries grouped by flow (fstart), their links numbered (slot[]), a
     * flow's cap a private link after them (links[l] = -1, its capacity in pcap); sub[f] each
     * flow's new number */
    Py_ssize_t m = 0, L = 0, s = 0, p = 0;
    for (Py_ssize_t f = 0, j = 0; f < F; f++) {
        if (old[f] < thr) { sub[f] = -1; j += lens[f]; continue; }
        sub[f] = s;
        fstart[s++] = m;
        for (int64_t k = 0; k < lens[f]; k++, j++) {
            int64_t e = edge[j];
            if (e < 0 || e >= E) goto bad_id;
            if (slot[e] < 0) { slot[e] = (int32_t)L; links[L++] = e; }
            ae[m++] = slot[e];
        }
        if (isfinite(caps[f])) {
            pcap[L] = caps[f];
            links[L] = -1;
            ae[m++] = L++;
        }
    }
    fstart[s] = m;
    /* the kept flows' rates on those links (pl, pr), grouped by link (counting sort) */
    for (Py_ssize_t f = 0, j = 0; f < F; f++) {
        if (old[f] < thr)
            for (int64_t k = 0; k < lens[f]; k++) {
                int64_t e = edge[j + k];
                if (e < 0 || e >= E) goto bad_id;
                if (slot[e] >= 0) { pl[p] = slot[e]; pr[p++] = old[f]; }
            }
        j += lens[f];
    }
    for (Py_ssize_t l = 0; l <= L; l++) kcnt[l] = 0;
    for (Py_ssize_t i = 0; i < p; i++) kcnt[pl[i] + 1]++;
    for (Py_ssize_t l = 0; l < L; l++) kcnt[l + 1] += kcnt[l];
    {
        int64_t *cur = (int64_t *)cap;          /* (cursors: cap[] is free until written below) */
        for (Py_ssize_t l = 0; l < L; l++) cur[l] = kcnt[l];
        for (Py_ssize_t i = 0; i < p; i++) kept[cur[pl[i]]++] = pr[i];
    }
    for (Py_ssize_t l = 0; l < L; l++) {
        int64_t a = kcnt[l], b = kcnt[l + 1];
        if (b - a > 32) qsort(kept + a, (size_t)(b - a), sizeof(double), cmp_double);
        else
            for (int64_t i = a + 1; i < b; i++) {             /* (insertion sort: groups are small) */
                double x = kept[i];
                int64_t j = i;
                for (; j > a && kept[j - 1] > x; j--) kept[j] = kept[j - 1];
                kept[j] = x;
            }
        double used = 0.0;
        for (int64_t k = a; k < b; k++) used += kept[k];
        cap[l] = links[l] < 0 ? pcap[l] : capacity[links[l]] - used;
    }
    for (Py_ssize_t l = 0; l < L; l++)
        if (links[l] >= 0) slot[links[l]] = -1;
    double *rate_sub = kept;                    /* (free now; n entries, enough unless n_sub > n) */
    double *tmp = NULL;
    if (n_sub > n) {
        tmp = (double *)malloc((size_t)n_sub * 8);
        if (!tmp) { PyErr_NoMemory(); goto done; }
        rate_sub = tmp;
    }
    for (Py_ssize_t k = 0; k < n_sub; k++) rate_sub[k] = 0.0;
    double level = floor_;
    int froze_all;
    long long it = fill_core(L, cap, ae, fstart, n_sub, &level, rate_sub, &froze_all);
    if (it < 0) { free(tmp); PyErr_NoMemory(); goto done; }
    for (Py_ssize_t f = 0; f < F; f++) out[f] = sub[f] < 0 ? old[f] : rate_sub[sub[f]];
    free(tmp);
    result = Py_BuildValue("LdO", it, level, froze_all ? Py_True : Py_False);
    goto done;
bad_id:
    for (Py_ssize_t l = 0; l < L; l++)
        if (links[l] >= 0) slot[links[l]] = -1;
    PyErr_SetString(PyExc_ValueError, "_maxmin: a link or flow id out of range");
done:
    PyBuffer_Release(&cb);
    PyBuffer_Release(&eb);
    PyBuffer_Release(&lb);
    PyBuffer_Release(&rb);
    PyBuffer_Release(&kb);
    PyBuffer_Release(&ob);
    return result;
}

/* rebase(rem, t0, rate, old, now, limit, fin) -> the earliest end, or -1 - i for the first flow i
 * whose new end is not a number of ns below `limit` after now: FlowNetwork._finish_arrays' numpy
 * steps, one pass. For each flow whose rate changed (rate != old, or is not positive): rem = max(rem - old x (now -
 * t0), 0) (NaN stays, as np.maximum), t0 = now, fin = now + ceil(rem / rate - 1e-9); the others
 * keep theirs. */
static PyObject *rebase(PyObject *self, PyObject *args) {
    Py_buffer mb, tb, rb, ob, fb;
    long long now;
    double limit;
    if (!PyArg_ParseTuple(args, "w*w*y*y*Ldw*", &mb, &tb, &rb, &ob, &now, &limit, &fb)) return NULL;
    PyObject *result = NULL;
    const Py_ssize_t F = mb.len / 8;
    double *rem = (double *)mb.buf;
    int64_t *t0 = (int64_t *)tb.buf;
    const double *rate = (const double *)rb.buf, *old = (const double *)ob.buf;
    int64_t *fin = (int64_t *)fb.buf;
    if (tb.len != mb.len || rb.len != mb.len || ob.len != mb.len || fb.len != mb.len) {
        PyErr_SetString(PyExc_ValueError, "rebase: rem, t0, rate, old and fin must have one number per flow");
        goto done;
    }
    long long first = -1;
    for (Py_ssize_t i = 0; i < F; i++) {
        if (rate[i] != old[i] || !(rate[i] > 0.0)) {               /* (a zero or NaN rate: reported) */
            double r = rem[i] - old[i] * (double)(now - t0[i]);
            if (!(r >= 0.0 || r != r)) r = 0.0;                      /* np.maximum: NaN stays */
            double steps = ceil(r / rate[i] - 1e-9);
            if (!(steps < limit)) { first = -1 - (long long)i; break; }
            rem[i] = r;
            t0[i] = now;
            fin[i] = (int64_t)now + (int64_t)steps;
        }
        if (first < 0 || fin[i] < first) first = fin[i];
    }
    result = PyLong_FromLongLong(first);
done:
    PyBuffer_Release(&mb);
    PyBuffer_Release(&tb);
    PyBuffer_Release(&rb);
    PyBuffer_Release(&ob);
    PyBuffer_Release(&fb);
    return result;
}

/* keep_entries(inc_edge, lens, keep, out) -> count: the entries (links) of the flows kept
 * (keep: bool[F]) copied in order into out (int64, as long as inc_edge); FlowNetwork's removal of
 * ended flows without numpy's repeat of the mask over every entry. */
static PyObject *keep_entries(PyObject *self, PyObject *args) {
    Py_buffer eb, lb, kb, ob;
    if (!PyArg_ParseTuple(args, "y*y*y*w*", &eb, &lb, &kb, &ob)) return NULL;
    PyObject *result = NULL;
    const Py_ssize_t n = eb.len / 8, F = lb.len / 8;
    const int64_t *edge = (const int64_t *)eb.buf, *lens = (const int64_t *)lb.buf;
    const char *keep = (const char *)kb.buf;
    int64_t *out = (int64_t *)ob.buf;
    if (kb.len != F || ob.len < eb.len) {
        PyErr_SetString(PyExc_ValueError, "keep_entries: keep needs one byte per flow, out as many entries");
        goto done;
    }
    Py_ssize_t j = 0, w = 0, run = 0;        /* (copied a run of kept flows at a time) */
    for (Py_ssize_t f = 0; f < F; f++) {
        int64_t c = lens[f];
        if (c < 0 || c > n - j) {
            PyErr_SetString(PyExc_ValueError, "keep_entries: path lengths do not add up to the entries");
            goto done;
        }
        if (!keep[f]) {
            memcpy(out + w, edge + run, (size_t)(j - run) * 8);
            w += j - run;
            run = j + c;
        }
        j += c;
    }
    memcpy(out + w, edge + run, (size_t)(j - run) * 8);
    w += j - run;
    result = PyLong_FromSsize_t(w);
done:
    PyBuffer_Release(&eb);
    PyBuffer_Release(&lb);
    PyBuffer_Release(&kb);
    PyBuffer_Release(&ob);
    return result;
}

/* mark_live(inc_edge, lens, finish, now, mask): mask[e] = 1 for each entry e of the flows with
 * finish > now (int64[F]; mask: bool over the network's links, left as it was elsewhere): the
 * links the shared set's running flows hold (FlowNetwork._take_alone), in one pass instead of
 * numpy's repeat of the test over every entry, then the selection, then the scatter. */
static PyObject *mark_live(PyObject *self, PyObject *args) {
    Py_buffer eb, lb, fb, mb;
    long long now;
    if (!PyArg_ParseTuple(args, "y*y*y*Lw*", &eb, &lb, &fb, &now, &mb)) return NULL;
    PyObject *result = NULL;
    const Py_ssize_t n = eb.len / 8, F = lb.len / 8, L = mb.len;
    const int64_t *edge = (const int64_t *)eb.buf, *lens = (const int64_t *)lb.buf;
    const int64_t *finish = (const int64_t *)fb.buf;
    char *mask = (char *)mb.buf;
    if (fb.len != lb.len) {
        PyErr_SetString(PyExc_ValueError, "mark_live: one finish time per flow");
        goto done;
    }
    Py_ssize_t j = 0;
    for (Py_ssize_t f = 0; f < F; f++) {
        int64_t c = lens[f];
        if (c < 0 || c > n - j) {
            PyErr_SetString(PyExc_ValueError, "mark_live: path lengths do not add up to the entries");
            goto done;
        }
        if (finish[f] > now) {
            for (int64_t k = 0; k < c; k++) {
                int64_t e = edge[j + k];
                if (e < 0 || e >= L) {
                    PyErr_SetString(PyExc_ValueError, "mark_live: a link id outside the mask");
                    goto done;
                }
                mask[e] = 1;
            }
        }
        j += c;
    }
    Py_INCREF(Py_None);
    result = Py_None;
done:
    PyBuffer_Release(&eb);
    PyBuffer_Release(&lb);
    PyBuffer_Release(&fb);
    PyBuffer_Release(&mb);
    return result;
}

/* link_sums(edges int64[E], lens int64[F], rates f64[F], out f64[n]): out[e] += the rate of each
 * flow crossing e, the flows in order (out zeroed by the caller): the same additions in the
 * same order as np.bincount(edges, weights=np.repeat(rates, lens), minlength=n), so the same
 * floats (sim.network.link_load._shared_loads). */
static PyObject *link_sums(PyObject *self, PyObject *args) {
    Py_buffer eb, lb, rb, ob;
    if (!PyArg_ParseTuple(args, "y*y*y*w*", &eb, &lb, &rb, &ob)) return NULL;
    PyObject *result = NULL;
    const Py_ssize_t E = eb.len / 8, F = lb.len / 8, n = ob.len / 8;
    const int64_t *edge = (const int64_t *)eb.buf, *lens = (const int64_t *)lb.buf;
    const double *rate = (const double *)rb.buf;
    double *out = (double *)ob.buf;
    if (rb.len != lb.len) {
        PyErr_SetString(PyExc_ValueError, "link_sums: one rate per flow");
        goto done;
    }
    Py_ssize_t j = 0;
    for (Py_ssize_t f = 0; f < F; f++) {
        int64_t c = lens[f];
        if (c < 0 || c > E - j) {
            PyErr_SetString(PyExc_ValueError, "link_sums: path lengths do not add up to the entries");
            goto done;
        }
        for (int64_t k = 0; k < c; k++, j++) {
            int64_t e = edge[j];
            if (e < 0 || e >= n) {
                PyErr_SetString(PyExc_ValueError, "link_sums: an edge id out of range");
                goto done;
            }
            out[e] += rate[f];
        }
    }
    if (j != E) {
        PyErr_SetString(PyExc_ValueError, "link_sums: path lengths do not add up to the entries");
        goto done;
    }
    result = Py_None;
    Py_INCREF(result);
done:
    PyBuffer_Release(&eb);
    PyBuffer_Release(&lb);
    PyBuffer_Release(&rb);
    PyBuffer_Release(&ob);
    return result;
}

static PyMethodDef methods[] = {
    {"fill", fill, METH_VARARGS, "Max-min fair rates by progressive filling (see sim.network.flow)."},
    {"rebase", rebase, METH_VARARGS, "The end of each flow whose rate changed (see FlowNetwork._finish_arrays)."},
    {"keep_entries", keep_entries, METH_VARARGS, "The entries of the flows kept (see FlowNetwork._complete)."},
    {"resolve", resolve, METH_VARARGS, "FlowNetwork's partial re-solve after departures (see sim.network.flow)."},
    {"mark_live", mark_live, METH_VARARGS, "The links of the flows still running (see FlowNetwork._take_alone)."},
    {"link_sums", link_sums, METH_VARARGS, "Each link's flows' rates summed in order (see sim.network.link_load)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_maxmin", NULL, -1, methods};

PyMODINIT_FUNC PyInit__maxmin(void) { return PyModule_Create(&module); }
