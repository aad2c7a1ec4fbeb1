/* Fuzzing driver for memory/_replay.c's gr_replay, built with AddressSanitizer and UBSan by test_native.py
 * (test_the_compiled_replay_under_sanitizers), or by hand:
 *
 *   cc -O1 -g -fsanitize=address,undefined -fno-sanitize-recover=all -o /tmp/replay_fuzz \
 *      tests/memory/replay_fuzz.c src/gpuready/memory/_replay.c && /tmp/replay_fuzz 8000 6000
 *
 * Two kinds of program: random allocations and frees of every size class with empty-cache events (argument 1: how
 * many), and training-like programs of three steps of one pattern with a repeat hint that is right, damaged (a
 * size or a freed id changed in the last step) or arbitrary (argument 2). Each runs with no limit and under
 * limits from 30% to 100% of its peak reserve. A hinted replay must give the figures of the same replay without
 * the hint. Exit status 1 when any differs; the sanitizers abort on a memory or undefined-behaviour error. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int gr_replay(const int64_t *ev, int64_t n, int64_t cap, int64_t rep_from, int64_t rep_at, int64_t *out);

static uint64_t state = 88172645463325252ULL;
static uint64_t rnd(void) {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return state;
}

static const int64_t MIB = 1 << 20;

static int64_t any_size(void) {
    int kind = (int)(rnd() % 10);
    if (kind < 3) return 1 + (int64_t)(rnd() % (uint64_t)MIB);
    if (kind < 6) return MIB + 1 + (int64_t)(rnd() % (uint64_t)(9 * MIB));
    static const int64_t m[] = {16, 40, 86, 160, 240}, add[] = {0, 512, 4096};
    return m[rnd() % 5] * MIB + add[rnd() % 3];
}

static int64_t random_program(int64_t *ev, int64_t *live) {
    int64_t n = 0, nl = 0, made = 0, len = 200 + (int64_t)(rnd() % 3000), i;
    for (i = 0; i < len; i++) {
        if (rnd() % 100 == 0) {
            ev[n++] = 0;
            continue;
        }
        if (nl && rnd() % 100 < 45) {
            int64_t k = (int64_t)(rnd() % (uint64_t)nl);
            ev[n++] = -live[k];
            live[k] = live[--nl];
            continue;
        }
        ev[n++] = rnd() % 4 == 0 ? 512 * (int64_t)(1 + rnd() % 8) : any_size(); /* many equal sizes too */
        live[nl++] = ++made;
    }
    return n;
}

/* weights, then three steps of one pattern (the first also makes states); up to two of a step's tensors live into
 * the next step. The hint: the last two steps' starts, maybe damaged. */
static int64_t stepped_program(int64_t *ev, int64_t *from, int64_t *at) {
    int64_t op[400], x[400], open_[400], ids[400], held[2], carried[2], starts[3];
    int64_t n = 0, made = 0, np = 0, no = 0, count = 0, nheld, ncarried = 0, i, k;
    int64_t nload = 3 + (int64_t)(rnd() % 20), plen = 10 + (int64_t)(rnd() % 150);
    for (i = 0; i < nload; i++, made++) ev[n++] = any_size();
    for (i = 0; i < plen; i++) {
        if (no && rnd() % 100 < 45) {
            k = (int64_t)(rnd() % (uint64_t)no);
            op[np] = 1;
            x[np++] = open_[k];
            open_[k] = open_[--no];
        } else {
            op[np] = 0;
            x[np++] = any_size();
            open_[no++] = count++;
        }
    }
    nheld = (int64_t)(rnd() % 3);
    if (nheld > no) nheld = no;
    for (k = 0; k < nheld; k++) held[k] = open_[k];
    for (k = nheld; k < no; k++) {
        op[np] = 1;
        x[np++] = open_[k];
    }
    for (int step = 0; step < 3; step++) {
        starts[step] = n;
        for (k = 0; k < ncarried; k++) ev[n++] = -carried[k];
        if (step == 0)
            for (k = (int64_t)(rnd() % 4); k > 0; k--, made++) ev[n++] = any_size();
        if (rnd() % 50 == 0) ev[n++] = 0;
        int64_t c = 0;
        for (i = 0; i < np; i++) {
            if (op[i] == 0) {
                ev[n++] = x[i];
                ids[c++] = ++made;
            } else {
                ev[n++] = -ids[x[i]];
            }
        }
        ncarried = nheld;
        for (k = 0; k < nheld; k++) carried[k] = ids[held[k]];
    }
    *from = starts[1];
    *at = starts[2];
    switch (rnd() % 4) {
    case 1: /* the last step changed at one event */
        k = *at + (int64_t)(rnd() % (uint64_t)(n - *at));
        if (ev[k] > 0)
            ev[k] += 512;
        else if (ev[k] < 0)
            ev[k] = -(1 + (int64_t)(rnd() % (uint64_t)made)); /* maybe freed twice, or not yet made */
        break;
    case 2: /* any span */
        *from = (int64_t)(rnd() % (uint64_t)n);
        *at = *from + (int64_t)(rnd() % (uint64_t)(n - *from + 1));
        break;
    case 3: /* two halves */
        *at = (n + (int64_t)(rnd() % 3)) / 2;
        *from = 2 * *at - n;
        break;
    }
    return n;
}

int main(int argc, char **argv) {
    long randoms = argc > 1 ? atol(argv[1]) : 2000, stepped = argc > 2 ? atol(argv[2]) : 2000;
    int64_t *ev = malloc(40000 * sizeof(int64_t)), *live = malloc(40000 * sizeof(int64_t)), out[11], plain[11];
    long runs = 0, left_out = 0, differ = 0, t;
    if (!ev || !live) return 2;
    for (t = 0; t < randoms + stepped; t++) {
        int64_t from = -1, at = -1, n = t < randoms ? random_program(ev, live) : stepped_program(ev, &from, &at);
        gr_replay(ev, n, -1, -1, -1, out);
        int64_t peak = out[1];
        for (int q = 0; q < 6; q++) {
            int64_t cap = q == 0 ? -1 : (int64_t)((double)peak * (0.3 + 0.14 * q));
            int rc = gr_replay(ev, n, cap, from, at, out);
            int rc0 = gr_replay(ev, n, cap, -1, -1, plain);
            runs++;
            left_out += out[10] > 0;
            if (rc != rc0 || memcmp(out, plain, 9 * sizeof(int64_t)) != 0) differ++;
        }
    }
    printf("replays %ld, with the last step left out %ld, differing from the plain replay %ld\n", runs, left_out,
           differ);
    free(ev);
    free(live);
    return differ != 0;
}
