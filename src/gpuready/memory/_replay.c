/* gpuready: the caching-allocator replay of memory/allocator.py (`_replay_one_stream`), compiled.
 *
 * The same rules, step for step, as the Python loop it replaces (memory/allocator.py's docstrings give them and
 * their sources in PyTorch's CUDACachingAllocator.cpp); memory/native.py compiles this file on first use and
 * falls back to the Python loop where it cannot. tests/memory/test_native.py checks the two give the same stats.
 *
 * Blocks are kept as PyTorch keeps them: each is a piece of a segment with links to its neighbours in the segment;
 * the cached free blocks of each pool are found in PyTorch's BlockPool order (size, then address) through buckets of
 * one size each (below). A segment's
 * first block keeps its slot for the segment's life (a freed block merges into the free block before it, which
 * absorbs it, or absorbs the free block after it), so a segment is wholly free when its first block is free and has
 * no neighbour.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define MIN_BLOCK 512LL
#define SMALL_SIZE (1LL << 20)
#define SMALL_BUFFER (2LL << 20)
#define LARGE_BUFFER (20LL << 20)
#define MIN_LARGE_ALLOC (10LL << 20)
#define ROUND_LARGE (2LL << 20)
#define SMALL_BASE (1LL << 48)

enum { OK = 0, ERR_TWICE = 1, ERR_ID = 2, ERR_NOMEM = 3 };

typedef struct {
    int64_t addr, size;
    int32_t prev, next; /* neighbours in the segment, -1 for none */
    int32_t handle;     /* the allocation id it holds while allocated */
    int8_t allocated, small;
} Block;

/* A pool's cached free blocks, found without a search in the common case: the blocks of each exact size sit in a
 * bucket in address order, a hash finds a size's bucket, and the sizes that have blocks are kept in ascending order.
 * The best fit in PyTorch's BlockPool order (size, then address) is then the first block of the request's own size
 * when it has one, else the first block of the next larger size present. */
typedef struct {
    int32_t *e; /* block slots of one size, by address */
    int64_t n, cap;
} Bucket;

typedef struct {
    Bucket *bk;       /* buckets, one per size ever cached; kept (empty) when their last block leaves */
    int64_t *bsize;   /* each bucket's size */
    int64_t nbk, capbk;
    int64_t *hkey;    /* open addressing: size -> bucket; 0 marks an empty slot (every size is >= 512) */
    int32_t *hval;
    int64_t hcap;     /* a power of two */
    int64_t *sz;      /* the sizes with at least one cached block, ascending */
    int64_t nsz, capsz;
} Pool;

static int grow(void **p, int64_t *cap, int64_t need, size_t item) {
    if (need <= *cap) return 1;
    int64_t c = *cap ? *cap : 64;
    while (c < need) c *= 2;
    void *q = realloc(*p, (size_t)c * item);
    if (!q) return 0;
    *p = q;
    *cap = c;
    return 1;
}

/* moves for the short arrays of a pool (a loop beats a memmove call at these lengths) */
static inline void move32(int32_t *dst, const int32_t *src, int64_t n) {
    int64_t i;
    if (dst < src)
        for (i = 0; i < n; i++) dst[i] = src[i];
    else
        for (i = n - 1; i >= 0; i--) dst[i] = src[i];
}

static inline void move64(int64_t *dst, const int64_t *src, int64_t n) {
    int64_t i;
    if (dst < src)
        for (i = 0; i < n; i++) dst[i] = src[i];
    else
        for (i = n - 1; i >= 0; i--) dst[i] = src[i];
}

static inline uint64_t hash_of(int64_t size, int64_t hcap) {
    return ((uint64_t)(size >> 9) * 0x9E3779B97F4A7C15ULL) >> 24 & (uint64_t)(hcap - 1); /* hcap <= 2^40 */
}

/* the bucket of `size`, -1 when the pool never cached that size */
static inline int32_t bucket_find(const Pool *p, int64_t size) {
    if (!p->hcap) return -1;
    uint64_t h = hash_of(size, p->hcap);
    for (;;) {
        int64_t k = p->hkey[h];
        if (k == size) return p->hval[h];
        if (k == 0) return -1;
        h = (h + 1) & (uint64_t)(p->hcap - 1);
    }
}

static int hash_put(int64_t *keys, int32_t *vals, int64_t hcap, int64_t size, int32_t v) {
    uint64_t h = hash_of(size, hcap);
    while (keys[h]) h = (h + 1) & (uint64_t)(hcap - 1);
    keys[h] = size;
    vals[h] = v;
    return 1;
}

/* the bucket of `size`, made when there is none (-2: out of memory) */
static int32_t bucket_make(Pool *p, int64_t size) {
    int32_t found = bucket_find(p, size);
    if (found >= 0) return found;
    if (2 * (p->nbk + 1) > p->hcap) { /* keep the table at most half full */
        int64_t nc = p->hcap ? 2 * p->hcap : 256, i;
        int64_t *keys = calloc((size_t)nc, sizeof(int64_t));
        int32_t *vals = malloc((size_t)nc * sizeof(int32_t));
        if (!keys || !vals) { free(keys); free(vals); return -2; }
        for (i = 0; i < p->hcap; i++)
            if (p->hkey[i]) hash_put(keys, vals, nc, p->hkey[i], p->hval[i]);
        free(p->hkey);
        free(p->hval);
        p->hkey = keys;
        p->hval = vals;
        p->hcap = nc;
    }
    if (p->nbk + 1 > p->capbk) {
        int64_t c1 = p->capbk, c2 = p->capbk;
        if (!grow((void **)&p->bk, &c1, p->nbk + 1, sizeof(Bucket))) return -2;
        if (!grow((void **)&p->bsize, &c2, p->nbk + 1, sizeof(int64_t))) return -2;
        p->capbk = c1;
    }
    int32_t b = (int32_t)p->nbk++;
    p->bk[b].e = NULL;
    p->bk[b].n = p->bk[b].cap = 0;
    p->bsize[b] = size;
    hash_put(p->hkey, p->hval, p->hcap, size, b);
    return b;
}

/* the first position in the ascending sizes whose size is >= size */
static inline int64_t size_lower(const Pool *p, int64_t size) {
    int64_t lo = 0, hi = p->nsz;
    while (lo < hi) {
        int64_t mid = (lo + hi) >> 1;
        if (p->sz[mid] < size)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* the first position in a bucket whose block's address is >= addr */
static inline int64_t addr_lower(const Bucket *k, const Block *b, int64_t addr) {
    int64_t lo = 0, hi = k->n;
    while (lo < hi) {
        int64_t mid = (lo + hi) >> 1;
        if (b[k->e[mid]].addr < addr)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static inline int pool_add(Pool *p, const Block *b, int32_t blk) {
    int64_t size = b[blk].size;
    int32_t bi = bucket_make(p, size);
    if (bi < 0) return 0;
    Bucket *k = &p->bk[bi];
    if (!grow((void **)&k->e, &k->cap, k->n + 1, sizeof(int32_t))) return 0;
    int64_t i = k->n && b[k->e[k->n - 1]].addr < b[blk].addr ? k->n : addr_lower(k, b, b[blk].addr);
    move32(&k->e[i + 1], &k->e[i], k->n - i);
    k->e[i] = blk;
    if (k->n++ == 0) { /* the size is new to the pool's ascending sizes */
        if (!grow((void **)&p->sz, &p->capsz, p->nsz + 1, sizeof(int64_t))) return 0;
        int64_t j = size_lower(p, size);
        move64(&p->sz[j + 1], &p->sz[j], p->nsz - j);
        p->sz[j] = size;
        p->nsz++;
    }
    return 1;
}

/* take position i of bucket bi out of the pool */
static inline void pool_take(Pool *p, int32_t bi, int64_t i) {
    Bucket *k = &p->bk[bi];
    move32(&k->e[i], &k->e[i + 1], k->n - i - 1);
    if (--k->n == 0) { /* the size leaves the pool's ascending sizes */
        int64_t j = size_lower(p, p->bsize[bi]);
        move64(&p->sz[j], &p->sz[j + 1], p->nsz - j - 1);
        p->nsz--;
    }
}

/* (a block's size and address must be those it was added with) */
static inline void pool_remove(Pool *p, const Block *b, int32_t blk) {
    int32_t bi = bucket_find(p, b[blk].size);
    pool_take(p, bi, addr_lower(&p->bk[bi], b, b[blk].addr));
}

/* the best-fitting cached block for `size` (its bucket in *bucket), -1 when none is large enough */
static inline int32_t pool_best(const Pool *p, int64_t size, int32_t *bucket) {
    int32_t bi = bucket_find(p, size);
    if (bi < 0 || p->bk[bi].n == 0) {
        int64_t j = size_lower(p, size);
        if (j >= p->nsz) return -1;
        bi = bucket_find(p, p->sz[j]);
    }
    *bucket = bi;
    return p->bk[bi].e[0];
}

static void pool_free(Pool *p) {
    int64_t i;
    for (i = 0; i < p->nbk; i++) free(p->bk[i].e);
    free(p->bk);
    free(p->bsize);
    free(p->hkey);
    free(p->hval);
    free(p->sz);
}

typedef struct {
    Block *b;
    int64_t n, cap;
    int32_t *spare; /* recycled slots */
    int64_t nspare, capspare;
} Blocks;

static int32_t new_block(Blocks *bs) {
    if (bs->nspare) return bs->spare[--bs->nspare];
    if (!grow((void **)&bs->b, &bs->cap, bs->n + 1, sizeof(Block))) return -1;
    return (int32_t)bs->n++;
}

static int drop_block(Blocks *bs, int32_t i) {
    if (!grow((void **)&bs->spare, &bs->capspare, bs->nspare + 1, sizeof(int32_t))) return 0;
    bs->spare[bs->nspare++] = i;
    return 1;
}

/* every wholly free segment (its first block free, with no neighbour) back to the device: PyTorch's
 * release_cached_blocks; heads keeps the segments that stay */
static int release_cached(Pool *pools, Blocks *bs, int32_t *heads, int64_t *nheads, int64_t *reserved,
                          int64_t *segments) {
    int64_t k, kept = 0;
    for (k = 0; k < *nheads; k++) {
        int32_t h = heads[k];
        Block *b = &bs->b[h];
        if (!b->allocated && b->prev < 0 && b->next < 0) {
            pool_remove(&pools[b->small], bs->b, h);
            *reserved -= b->size;
            (*segments)--;
            if (!drop_block(bs, h)) return 0;
        } else {
            heads[kept++] = h;
        }
    }
    *nheads = kept;
    return 1;
}

/* A repeated span (gr_replay's rep_from, rep_at): the events from rep_at to the end claim to be those from rep_from
 * to rep_at again, with each allocation id of the first span renamed. When the allocator's state at rep_at is the state
 * at rep_from with its live allocations renamed (the same segments in the same order, the same blocks at the same
 * addresses and sizes, allocated or free alike), no segment was made between the two (so none was released), and
 * the second span is the first with its ids renamed accordingly (an id made in the first span to the id made at the
 * same place in the second; an id live at rep_from to the id in the same block at rep_at), the second span makes
 * every decision the first made, on blocks at the same places: the peaks cannot rise in it (the same totals run
 * again from the same start), and it ends in the state it began in, renamed. The replay then stops at rep_at with
 * the figures that span would leave. Anything else replays the second span as usual. */
typedef struct {
    int64_t *addr, *size; /* the blocks at rep_from, segment by segment in `heads` order */
    int32_t *handle;      /* the id each held (0: free) */
    int64_t n, cap;
    int64_t nheads, nhandle, made;
} Snapshot;

static int snapshot_take(Snapshot *s, const Blocks *bs, const int32_t *heads, int64_t nheads, int64_t nhandle,
                         int64_t made) {
    int64_t k, c1, c2;
    s->n = 0;
    for (k = 0; k < nheads; k++) {
        int32_t b;
        for (b = heads[k]; b >= 0; b = bs->b[b].next) {
            if (s->n + 1 > s->cap) {
                c1 = c2 = s->cap;
                if (!grow((void **)&s->addr, &c1, s->n + 1, sizeof(int64_t))) return 0;
                if (!grow((void **)&s->size, &c2, s->n + 1, sizeof(int64_t))) return 0;
                if (!grow((void **)&s->handle, &s->cap, s->n + 1, sizeof(int32_t))) return 0;
            }
            const Block *x = &bs->b[b];
            s->addr[s->n] = x->addr;
            s->size[s->n] = x->size;
            s->handle[s->n] = x->allocated ? x->handle : 0;
            s->n++;
        }
    }
    s->nheads = nheads;
    s->nhandle = nhandle;
    s->made = made;
    return 1;
}

/* 1 when the state now is the snapshot's renamed and ev[at:at+len] is ev[from:from+len] renamed (see above); -1 out
 * of host memory */
static int repeats(const Snapshot *s, const Blocks *bs, const int32_t *heads, int64_t nheads, int64_t nhandle,
                   int64_t made, const int64_t *ev, int64_t from, int64_t at, int64_t len) {
    int64_t k, j = 0, d = nhandle - s->nhandle;
    if (made != s->made || nheads != s->nheads) return 0;
    int32_t *rename = calloc((size_t)(s->nhandle > 0 ? s->nhandle : 1), sizeof(int32_t)); /* id at from -> id at at */
    if (!rename) return -1;
    int ok = 1;
    for (k = 0; k < nheads && ok; k++) {
        int32_t b;
        for (b = heads[k]; b >= 0; b = bs->b[b].next, j++) {
            const Block *x = &bs->b[b];
            if (j >= s->n) {
                ok = 0;
                break;
            }
            int32_t was = s->handle[j];
            if (x->addr != s->addr[j] || x->size != s->size[j] || x->allocated != (was != 0)) {
                ok = 0;
                break;
            }
            if (was) rename[was] = x->handle;
        }
    }
    if (j != s->n) ok = 0;
    for (k = 0; k < len && ok; k++) {
        int64_t e1 = ev[from + k], e2 = ev[at + k];
        if (e1 >= 0) {
            ok = e2 == e1;
        } else {
            int64_t h = -e1;
            if (h >= s->nhandle)
                ok = e2 == -(h + d);
            else
                ok = rename[h] != 0 && e2 == -(int64_t)rename[h];
        }
    }
    free(rename);
    return ok;
}

/* ev: +size allocates (the next id), -id frees, 0 empties the cache. out: peak_allocated, peak_reserved, allocated,
 * reserved, peak_allocated_event, peak_reserved_event, segments, releases, oom_event (-1: none), on an error the
 * event's index (else n), and the events a repeated span let it leave out. cap < 0: no limit. rep_from <= rep_at with rep_at - rep_from == n - rep_at: the events from rep_at
 * may repeat those from rep_from (the Snapshot above); rep_from < 0: no such hint. */
int gr_replay(const int64_t *ev, int64_t n, int64_t cap, int64_t rep_from, int64_t rep_at, int64_t *out) {
    Pool pools[2]; /* 0: large, 1: small */
    memset(pools, 0, sizeof pools);
    Blocks bs = {0};
    int32_t *handle = NULL; /* allocation id -> block slot (-1 once freed) */
    int64_t nhandle = 1, caphandle = 0;
    int32_t *heads = NULL; /* segments' first blocks */
    int64_t nheads = 0, capheads = 0;
    int64_t allocated = 0, reserved = 0, peak_a = 0, peak_r = 0, peak_a_event = -1, peak_r_event = -1;
    int64_t segments = 0, releases = 0, oom = -1, made = 0, skipped = 0;
    int64_t next_small = SMALL_BASE, next_large = SMALL_BASE;
    int rc = OK;
    int64_t i;
    Snapshot snap = {0};
    if (rep_from < 0 || rep_from >= rep_at || rep_at - rep_from != n - rep_at) rep_from = rep_at = -1;
    if (!grow((void **)&handle, &caphandle, 1024, sizeof(int32_t))) return ERR_NOMEM;
    handle[0] = -1;
    for (i = 0; i < n; i++) {
        if (i == rep_from) {
            if (!snapshot_take(&snap, &bs, heads, nheads, nhandle, made)) { rc = ERR_NOMEM; goto done; }
        } else if (i == rep_at) {
            int same = repeats(&snap, &bs, heads, nheads, nhandle, made, ev, rep_from, rep_at, n - rep_at);
            if (same < 0) { rc = ERR_NOMEM; goto done; }
            if (same) {
                skipped = n - i;
                i = n; /* the rest runs as the span before it ran: no new peak, and it ends as it began */
                break;
            }
        }
        int64_t e = ev[i];
        if (e > 0) {
            int64_t size = (e + MIN_BLOCK - 1) / MIN_BLOCK * MIN_BLOCK;
            int small = size <= SMALL_SIZE;
            Pool *pool = &pools[small];
            int32_t bucket = -1;
            int32_t blk = pool_best(pool, size, &bucket);
            if (blk >= 0) {
                pool_take(pool, bucket, 0);
            } else {
                int64_t seg;
                if (small)
                    seg = SMALL_BUFFER;
                else if (size < MIN_LARGE_ALLOC)
                    seg = LARGE_BUFFER;
                else
                    seg = (size + ROUND_LARGE - 1) / ROUND_LARGE * ROUND_LARGE;
                if (cap >= 0 && reserved + seg > cap) {
                    /* release every wholly free segment, then retry once */
                    if (!release_cached(pools, &bs, heads, &nheads, &reserved, &segments)) { rc = ERR_NOMEM; goto done; }
                    releases++;
                    if (reserved + seg > cap) {
                        oom = i;
                        break;
                    }
                }
                int64_t addr;
                if (small) {
                    addr = next_small;
                    next_small += seg + ROUND_LARGE;
                } else {
                    next_large -= seg + ROUND_LARGE;
                    addr = next_large;
                }
                blk = new_block(&bs);
                if (blk < 0) { rc = ERR_NOMEM; goto done; }
                Block *b = &bs.b[blk];
                b->addr = addr;
                b->size = seg;
                b->prev = b->next = -1;
                b->allocated = 0;
                b->small = (int8_t)small;
                if (!grow((void **)&heads, &capheads, nheads + 1, sizeof(int32_t))) { rc = ERR_NOMEM; goto done; }
                heads[nheads++] = blk;
                segments++;
                made++;
                reserved += seg;
                if (reserved > peak_r) {
                    peak_r = reserved;
                    peak_r_event = i;
                }
            }
            Block *b = &bs.b[blk];
            int64_t remaining = b->size - size;
            if (small ? remaining >= MIN_BLOCK : remaining > SMALL_SIZE) {
                int32_t r = new_block(&bs);
                if (r < 0) { rc = ERR_NOMEM; goto done; }
                b = &bs.b[blk]; /* new_block may have moved the array */
                Block *rest = &bs.b[r];
                rest->addr = b->addr + size;
                rest->size = remaining;
                rest->small = (int8_t)small;
                rest->allocated = 0;
                rest->prev = blk;
                rest->next = b->next;
                if (b->next >= 0) bs.b[b->next].prev = r;
                b->next = r;
                b->size = size;
                if (!pool_add(pool, bs.b, r)) {
                    rc = ERR_NOMEM;
                    goto done;
                }
            }
            b->allocated = 1;
            b->handle = (int32_t)nhandle;
            if (!grow((void **)&handle, &caphandle, nhandle + 1, sizeof(int32_t))) { rc = ERR_NOMEM; goto done; }
            handle[nhandle++] = blk;
            allocated += b->size;
            if (allocated > peak_a) {
                peak_a = allocated;
                peak_a_event = i;
            }
        } else if (e < 0) {
            int64_t k = -e;
            if (k >= nhandle) { rc = ERR_ID; goto done; }
            int32_t blk = handle[k];
            if (blk < 0) { rc = ERR_TWICE; goto done; }
            handle[k] = -1;
            Block *b = &bs.b[blk];
            Pool *pool = &pools[b->small];
            allocated -= b->size;
            b->allocated = 0;
            int32_t p = b->prev >= 0 && !bs.b[b->prev].allocated ? b->prev : -1;
            int32_t nx = b->next >= 0 && !bs.b[b->next].allocated ? b->next : -1;
            if (p >= 0) pool_remove(pool, bs.b, p);
            if (nx >= 0) pool_remove(pool, bs.b, nx);
            if (p >= 0) {
                Block *pb = &bs.b[p];
                pb->size += b->size;
                pb->next = b->next;
                if (b->next >= 0) bs.b[b->next].prev = p;
                if (!drop_block(&bs, blk)) { rc = ERR_NOMEM; goto done; }
                blk = p;
                b = pb;
            }
            if (nx >= 0) {
                Block *nb = &bs.b[nx];
                b->size += nb->size;
                b->next = nb->next;
                if (nb->next >= 0) bs.b[nb->next].prev = blk;
                if (!drop_block(&bs, nx)) { rc = ERR_NOMEM; goto done; }
            }
            if (!pool_add(pool, bs.b, blk)) { rc = ERR_NOMEM; goto done; }
        } else {
            /* torch.cuda.empty_cache(): the same release, asked for (not counted among the releases a limit forced) */
            if (!release_cached(pools, &bs, heads, &nheads, &reserved, &segments)) { rc = ERR_NOMEM; goto done; }
        }
    }
done:
    out[0] = peak_a;
    out[1] = peak_r;
    out[2] = allocated;
    out[3] = reserved;
    out[4] = peak_a_event;
    out[5] = peak_r_event;
    out[6] = segments;
    out[7] = releases;
    out[8] = oom;
    out[9] = i;
    out[10] = skipped;
    pool_free(&pools[0]);
    pool_free(&pools[1]);
    free(bs.b);
    free(bs.spare);
    free(handle);
    free(heads);
    free(snap.addr);
    free(snap.size);
    free(snap.handle);
    return rc;
}

/* memory/template.py's Template.instantiate: the program at `batch` from a template's ops (+handle allocates that
 * handle, -handle frees it), each handle's size a[h] * batch + c[h] rounded up to 512 B (h >= 1). Phases switch
 * before op mark_at[k] to mark_phase[k] (marks in order; of several at one op the last holds). Writes the events,
 * the sizes (sizes[0] = 0), per phase its peak of the allocated total (-1: none), the op count at that peak, and the
 * op index where the phase first had a peak (the order Python's dict would list them in); figures: the allocated
 * total at the end, the peak, the largest allocation outside the loading phase. */
int gr_instantiate(const int64_t *ops, int64_t nops, const int64_t *a, const int64_t *c, int64_t nh, int64_t batch,
                   const int64_t *mark_at, const int64_t *mark_phase, int64_t nmarks, int64_t load_phase,
                   int64_t *events, int64_t *sizes, int64_t *phase_peak, int64_t *phase_peak_event,
                   int64_t *phase_first, int64_t *figures) {
    int64_t h, k, i;
    int64_t allocated = 0, peak = 0, largest = 0;
    sizes[0] = 0;
    for (h = 1; h < nh; h++) {
        int64_t n = a[h] * batch + c[h];
        sizes[h] = (n + MIN_BLOCK - 1) / MIN_BLOCK * MIN_BLOCK;
    }
    for (k = 0; k < nmarks; k++) {
        int64_t start = mark_at[k], end = (k + 1 < nmarks) ? mark_at[k + 1] : nops;
        int64_t ph = mark_phase[k];
        int loading = ph == load_phase;
        int64_t pp = phase_peak[ph];
        if (end <= start) continue;
        for (i = start; i < end; i++) {
            int64_t op = ops[i];
            if (op > 0) {
                if (op >= nh) return ERR_ID;
                int64_t size = sizes[op];
                events[i] = size;
                allocated += size;
                if (size > largest && !loading) largest = size;
                if (allocated > pp) {
                    if (phase_peak[ph] < 0) phase_first[ph] = i;
                    pp = phase_peak[ph] = allocated;
                    phase_peak_event[ph] = i + 1;
                    if (allocated > peak) peak = allocated;
                }
            } else {
                if (-op >= nh) return ERR_ID;
                events[i] = op;
                allocated -= sizes[-op];
            }
        }
    }
    figures[0] = allocated;
    figures[1] = peak;
    figures[2] = largest;
    return OK;
}

/* memory/program.py's Program.breakdown: the bytes live after the first `end` events, by each handle's code
 * (codes[h], a category's number); out[] must be zeroed and as long as the largest code + 1. */
int gr_live(const int64_t *ev, int64_t end, const int64_t *codes, const int64_t *sizes, int64_t nh, int64_t *out) {
    int64_t i, h = 0;
    for (i = 0; i < end; i++) {
        int64_t e = ev[i];
        if (e > 0) {
            h++;
            if (h >= nh) return ERR_ID;
            out[codes[h]] += sizes[h];
        } else if (e < 0) {
            if (-e >= nh) return ERR_ID;
            out[codes[-e]] -= sizes[-e];
        }
    }
    return OK;
}
