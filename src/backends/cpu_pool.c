/*
 * cpu_pool.c - the CPU backend's thread pool: persistent workers, pinned, shared per thread count.
 *
 * A run publishes (fn, ctx) and bumps a generation counter; workers spin on it for a while after
 * their last job (a model's next layer comes within microseconds), then sleep on a condition
 * variable. The barrier is a counter with a phase: spin, then yield, so that a machine with more
 * threads than CPUs still makes progress; the idle poll yields as often.
 *
 * The caller is thread 0 and is not pinned (it is the application's thread): the pool keeps its CPU
 * free of workers. A worker pinned to the caller's CPU would share a core with it, and the two would
 * take turns at every barrier and at the join; worse, once done the worker polls for new work on
 * that core while the caller waits for it, until the scheduler's next tick (bench --cpu --profile on
 * a 16-core Xeon: a 0.3 ms forward took 4.0 ms, 3.35 of them in the join).
 */
#define _GNU_SOURCE   /* sched_getaffinity, pthread_setaffinity_np */
#include "backends/cpu.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CPU_RELAX() _mm_pause()
#else
#define CPU_RELAX() ((void)0)
#endif

enum {
    SPIN_IDLE_NS = 10000000,  /* how long an idle worker polls before it sleeps: a wake from sleep cost up
                                 to 0.57 ms of a 1 ms forward on a 16-core Xeon (bench --cpu --profile) */
    SPIN_CLOCK = 256,         /* polls between two looks at the clock */
    SPIN_WAIT = 4000,         /* polls in a barrier, a join or the idle poll before each yield */
    SPIN_WAIT_SHARED = 64,    /* the same when there are more threads than CPUs: the thread waited
                                 for may be the one that shares this CPU */
    MAX_THREADS = 1024,
};

struct nvfp4moe_cpu_pool {
    int n;                          /* threads, the caller included */
    int asked;                      /* the count asked for (n is less when the system refused some) */
    int refs;                       /* plans holding it (under g_lock) */
    struct nvfp4moe_cpu_pool *next; /* the registry's list */
    pthread_t *workers;             /* n - 1 */
    int spin;                       /* SPIN_WAIT, or SPIN_WAIT_SHARED */
    int *cpu;                       /* [n]: the CPU of each worker (-1: not pinned); cpu[0] the one
                                       left to the caller, -1 when there are more threads than CPUs */
    pthread_mutex_t run_lock;       /* one run at a time */
    pthread_mutex_t lock;           /* with wake: sleeping workers */
    pthread_cond_t wake;
    nvfp4moe_cpu_task fn;
    void *ctx;
    atomic_uint gen;                /* bumped by each run (and by shutdown) */
    atomic_int pending;             /* workers still in the current run */
    atomic_bool quit;
    atomic_int bar_count;
    atomic_uint bar_phase;
};

typedef struct {
    nvfp4moe_cpu_pool *pool;
    int tid;
} worker_arg;

// ---- CPUs ----

/* The CPUs this process may run on, in order; returns their count (at least 1). */
static int allowed_cpus(int *cpus, int cap) {
#ifdef __linux__
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) {
        int n = 0;
        for (int c = 0; c < CPU_SETSIZE && n < cap; c++)
            if (CPU_ISSET(c, &set)) cpus[n++] = c;
        if (n > 0) return n;
    }
#endif
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    n = n < 1 ? 1 : n > cap ? cap : n;
    for (long c = 0; c < n; c++) cpus[c] = (int)c;
    return (int)n;
}

nvfp4moe_status nvfp4moe_cpu_default_threads(int *n) {
    const char *env = getenv("NVFP4MOE_NUM_THREADS");
    if (env && *env) {
        char *end;
        errno = 0;
        long v = strtol(env, &end, 10);
        NVFP4MOE_RETURN_IF(errno || *end || v < 1 || v > MAX_THREADS, NVFP4MOE_ERR_INVALID_ARGUMENT,
                           "NVFP4MOE_NUM_THREADS='%s' must be an integer in [1, %d]", env, MAX_THREADS);
        *n = (int)v;
        return NVFP4MOE_OK;
    }
    int cpus[MAX_THREADS];
    *n = allowed_cpus(cpus, MAX_THREADS);
    return NVFP4MOE_OK;
}

// ---- workers ----

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Polls gen for about SPIN_IDLE_NS (by the clock: a pause lasts 10 to 140 cycles depending on the
 * CPU); returns its value, == seen if nothing came. Yields every p->spin polls (at least SPIN_CLOCK),
 * as a barrier does: a thread that shares this CPU (more threads than CPUs, another process) then
 * runs within a yield's spin, not when the scheduler preempts this one; alone on its CPU, a yield
 * returns at once. */
static unsigned poll_gen(nvfp4moe_cpu_pool *p, unsigned seen) {
    const int64_t until = now_ns() + SPIN_IDLE_NS;
    for (int polls = 0;; polls += SPIN_CLOCK) {
        for (int i = 0; i < SPIN_CLOCK; i++) {
            unsigned g = atomic_load_explicit(&p->gen, memory_order_acquire);
            if (g != seen) return g;
            CPU_RELAX();
        }
        if (now_ns() >= until) return seen;
        if (polls >= p->spin) {
            sched_yield();
            polls = 0;
        }
    }
}

static void *worker_main(void *arg) {
    worker_arg a = *(worker_arg *)arg;
    free(arg);
    nvfp4moe_cpu_pool *p = a.pool;
    unsigned seen = 0;
    for (;;) {
        unsigned g = poll_gen(p, seen);
        if (g == seen) {
            pthread_mutex_lock(&p->lock);
            while ((g = atomic_load_explicit(&p->gen, memory_order_acquire)) == seen) pthread_cond_wait(&p->wake, &p->lock);
            pthread_mutex_unlock(&p->lock);
        }
        seen = g;
        if (atomic_load(&p->quit)) break;
        p->fn(p->ctx, a.tid, p->n);
        atomic_fetch_sub_explicit(&p->pending, 1, memory_order_release);
    }
    return NULL;
}

/* Waits (spin, then yield) until *v reads 0. */
static void wait_zero(atomic_int *v, int spin) {
    for (int i = 0; atomic_load_explicit(v, memory_order_acquire) != 0; i++) {
        CPU_RELAX();
        if (i >= spin) {
            sched_yield();
            i = 0;
        }
    }
}

/* Pins t to cpu; false when the system refused (best effort: an unpinned thread still works). */
static bool pin(pthread_t t, int cpu) {
#ifdef __linux__
    if (cpu < 0 || cpu >= CPU_SETSIZE) return false;
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    return pthread_setaffinity_np(t, sizeof set, &set) == 0;
#else
    (void)t;
    (void)cpu;
    return false;
#endif
}

/* The CPU the calling thread is on, -1 if unknown. */
static int current_cpu(void) {
#ifdef __linux__
    return sched_getcpu();
#else
    return -1;
#endif
}

/* Keeps the caller's CPU free of workers (under run_lock): when the caller is on a worker's CPU (the
 * scheduler moved it, or another thread runs the pool), that worker moves to the CPU the caller was
 * on. A look at the current CPU otherwise (rseq or the vDSO: no system call). */
static void keep_caller_cpu_free(nvfp4moe_cpu_pool *p) {
    if (p->cpu[0] < 0) return;
    const int c = current_cpu();
    if (c < 0 || c == p->cpu[0]) return;
    for (int w = 1; w < p->n; w++)
        if (p->cpu[w] == c) {
            if (!pin(p->workers[w - 1], p->cpu[0])) {   /* refused (a cpuset changed?): give up */
                p->cpu[0] = -1;
                return;
            }
            p->cpu[w] = p->cpu[0];
            break;
        }
    p->cpu[0] = c;
}

static void pool_free(nvfp4moe_cpu_pool *p) {
    if (p->n > 1) {
        pthread_mutex_lock(&p->lock);
        atomic_store(&p->quit, true);
        atomic_fetch_add_explicit(&p->gen, 1, memory_order_release);
        pthread_cond_broadcast(&p->wake);
        pthread_mutex_unlock(&p->lock);
        for (int i = 0; i < p->n - 1; i++) pthread_join(p->workers[i], NULL);
    }
    pthread_mutex_destroy(&p->run_lock);
    pthread_mutex_destroy(&p->lock);
    pthread_cond_destroy(&p->wake);
    free(p->workers);
    free(p->cpu);
    free(p);
}

static nvfp4moe_status pool_new(int nthreads, nvfp4moe_cpu_pool **out) {
    nvfp4moe_cpu_pool *p = calloc(1, sizeof *p);
    pthread_t *workers = calloc((size_t)nthreads, sizeof(pthread_t));
    int *cpu = malloc(sizeof(int) * (size_t)nthreads);
    if (!p || !workers || !cpu) {
        free(p);
        free(workers);
        free(cpu);
        return nvfp4moe_set_error(NVFP4MOE_ERR_OUT_OF_MEMORY, "CPU thread pool: out of memory");
    }
    p->workers = workers;
    p->cpu = cpu;
    p->asked = nthreads;
    pthread_mutex_init(&p->run_lock, NULL);
    pthread_mutex_init(&p->lock, NULL);
    pthread_cond_init(&p->wake, NULL);
    atomic_init(&p->gen, 0);
    atomic_init(&p->pending, 0);
    atomic_init(&p->quit, false);
    atomic_init(&p->bar_count, 0);
    atomic_init(&p->bar_phase, 0);
    int cpus[MAX_THREADS];
    int ncpu = allowed_cpus(cpus, MAX_THREADS);
    /* The caller's CPU first, the others in order: worker i on the i-th, round robin, so that the
     * caller's CPU has none while there are no more threads than CPUs. */
    const int here = current_cpu();
    for (int i = 1; i < ncpu; i++)
        if (cpus[i] == here) {
            memmove(cpus + 1, cpus, sizeof(int) * (size_t)i);
            cpus[0] = here;
            break;
        }
    p->cpu[0] = nthreads <= ncpu ? cpus[0] : -1;
    p->spin = nthreads <= ncpu ? SPIN_WAIT : SPIN_WAIT_SHARED;
    p->n = 1;
    for (int i = 1; i < nthreads; i++) {
        worker_arg *a = malloc(sizeof *a);
        if (!a) break;
        a->pool = p;
        a->tid = i;
        if (pthread_create(&p->workers[i - 1], NULL, worker_main, a) != 0) {
            free(a);
            break;
        }
        p->cpu[i] = pin(p->workers[i - 1], cpus[i % ncpu]) ? cpus[i % ncpu] : -1;
        p->n++;
    }
    *out = p;
    return NVFP4MOE_OK;
}

// ---- the shared registry ----

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static nvfp4moe_cpu_pool *g_pools;

nvfp4moe_status nvfp4moe_cpu_pool_get(int nthreads, nvfp4moe_cpu_pool **out) {
    NVFP4MOE_RETURN_IF(nthreads < 1 || nthreads > MAX_THREADS, NVFP4MOE_ERR_INVALID_ARGUMENT,
                       "num_threads=%d must be in [1, %d]", nthreads, MAX_THREADS);
    pthread_mutex_lock(&g_lock);
    nvfp4moe_cpu_pool *p = g_pools;
    while (p && p->asked != nthreads) p = p->next;
    nvfp4moe_status st = NVFP4MOE_OK;
    if (!p) {
        st = pool_new(nthreads, &p);
        if (st == NVFP4MOE_OK) {
            p->next = g_pools;
            g_pools = p;
        }
    }
    if (st == NVFP4MOE_OK) {
        p->refs++;
        *out = p;
    }
    pthread_mutex_unlock(&g_lock);
    return st;
}

void nvfp4moe_cpu_pool_put(nvfp4moe_cpu_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&g_lock);
    bool last = --p->refs == 0;
    if (last) {
        nvfp4moe_cpu_pool **link = &g_pools;
        while (*link != p) link = &(*link)->next;
        *link = p->next;
    }
    pthread_mutex_unlock(&g_lock);
    if (last) pool_free(p);
}

int nvfp4moe_cpu_pool_size(const nvfp4moe_cpu_pool *p) { return p->n; }

void nvfp4moe_cpu_pool_run(nvfp4moe_cpu_pool *p, nvfp4moe_cpu_task fn, void *ctx) {
    pthread_mutex_lock(&p->run_lock);
    if (p->n == 1) {
        fn(ctx, 0, 1);
        pthread_mutex_unlock(&p->run_lock);
        return;
    }
    keep_caller_cpu_free(p);
    p->fn = fn;
    p->ctx = ctx;
    atomic_store_explicit(&p->pending, p->n - 1, memory_order_relaxed);
    pthread_mutex_lock(&p->lock);
    atomic_fetch_add_explicit(&p->gen, 1, memory_order_release);
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->lock);
    fn(ctx, 0, p->n);
    wait_zero(&p->pending, p->spin);
    pthread_mutex_unlock(&p->run_lock);
}

void nvfp4moe_cpu_pool_wait(nvfp4moe_cpu_pool *p, atomic_llong *v, long long n) {
    for (int i = 0; atomic_load_explicit(v, memory_order_acquire) < n; i++) {
        CPU_RELAX();
        if (i >= p->spin) {
            sched_yield();
            i = 0;
        }
    }
}

void nvfp4moe_cpu_pool_barrier(nvfp4moe_cpu_pool *p) {
    if (p->n == 1) return;
    unsigned phase = atomic_load_explicit(&p->bar_phase, memory_order_acquire);
    if (atomic_fetch_add_explicit(&p->bar_count, 1, memory_order_acq_rel) == p->n - 1) {
        atomic_store_explicit(&p->bar_count, 0, memory_order_relaxed);
        atomic_fetch_add_explicit(&p->bar_phase, 1, memory_order_release);
        return;
    }
    for (int i = 0; atomic_load_explicit(&p->bar_phase, memory_order_acquire) == phase; i++) {
        CPU_RELAX();
        if (i >= p->spin) {
            sched_yield();
            i = 0;
        }
    }
}
