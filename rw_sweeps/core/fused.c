/* Fused training and evaluation of R runs of eq. 2.1 (compact model, exact Gram), float64 and float32.
 *
 * The math is engine.py's, operation for operation where it matters (see its docstring):
 *   exp(z_bj − m) = α[s_bj]·β_j (one stabiliser per run), H_bk = Σ_{j: s_bj = k} β_j,
 *   Z_b = Σ_k α_k H_bk + β_q, h_b = α∘H_b / Z_b, F_b = V[y_b]·h_b, g_b = w / (F_b + ε),
 *   Ψ_bk = (g_b / Z_b)·α_k·(V[y_b,k] − F_b), D_j = −β_j Σ_b Ψ_{b,s_bj}, D_N = Σ_b g_b S_bN F_b,
 *   Ga_k = −Σ_b g_b (V[y_b,k] − F_b) h_bk / ν_tok, a −= lr·κ·Ga, c −= lr·κ·‖p‖²·D/ν, V += lr·Σ_b g_b e_{y_b} h_bᵀ,
 * with the logits z_bj = a[s_bj]/ν_tok + c_j/ν_pos (j < N) and z_bN = c_N/ν_q (model.Geometry: ν_pos ≠ ν_tok
 * for model.normalize=positional), so ν above is ν_pos for j < N and ν_q for the query column.
 *
 * Layout: run → step → sample, so a run's int8 tokens (n·(N−1) bytes) and its histogram masks stay in L2
 * for all T steps; runs are spread over threads (pthreads, dynamic). Two implementations per dtype:
 *   - generic: plain C, any K ≤ 127, any CPU;
 *   - AVX-512 (compiled in when -march=native has AVX512F/BW/VL/DQ), 3 ≤ K ≤ 8:
 *       histogram with samples in the SIMD lanes: per position j, K masked adds of β_j (masks precomputed
 *       per run), so every H_bk is summed in position order exactly as torch's scatter_add_;
 *       gather-sum with positions in the lanes: one permutexvar of Ψ_b per 8 (f64) / 16 (f32) tokens.
 * Thm 4.1's symmetric point stays exact: every position j and every token k goes through the same
 * operations in the same order (sequential sums over b per j, sequential sums over j per (b, k), the same
 * lane tree for every k), so identical inputs give bit-identical outputs.
 * No -ffast-math, and -ffp-contract=off: no reassociation, no fused multiply-add.
 *
 * Compiled once per machine by rw_sweeps/fused.py; the file includes itself once per dtype.
 */
#ifndef RW_PASS

#define _GNU_SOURCE
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512DQ__) && !defined(RW_NO_AVX512)
#define RW_AVX512 1
#include <immintrin.h>
#else
#define RW_AVX512 0
#endif

#define RW_ABI 11 /* fused.py reads this number from here: the one definition */
#define KMAX_FAST 8 /* the AVX-512 path keeps K ≤ 8 histogram accumulators per block in registers */
#define TILE_V 8    /* position vectors per gather tile (accumulators + partial sums stay in registers) */

/* The arguments of rw_train_f64/f32 and rw_eval_f64/f32, one struct each, named field by field. Each list is
   written once, here: it makes the struct and the names and offsets that rw_*_args_layout reports, against
   which fused.py checks its ctypes.Structure before the first call (a library whose layout differs is
   refused, never called). Pointers to REAL (the pass's dtype) are void *. */
#define RW_TRAIN_ARGS(X)                                                                                      \
    X(int64_t, R) X(int64_t, n) X(int64_t, L) X(int64_t, K) X(int64_t, T)                                      \
    X(const uint8_t *, tok) X(const uint8_t *, y)         /* (R, n, L), (R, n) tokens, 0 ≤ s < K */            \
    X(void *, V) X(void *, a) X(void *, c)                /* (R, K, K), (R, K), (R, L+1): updated in place */  \
    X(const void *, lr) X(const void *, eps) X(const void *, w)                                               \
    X(double, kappa) X(double, pp) X(double, nu_tok) X(double, nu_pos) X(double, nu_q)                       \
    X(void *, loss)                                       /* (R, T): training loss before each step */         \
    X(int32_t *, bad_step)                                /* (R,): first non-finite step, else −1 */           \
    X(const void *, masks)                                /* rw_masks of all runs, or NULL */                  \
    X(int32_t, nthreads) X(int32_t, impl)                 /* impl: 0 the fastest available, 1 generic */
#define RW_EVAL_ARGS(X)                                                                                       \
    X(int64_t, R) X(int64_t, n) X(int64_t, L) X(int64_t, K)                                                    \
    X(const uint8_t *, tok) X(const uint8_t *, y) X(const void *, P)                                          \
    X(const void *, V) X(const void *, a) X(const void *, c) X(const void *, eps)                             \
    X(double, nu_tok) X(double, nu_pos) X(double, nu_q)                                                       \
    X(void *, loss) X(void *, acc) X(void *, kl) X(void *, pred_dist) X(void *, attention) X(void *, spread)   \
    X(void *, h_example) X(void *, h_var)                                                                     \
    X(uint8_t *, pred) X(void *, gap)   /* (R, n) argmax f per sample; (R) min over samples of top f − next f */ \
    X(const void *, masks) X(const uint8_t *, tokT) X(int32_t, full) X(const void *, PB) X(int32_t, S)        \
    X(int32_t, nthreads) X(int32_t, impl)
#define RW_FIELD(type, name) type name;
typedef struct { RW_TRAIN_ARGS(RW_FIELD) } rw_train_args;
typedef struct { RW_EVAL_ARGS(RW_FIELD) } rw_eval_args;

/* RW_ONLY=64 or 32 compiles one dtype (the build runs both at once, one per core, and links them) */
#if !defined(RW_ONLY) || RW_ONLY == 64
int rw_abi(void) { return RW_ABI; }
int rw_isa(void) { return RW_AVX512; }
int rw_mvec(void) {
#ifdef RW_MVEC
    return 1;
#else
    return 0;
#endif
}
#define RW_NAME(type, name) #name " "
#define RW_TRAIN_OFF(type, name) (int64_t)offsetof(rw_train_args, name),
#define RW_EVAL_OFF(type, name) (int64_t)offsetof(rw_eval_args, name),
static const int64_t rw_train_offsets[] = {RW_TRAIN_ARGS(RW_TRAIN_OFF) (int64_t)sizeof(rw_train_args)};
static const int64_t rw_eval_offsets[] = {RW_EVAL_ARGS(RW_EVAL_OFF) (int64_t)sizeof(rw_eval_args)};
/* The fields' names (space-separated), and their offsets followed by the struct's size. */
const char *rw_train_args_names(void) { return RW_TRAIN_ARGS(RW_NAME); }
const int64_t *rw_train_args_layout(void) { return rw_train_offsets; }
const char *rw_eval_args_names(void) { return RW_EVAL_ARGS(RW_NAME); }
const int64_t *rw_eval_args_layout(void) { return rw_eval_offsets; }
#endif

/* ---- a parallel-for over runs: nthreads − 1 helper threads plus the caller, dynamic scheduling ---- */
typedef void (*run_fn)(const void *ctx, int64_t r, char *scratch);
typedef struct {
    run_fn fn;
    const void *ctx;
    int64_t R;
    size_t scratch;
    atomic_long next;
    atomic_int err;
} job_t;

static void *worker(void *p) {
    job_t *j = (job_t *)p;
    char *s = NULL;
    if (posix_memalign((void **)&s, 64, j->scratch + 64) != 0) {
        atomic_store(&j->err, 1);
        return NULL;
    }
    for (;;) {
        long r = atomic_fetch_add(&j->next, 1);
        if (r >= j->R) break;
        j->fn(j->ctx, r, s);
    }
    free(s);
    return NULL;
}

static int parallel_runs(run_fn fn, const void *ctx, int64_t R, size_t scratch, int nthreads) {
    job_t j;
    j.fn = fn;
    j.ctx = ctx;
    j.R = R;
    j.scratch = scratch;
    atomic_init(&j.next, 0);
    atomic_init(&j.err, 0);
    if (nthreads > R) nthreads = (int)R;
    if (nthreads < 1) nthreads = 1;
    if (nthreads > 256) nthreads = 256;
    pthread_t th[256];
    int started = 0;
    for (int i = 1; i < nthreads; i++) {
        if (pthread_create(&th[started], NULL, worker, &j) == 0) started++;
    }
    worker(&j);
    for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
    /* a thread that could not allocate leaves its runs to the others; fail only if runs were skipped */
    if (atomic_load(&j.next) < R) return 1;
    return 0;
}

static inline size_t align64(size_t x) { return (x + 63) & ~(size_t)63; }

/* ---- each sequence's token histogram (dtype-free: counts) ---- */
#if !defined(RW_ONLY) || RW_ONLY == 64
typedef struct {
    const uint8_t *tok;
    int32_t *out;
    int64_t n, L, K;
} hist_ctx;

static void hist_run(const void *p, int64_t r, char *scratch) {
    (void)scratch;
    const hist_ctx *h = (const hist_ctx *)p;
    for (int64_t i = 0; i < h->n; i++) {
        const uint8_t *t = h->tok + (r * h->n + i) * h->L;
        int32_t *o = h->out + (r * h->n + i) * h->K;
        memset(o, 0, (size_t)h->K * sizeof(int32_t));
        for (int64_t j = 0; j < h->L; j++) o[t[j]]++; /* t[j] < K: fused.py checks every token tensor */
    }
}

/* out[r][i][k] = #{j : tok[r][i][j] = k} for tokens (R, n, L), out (R, n, K): L times X·S at Theorem 4.1's
   symmetric point (engine.symmetric_h), without torch's int64 copy of the tokens (8 bytes a token). */
int rw_histograms(int64_t R, int64_t n, int64_t L, int64_t K, const uint8_t *tok, int32_t *out, int32_t nthreads) {
    if (R < 0 || n < 0 || L < 0 || K < 1 || L > INT32_MAX) return 2;
    if (R == 0) return 0;
    hist_ctx h = {tok, out, n, L, K};
    return parallel_runs(hist_run, &h, R, 0, nthreads);
}
#endif

/* ---- the two dtypes ---- */
#if !defined(RW_ONLY) || RW_ONLY == 64
#define RW_PASS 1
#define REAL double
#define SFX(name) name##_f64
#define EXP exp
#define LOG log
#define SQRT sqrt
#define TINY 2.2250738585072014e-308 /* torch.finfo(float64).tiny */
#define ZSURE 0x1p-511 /* √TINY: below it a sample's normaliser Z leaves its argmax to torch (see `gap`) */
#define GATHER_CHUNK (1 << 30)       /* samples per partial sum in the gather pass (f64: one chunk) */
#if RW_AVX512
#define LANES 8
#define MASK __mmask8
#define VEC __m512d
#define VZERO() _mm512_setzero_pd()
#define VSET1(x) _mm512_set1_pd(x)
#define VADD _mm512_add_pd
#define VSUB _mm512_sub_pd
#define VMUL _mm512_mul_pd
#define VDIV _mm512_div_pd
#define VSQRT _mm512_sqrt_pd
#define VMASK_ADD _mm512_mask_add_pd
#define VMASK_MOV _mm512_mask_mov_pd
#define VMASK_MAX _mm512_mask_max_pd
#define VMASK_MIN _mm512_mask_min_pd
#define VMAX _mm512_max_pd
#define VMIN _mm512_min_pd
#define VLOADU _mm512_loadu_pd
#define VSTOREU _mm512_storeu_pd
#define VMASK_STOREU _mm512_mask_storeu_pd
#define VPERM(idx, tab) _mm512_permutexvar_pd(idx, tab)
#define VTAB(p) _mm512_loadu_pd(p)
#define VIDX(p, m) _mm512_cvtepu8_epi64(_mm_maskz_loadu_epi8((__mmask16)(m), (const void *)(p)))
#define VCMP(a, b, op) _mm512_cmp_pd_mask(a, b, op)
#define VIEQ(a, b) _mm512_cmpeq_epi64_mask(a, b)
#define VISET1(x) _mm512_set1_epi64(x)
#define VRED_ADD _mm512_reduce_add_pd
#define VRED_MAX _mm512_reduce_max_pd
#define VRED_MIN _mm512_reduce_min_pd
#define VGATHER(src, m, idx32, base) _mm512_mask_i32gather_pd(src, m, _mm512_castsi512_si256(idx32), base, 8)
#define VIOTA() _mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 0, 7, 6, 5, 4, 3, 2, 1, 0)
/* kmovb k, m8 is a pure load; gcc's own choice (movzbl + kmovb k, r32) spends a port-5 µop per mask */
static inline __mmask8 rw_kload8(const __mmask8 *p) {
    __mmask8 m;
    __asm__("kmovb %1, %0" : "=k"(m) : "m"(*p));
    return m;
}
#define KLOAD(p) rw_kload8(p)
#ifdef RW_MVEC
__m512d _ZGVeN8v_log(__m512d);
#define VLOG(x) _ZGVeN8v_log(x)
#endif
#endif
#include "fused.c" /* itself, once per dtype */
#undef RW_PASS
#undef REAL
#undef SFX
#undef EXP
#undef LOG
#undef SQRT
#undef TINY
#undef GATHER_CHUNK
#if RW_AVX512
#undef LANES
#undef MASK
#undef VEC
#undef VZERO
#undef VSET1
#undef VADD
#undef VSUB
#undef VMUL
#undef VDIV
#undef VSQRT
#undef VMASK_ADD
#undef VMASK_MOV
#undef VMASK_MAX
#undef VMASK_MIN
#undef VMAX
#undef VMIN
#undef VLOADU
#undef VSTOREU
#undef VMASK_STOREU
#undef VPERM
#undef VTAB
#undef VIDX
#undef VCMP
#undef VIEQ
#undef VISET1
#undef VRED_ADD
#undef VRED_MAX
#undef VRED_MIN
#undef VGATHER
#undef VIOTA
#undef KLOAD
#undef VLOG
#endif
#endif /* f64 */

#if !defined(RW_ONLY) || RW_ONLY == 32
#define RW_PASS 2
#define REAL float
#define SFX(name) name##_f32
#define EXP expf
#define LOG logf
#define SQRT sqrtf
#define TINY 1.17549435082228750797e-38f /* torch.finfo(float32).tiny */
#define ZSURE 0x1p-63f /* √TINY */
#define GATHER_CHUNK 64                  /* f32: partial sums over 64 samples keep the rounding near torch's */
#if RW_AVX512
#define LANES 16
#define MASK __mmask16
#define VEC __m512
#define VZERO() _mm512_setzero_ps()
#define VSET1(x) _mm512_set1_ps(x)
#define VADD _mm512_add_ps
#define VSUB _mm512_sub_ps
#define VMUL _mm512_mul_ps
#define VDIV _mm512_div_ps
#define VSQRT _mm512_sqrt_ps
#define VMASK_ADD _mm512_mask_add_ps
#define VMASK_MOV _mm512_mask_mov_ps
#define VMASK_MAX _mm512_mask_max_ps
#define VMASK_MIN _mm512_mask_min_ps
#define VMAX _mm512_max_ps
#define VMIN _mm512_min_ps
#define VLOADU _mm512_loadu_ps
#define VSTOREU _mm512_storeu_ps
#define VMASK_STOREU _mm512_mask_storeu_ps
#define VPERM(idx, tab) _mm512_permutexvar_ps(idx, tab)
#define VTAB(p) _mm512_castps256_ps512(_mm256_loadu_ps(p)) /* K ≤ 8 entries; tokens never index the top */
#define VIDX(p, m) _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8((__mmask16)(m), (const void *)(p)))
#define VCMP(a, b, op) _mm512_cmp_ps_mask(a, b, op)
#define VIEQ(a, b) _mm512_cmpeq_epi32_mask(a, b)
#define VISET1(x) _mm512_set1_epi32(x)
#define VRED_ADD _mm512_reduce_add_ps
#define VRED_MAX _mm512_reduce_max_ps
#define VRED_MIN _mm512_reduce_min_ps
#define VGATHER(src, m, idx32, base) _mm512_mask_i32gather_ps(src, m, idx32, base, 4)
#define VIOTA() _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0)
static inline __mmask16 rw_kload16(const __mmask16 *p) {
    __mmask16 m;
    __asm__("kmovw %1, %0" : "=k"(m) : "m"(*p));
    return m;
}
#define KLOAD(p) rw_kload16(p)
#ifdef RW_MVEC
__m512 _ZGVeN16v_logf(__m512);
#define VLOG(x) _ZGVeN16v_logf(x)
#endif
#endif
#include "fused.c" /* itself, once per dtype */
#endif /* f32 */

#else /* RW_PASS: everything below is compiled once per dtype */

typedef struct {
    int64_t R, n, L, K, T;
    const uint8_t *tok; /* (R, n, L) tokens, 0 ≤ s < K */
    const uint8_t *y;   /* (R, n) */
    REAL *V, *a, *c;    /* (R, K, K), (R, K), (R, L+1): updated in place */
    const REAL *lr, *eps, *w;
    REAL kappa, pp, nu_tok, nu_pos, nu_q;
    REAL *loss;         /* (R, T): training loss before each step */
    int32_t *bad_step;  /* (R,): first step t whose loss or updated parameters are not all finite, else −1 */
    const void *masks;  /* histogram masks of all runs (rw_masks), or NULL: built per run in scratch */
} SFX(tctx);

typedef struct {
    int64_t R, n, L, K;
    const uint8_t *tok, *y;
    const REAL *P; /* (R, n, K) true conditionals */
    const REAL *V, *a, *c, *eps;
    REAL nu_tok, nu_pos, nu_q;
    REAL *loss, *acc, *kl, *pred_dist, *attention, *spread, *h_example, *h_var; /* (R), …, (R, L+1), (R), (R, K) ×2 */
    uint8_t *pred; /* (R, n): argmax f of each sample (ties → first, NaN the maximum) */
    REAL *gap;     /* (R): min over samples of (top f − the next f); 0 where a tie, a non-finite f or Z < ZSURE
                      leaves it open (there α, β, H may be subnormal, whose rounding is absolute, not relative:
                      divided by Z ≥ √tiny it is below ε·√tiny of h) */
    const void *masks;
    const uint8_t *tokT; /* tokens by block, position, lane (rw_sweeps.fused._by_block), or NULL */
    int full;            /* 0: of the attention only the parent and query columns (the rest NaN) */
    const REAL *PB;      /* P by block: [blk][P_0 … P_{K−1}, Σ P log P, 1/‖P‖, (k, P_k) of the support ×S][lane]
                            (fused._p_by_block), or NULL */
    int S;               /* the largest support of a sample's P (2 for a random walk) */
} SFX(ectx);

/* NaN-propagating max, as torch.amax / torch.maximum */
static inline REAL SFX(nanmax)(REAL m, REAL x) { return (x > m || x != x) ? x : m; }

/* α, β, β_q of the factorised softmax, exactly as model.attend: one stabiliser m per run. */
static void SFX(prologue)(int64_t K, int64_t L, const REAL *a, const REAL *c, REAL nu_tok, REAL nu_pos,
                          REAL nu_q, REAL *alpha, REAL *beta, REAL *bq) {
    REAL ma = a[0] / nu_tok;
    for (int64_t k = 1; k < K; k++) ma = SFX(nanmax)(ma, a[k] / nu_tok);
    REAL zcm = c[0] / nu_pos;
    for (int64_t j = 1; j < L; j++) zcm = SFX(nanmax)(zcm, c[j] / nu_pos);
    REAL zq = c[L] / nu_q;
    REAL s = ma + zcm;
    REAL m = (s != s || zq != zq) ? s + zq : (s > zq ? s : zq);
    for (int64_t k = 0; k < K; k++) alpha[k] = EXP(a[k] / nu_tok - ma);
    REAL t = m - ma;
    for (int64_t j = 0; j < L; j++) beta[j] = EXP(c[j] / nu_pos - t);
    *bq = EXP(zq - m);
}

/* The parameter update of one step, shared by both implementations (engine.train_step's last lines). */
static void SFX(update)(int64_t K, int64_t L, REAL lr, REAL kappa, REAL pp, REAL nu_tok, REAL nu_pos, REAL nu_q,
                        REAL *V, REAL *a, REAL *c, const REAL *dV, const REAL *Gsum, const REAL *beta,
                        const REAL *E, REAL DN) {
    REAL step = lr * kappa;
    for (int64_t k = 0; k < K; k++) a[k] = a[k] - step * (-Gsum[k] / nu_tok);
    REAL sp = step * pp;
    for (int64_t j = 0; j < L; j++) c[j] = c[j] - sp * (-beta[j] * E[j]) / nu_pos;
    c[L] = c[L] - sp * DN / nu_q;
    for (int64_t i = 0; i < K * K; i++) V[i] = V[i] + lr * dV[i];
}

static int SFX(all_finite)(const REAL *x, int64_t m) {
    int ok = 1;
    for (int64_t i = 0; i < m; i++) ok &= isfinite(x[i]) ? 1 : 0;
    return ok;
}

/* =============================== generic implementation (any K, any CPU) =============================== */

static size_t SFX(train_generic_scratch)(int64_t n, int64_t L, int64_t K) {
    return align64(sizeof(REAL) * (size_t)(K + L + K + n * K + L + K * K + K + L + 8));
}

static void SFX(train_generic)(const void *vctx, int64_t r, char *scratch) {
    const SFX(tctx) *x = (const SFX(tctx) *)vctx;
    const int64_t n = x->n, L = x->L, K = x->K, T = x->T;
    const uint8_t *tok = x->tok + r * n * L, *yy = x->y + r * n;
    REAL *V = x->V + r * K * K, *a = x->a + r * K, *c = x->c + r * (L + 1);
    const REAL lr = x->lr[r], eps = x->eps[r], w = x->w[r];
    REAL *alpha = (REAL *)scratch, *beta = alpha + K, *H = beta + L, *psi = H + K, *E = psi + n * K;
    REAL *dV = E + L, *G = dV + K * K, *Ep = G + K;
    REAL bq;
    x->bad_step[r] = -1;
    for (int64_t t = 0; t < T; t++) {
        SFX(prologue)(K, L, a, c, x->nu_tok, x->nu_pos, x->nu_q, alpha, beta, &bq);
        memset(dV, 0, sizeof(REAL) * K * K);
        memset(G, 0, sizeof(REAL) * K);
        REAL DN = 0;
        double lsum = 0;
        for (int64_t b = 0; b < n; b++) {
            const uint8_t *s = tok + b * L;
            memset(H, 0, sizeof(REAL) * K);
            for (int64_t j = 0; j < L; j++) H[s[j]] += beta[j]; /* scatter_add_ order */
            REAL Z = alpha[0] * H[0];
            for (int64_t k = 1; k < K; k++) Z += alpha[k] * H[k];
            Z = Z + bq;
            const REAL *om = V + (int64_t)yy[b] * K;
            REAL F = 0;
            for (int64_t k = 0; k < K; k++) {
                REAL h = alpha[k] * H[k] / Z;
                F = (k == 0) ? om[0] * h : F + om[k] * h;
            }
            REAL Sq = bq / Z, xe = F + eps;
            lsum += (double)LOG(xe);
            REAL g = w / xe, gz = g / Z;
            REAL *dv = dV + (int64_t)yy[b] * K, *ps = psi + b * K;
            for (int64_t k = 0; k < K; k++) {
                REAL h = alpha[k] * H[k] / Z, d = om[k] - F;
                ps[k] = gz * alpha[k] * d;
                G[k] += g * d * h;
                dv[k] += g * h;
            }
            DN += g * Sq * F;
        }
        /* gather-sum, in chunks of samples (same order for every position j) */
        memset(E, 0, sizeof(REAL) * L);
        for (int64_t b0 = 0; b0 < n; b0 += GATHER_CHUNK) {
            int64_t b1 = b0 + GATHER_CHUNK < n ? b0 + GATHER_CHUNK : n;
            memset(Ep, 0, sizeof(REAL) * L);
            for (int64_t b = b0; b < b1; b++) {
                const uint8_t *s = tok + b * L;
                const REAL *ps = psi + b * K;
                for (int64_t j = 0; j < L; j++) Ep[j] += ps[s[j]];
            }
            for (int64_t j = 0; j < L; j++) E[j] += Ep[j];
        }
        x->loss[r * T + t] = (REAL)(-lsum / (double)n);
        SFX(update)(K, L, lr, x->kappa, x->pp, x->nu_tok, x->nu_pos, x->nu_q, V, a, c, dV, G, beta, E, DN);
        if (x->bad_step[r] < 0 && !(isfinite(x->loss[r * T + t]) && SFX(all_finite)(V, K * K) &&
                                    SFX(all_finite)(a, K) && SFX(all_finite)(c, L + 1)))
            x->bad_step[r] = (int32_t)t;
    }
}

static size_t SFX(eval_generic_scratch)(int64_t n, int64_t L, int64_t K) {
    return align64(sizeof(REAL) * (size_t)(K + L + 4 * K + n * K + n + L + n * K + 8));
}

static void SFX(eval_generic)(const void *vctx, int64_t r, char *scratch) {
    const SFX(ectx) *x = (const SFX(ectx) *)vctx;
    const int64_t n = x->n, L = x->L, K = x->K;
    const uint8_t *tok = x->tok + r * n * L, *yy = x->y + r * n;
    const REAL *V = x->V + r * K * K, *a = x->a + r * K, *c = x->c + r * (L + 1), *Pr = x->P + r * n * K;
    const REAL eps = x->eps[r];
    REAL *alpha = (REAL *)scratch, *beta = alpha + K, *H = beta + L, *f = H + K, *q = f + K, *fn = q + K;
    REAL *az = fn + K, *Zb = az + n * K, *E = Zb + n, *hs = E + L;
    REAL bq;
    SFX(prologue)(K, L, a, c, x->nu_tok, x->nu_pos, x->nu_q, alpha, beta, &bq);
    REAL lsum = 0, asum = 0, klsum = 0, pdsum = 0, sqsum = 0, gmin = 0, spread = 0, elast = 0;
    const int full = x->full;
    for (int64_t b = 0; b < n; b++) {
        const uint8_t *s = tok + b * L;
        const REAL *P = Pr + b * K;
        memset(H, 0, sizeof(REAL) * K);
        /* the histogram and the spread's max_j and min_j of α[s_bj]·β_j in one pass over the positions (the
           same values as a pass of their own: a max and a min do not depend on the order) */
        REAL mx = alpha[s[0]] * beta[0], mn = mx, mx2 = mx, mn2 = mx; /* two chains each: half the latency */
        int64_t j = 0;
        for (; j + 1 < L; j += 2) {
            const REAL b0 = beta[j], b1 = beta[j + 1], v0 = alpha[s[j]] * b0, v1 = alpha[s[j + 1]] * b1;
            H[s[j]] += b0;
            H[s[j + 1]] += b1;
            mx = v0 > mx ? v0 : mx;
            mn = v0 < mn ? v0 : mn;
            mx2 = v1 > mx2 ? v1 : mx2;
            mn2 = v1 < mn2 ? v1 : mn2;
        }
        for (; j < L; j++) {
            const REAL bj = beta[j], v = alpha[s[j]] * bj;
            H[s[j]] += bj;
            mx = v > mx ? v : mx;
            mn = v < mn ? v : mn;
        }
        mx = mx2 > mx ? mx2 : mx;
        mn = mn2 < mn ? mn2 : mn;
        REAL Z = alpha[0] * H[0];
        for (int64_t k = 1; k < K; k++) Z += alpha[k] * H[k];
        Z = Z + bq;
        REAL *h = hs + b * K;
        for (int64_t k = 0; k < K; k++) h[k] = alpha[k] * H[k] / Z;
        for (int64_t o = 0; o < K; o++) {
            REAL acc = h[0] * V[o * K];
            for (int64_t i = 1; i < K; i++) acc += h[i] * V[o * K + i];
            f[o] = acc;
        }
        int64_t yb = yy[b];
        lsum += LOG(f[yb] + eps);
        int64_t best = 0;
        for (int64_t o = 1; o < K; o++)
            if (f[o] > f[best] || (f[o] != f[o] && f[best] == f[best])) best = o;
        asum += (best == yb) ? 1 : 0;
        x->pred[r * n + b] = (uint8_t)best;
        REAL next = -INFINITY;
        for (int64_t o = 0; o < K; o++)
            if (o != best) next = SFX(nanmax)(next, f[o]);
        REAL g = (K == 1) ? (REAL)INFINITY : f[best] - next;
        g = (isfinite(f[best]) && (K == 1 || isfinite(next)) && g > 0 && Z >= ZSURE) ? g : 0;
        gmin = (b == 0 || g < gmin) ? g : gmin;
        REAL qs = 0, fn2 = 0, P2 = 0;
        for (int64_t k = 0; k < K; k++) {
            q[k] = (f[k] > TINY || f[k] != f[k]) ? f[k] : TINY;
            qs = (k == 0) ? q[0] : qs + q[k];
            fn2 = (k == 0) ? f[0] * f[0] : fn2 + f[k] * f[k];
            P2 = (k == 0) ? P[0] * P[0] : P2 + P[k] * P[k];
        }
        REAL kl = 0;
        for (int64_t k = 0; k < K; k++) {
            REAL term = 0;
            if (P[k] > 0) term = P[k] * (LOG(P[k] > TINY ? P[k] : TINY) - LOG(q[k] / qs));
            kl = (k == 0) ? term : kl + term;
        }
        klsum += kl;
        REAL fnorm = SQRT(fn2), Pnorm = SQRT(P2);
        fnorm = (fnorm > TINY || fnorm != fnorm) ? fnorm : TINY;
        REAL d2 = 0;
        for (int64_t k = 0; k < K; k++) {
            REAL d = f[k] / fnorm - P[k] / Pnorm;
            d2 = (k == 0) ? d * d : d2 + d * d;
        }
        pdsum += SQRT(d2);
        sqsum += bq / Z;
        Zb[b] = Z;
        for (int64_t k = 0; k < K; k++) az[b * K + k] = alpha[k] / Z;
        REAL sp = mx / Z - mn / Z; /* the spread max_b (max_j S_bj − min_j S_bj) */
        spread = (b == 0 || sp > spread) ? sp : spread;
        elast += az[b * K + s[L - 1]]; /* E_{L−1}, in the order of the pass below */
    }
    /* mean attention per position: every position at a snapshot; else the parent column alone (above) */
    memset(E, 0, sizeof(REAL) * L);
    for (int64_t b = 0; full && b < n; b++) {
        const uint8_t *s = tok + b * L;
        const REAL *ab = az + b * K;
        for (int64_t j = 0; j < L; j++) E[j] += ab[s[j]];
    }
    const REAL nn = (REAL)n;
    x->loss[r] = -lsum / nn;
    x->acc[r] = asum / nn;
    x->kl[r] = klsum / nn;
    x->pred_dist[r] = pdsum / nn;
    x->spread[r] = spread;
    x->gap[r] = gmin;
    REAL *att = x->attention + r * (L + 1);
    for (int64_t j = 0; j < L; j++) att[j] = full ? beta[j] * E[j] / nn : NAN;
    att[L - 1] = beta[L - 1] * elast / nn;
    att[L] = sqsum / nn;
    for (int64_t k = 0; !full && k < K; k++) x->h_example[r * K + k] = x->h_var[r * K + k] = NAN;
    for (int64_t k = 0; full && k < K; k++) {
        x->h_example[r * K + k] = hs[k];
        REAL mu = 0;
        for (int64_t b = 0; b < n; b++) mu += hs[b * K + k];
        mu = mu / nn;
        REAL v = 0;
        for (int64_t b = 0; b < n; b++) {
            REAL d = hs[b * K + k] - mu;
            v += d * d;
        }
        x->h_var[r * K + k] = v / nn;
    }
}

/* ================================ AVX-512 implementation (3 ≤ K ≤ 8) ================================ */
#if RW_AVX512

#define PSTRIDE 8 /* one Ψ_b row (K ≤ 8 entries) per sample */
#define ALWAYS_INLINE static inline __attribute__((always_inline))

/* masks[blk][j][k]: bit l set when sample blk·LANES + l has token k at position j */
static void SFX(build_masks)(int64_t n, int64_t L, int64_t K, const uint8_t *tok, MASK *masks) {
    int64_t nblk = (n + LANES - 1) / LANES;
    memset(masks, 0, sizeof(MASK) * (size_t)(nblk * L * K));
    for (int64_t b = 0; b < n; b++) {
        MASK bit = (MASK)(1u << (b % LANES));
        MASK *mb = masks + (b / LANES) * L * K;
        const uint8_t *s = tok + b * L;
        for (int64_t j = 0; j < L; j++) mb[j * K + s[j]] |= bit;
    }
}

/* H[i·KMAX + k] (lanes = samples of block i) = Σ_{j: s = k} β_j in order of j, for NB consecutive blocks;
   with SPREAD, also per sample the max and min over j of α[s_bj]·β_j (the attention spread before the 1/Z_b),
   from the tokens by block tT[blk][j][lane]: lanes are samples, so no reduction across lanes is needed
   (SPREAD is a constant at every call: the compiler drops what is not asked for) */
ALWAYS_INLINE void SFX(hist_spread)(const int K, const int NB, const int SPREAD, int64_t L, const MASK *mk,
                                    const REAL *beta, const uint8_t *tT, const VEC atab, VEC *H, VEC *MX, VEC *MN) {
#pragma GCC unroll 16
    for (int i = 0; i < NB * KMAX_FAST; i++) H[i] = VZERO();
    VEC mx0 = VSET1(-INFINITY), mn0 = VSET1(INFINITY), mx1 = mx0, mn1 = mn0;
    const MASK *mk1 = mk + L * K;
    const uint8_t *tT1 = tT + L * LANES;
    const MASK all = (MASK)~(MASK)0;
    for (int64_t j = 0; j < L; j++) {
        const VEC bj = VSET1(beta[j]);
#pragma GCC unroll 8
        for (int k = 0; k < K; k++) {
            H[k] = VMASK_ADD(H[k], KLOAD(mk + j * K + k), H[k], bj);
            if (NB == 2) H[KMAX_FAST + k] = VMASK_ADD(H[KMAX_FAST + k], KLOAD(mk1 + j * K + k), H[KMAX_FAST + k], bj);
        }
        if (!SPREAD) continue;
        const VEC x0 = VMUL(VPERM(VIDX(tT + j * LANES, all), atab), bj);
        mx0 = VMAX(mx0, x0);
        mn0 = VMIN(mn0, x0);
        if (NB == 2) {
            const VEC x1 = VMUL(VPERM(VIDX(tT1 + j * LANES, all), atab), bj);
            mx1 = VMAX(mx1, x1);
            mn1 = VMIN(mn1, x1);
        }
    }
    if (!SPREAD) return;
    MX[0] = mx0, MN[0] = mn0;
    if (NB == 2) MX[1] = mx1, MN[1] = mn1;
}

ALWAYS_INLINE void SFX(hist)(const int K, const int NB, int64_t L, const MASK *mk, const REAL *beta, VEC *H) {
    SFX(hist_spread)(K, NB, 0, L, mk, beta, NULL, VZERO(), H, NULL, NULL);
}

/* the spread's max and min of one block of samples over the candidate positions only, α[s_bj] from the
   block's histogram masks (still in L1 after its histogram: reading the tokens costs a trip to memory) */
ALWAYS_INLINE void SFX(spread_candidates)(const int K, int64_t L, const MASK *mk, const VEC *alphav, const REAL *beta,
                                          const int32_t *cmax, int nmax, const int32_t *cmin, int nmin, REAL *mx,
                                          REAL *mn) {
    VEC vx = VSET1(-INFINITY), vn = VSET1(INFINITY);
    for (int i = 0; i < nmax + nmin; i++) {
        const int64_t j = i < nmax ? cmax[i] : cmin[i - nmax];
        VEC av = VZERO();
#pragma GCC unroll 8
        for (int k = 0; k < K; k++) av = VMASK_MOV(av, KLOAD(mk + j * K + k), alphav[k]);
        const VEC x = VMUL(av, VSET1(beta[j]));
        if (i < nmax)
            vx = VMAX(vx, x);
        else
            vn = VMIN(vn, x);
    }
    (void)L;
    VSTOREU(mx, vx), VSTOREU(mn, vn);
}

ALWAYS_INLINE MASK SFX(valid)(int64_t b0, int64_t n) {
    int64_t m = n - b0;
    return m >= LANES ? (MASK)~(MASK)0 : (MASK)((1u << m) - 1u);
}

/* Σ_b Ψ_b[s_bj] for positions [v0·LANES, v0·LANES + NV·LANES) ∩ [0, L): positions in the lanes */
ALWAYS_INLINE void SFX(gather_tile)(const int NV, int64_t n, int64_t L, int64_t v0, const uint8_t *tok,
                                    const REAL *psiT, REAL *E) {
    VEC acc[TILE_V], part[TILE_V];
    uint32_t lm[TILE_V];
#pragma GCC unroll 8
    for (int v = 0; v < NV; v++) {
        acc[v] = VZERO();
        int64_t rem = L - (v0 + v) * LANES;
        lm[v] = rem >= LANES ? (uint32_t)((1u << LANES) - 1u) : (uint32_t)((1u << rem) - 1u);
    }
    for (int64_t b0 = 0; b0 < n; b0 += GATHER_CHUNK) {
        int64_t b1 = b0 + GATHER_CHUNK < n ? b0 + GATHER_CHUNK : n;
#pragma GCC unroll 8
        for (int v = 0; v < NV; v++) part[v] = VZERO();
        for (int64_t b = b0; b < b1; b++) {
            const VEC tab = VTAB(psiT + b * PSTRIDE);
            const uint8_t *s = tok + b * L + v0 * LANES;
#pragma GCC unroll 8
            for (int v = 0; v < NV; v++) part[v] = VADD(part[v], VPERM(VIDX(s + v * LANES, lm[v]), tab));
        }
#pragma GCC unroll 8
        for (int v = 0; v < NV; v++) acc[v] = VADD(acc[v], part[v]);
    }
#pragma GCC unroll 8
    for (int v = 0; v < NV; v++) VMASK_STOREU(E + (v0 + v) * LANES, (MASK)lm[v], acc[v]);
}

static void SFX(gather_all)(int64_t n, int64_t L, const uint8_t *tok, const REAL *psiT, REAL *E) {
    int64_t G = (L + LANES - 1) / LANES;
    for (int64_t v0 = 0; v0 < G; v0 += TILE_V) {
        int64_t nv = G - v0 < TILE_V ? G - v0 : TILE_V;
        switch (nv) {
        case 1: SFX(gather_tile)(1, n, L, v0, tok, psiT, E); break;
        case 2: SFX(gather_tile)(2, n, L, v0, tok, psiT, E); break;
        case 3: SFX(gather_tile)(3, n, L, v0, tok, psiT, E); break;
        case 4: SFX(gather_tile)(4, n, L, v0, tok, psiT, E); break;
        case 5: SFX(gather_tile)(5, n, L, v0, tok, psiT, E); break;
        case 6: SFX(gather_tile)(6, n, L, v0, tok, psiT, E); break;
        case 7: SFX(gather_tile)(7, n, L, v0, tok, psiT, E); break;
        default: SFX(gather_tile)(8, n, L, v0, tok, psiT, E); break;
        }
    }
}

static size_t SFX(train_avx_scratch)(int64_t n, int64_t L, int64_t K) {
    int64_t nblk = (n + LANES - 1) / LANES;
    return align64(sizeof(MASK) * (size_t)(nblk * L * K)) +
           align64(sizeof(REAL) * (size_t)((nblk * LANES + 1) * PSTRIDE)) +
           align64(sizeof(REAL) * (size_t)(L + 64)) * 2 + align64(sizeof(REAL) * (size_t)(KMAX_FAST * KMAX_FAST * 3)) +
           align64(sizeof(REAL) * (size_t)(4 * KMAX_FAST * LANES)) + 4096;
}

/* per-block chain of the training step: everything after the histogram, samples in the lanes */
ALWAYS_INLINE void SFX(train_chain)(const int K, int64_t b0, int64_t n, const VEC *H, const uint8_t *yy,
                                    const VEC *alphav, const REAL *Vcol, VEC vbq, VEC veps, VEC vw, VEC *Gacc,
                                    VEC *DNacc, VEC *Lacc, double *lsum, REAL *psiT, REAL *dV, REAL *tmp) {
    const MASK vm = SFX(valid)(b0, n);
    const __m512i yi = VIDX(yy + b0, vm);
    VEC h[KMAX_FAST], om[KMAX_FAST];
    VEC Z = VMUL(alphav[0], H[0]);
#pragma GCC unroll 8
    for (int k = 1; k < K; k++) Z = VADD(Z, VMUL(alphav[k], H[k]));
    Z = VADD(Z, vbq);
    /* torch's divisions, not a reciprocal: where F + ε nears 0 (Gaussian init) g = w/(F + ε) magnifies
       every rounding of h, and α∘H·(1/Z) is 3× worse there than α∘H/Z in float32 */
    VEC F = VZERO();
#pragma GCC unroll 8
    for (int k = 0; k < K; k++) {
        h[k] = VDIV(VMUL(alphav[k], H[k]), Z);
        om[k] = VPERM(yi, VTAB(Vcol + k * PSTRIDE));
        F = (k == 0) ? VMUL(om[0], h[0]) : VADD(F, VMUL(om[k], h[k]));
    }
    const VEC Sq = VDIV(vbq, Z), xe = VADD(F, veps);
#ifdef VLOG
    *Lacc = VMASK_ADD(*Lacc, vm, *Lacc, VLOG(xe));
    (void)lsum;
#else
    {
        REAL xs[LANES];
        VSTOREU(xs, xe);
        for (int l = 0; l < LANES; l++)
            if (vm & (1u << l)) *lsum += (double)LOG(xs[l]);
        (void)Lacc;
    }
#endif
    const VEC g = VDIV(vw, xe), gz = VDIV(g, Z);
    *DNacc = VMASK_ADD(*DNacc, vm, *DNacc, VMUL(VMUL(g, Sq), F));
#pragma GCC unroll 8
    for (int k = 0; k < K; k++) {
        const VEC d = VSUB(om[k], F);
        VSTOREU(tmp + k * LANES, VMUL(VMUL(gz, alphav[k]), d));
        VSTOREU(tmp + (KMAX_FAST + k) * LANES, VMUL(g, h[k]));
        Gacc[k] = VMASK_ADD(Gacc[k], vm, Gacc[k], VMUL(VMUL(g, d), h[k]));
    }
    const int nv = (int)(n - b0 < LANES ? n - b0 : LANES);
    for (int l = 0; l < nv; l++) {
        REAL *ps = psiT + (b0 + l) * PSTRIDE, *dv = dV + (int64_t)yy[b0 + l] * K;
#pragma GCC unroll 8
        for (int k = 0; k < K; k++) {
            ps[k] = tmp[k * LANES + l];
            dv[k] += tmp[(KMAX_FAST + k) * LANES + l];
        }
    }
}

ALWAYS_INLINE void SFX(train_avx_body)(const int K, const SFX(tctx) *x, int64_t r, char *scratch) {
    const int64_t n = x->n, L = x->L, T = x->T;
    const int64_t nblk = (n + LANES - 1) / LANES;
    const uint8_t *tok = x->tok + r * n * L, *yy = x->y + r * n;
    REAL *V = x->V + r * K * K, *a = x->a + r * K, *c = x->c + r * (L + 1);
    const REAL lr = x->lr[r], eps = x->eps[r], w = x->w[r];
    char *p = scratch;
    MASK *masks = (MASK *)p;
    p += align64(sizeof(MASK) * (size_t)(nblk * L * K));
    REAL *psiT = (REAL *)p;
    p += align64(sizeof(REAL) * (size_t)((nblk * LANES + 1) * PSTRIDE));
    REAL *beta = (REAL *)p;
    p += align64(sizeof(REAL) * (size_t)(L + 64));
    REAL *E = (REAL *)p;
    p += align64(sizeof(REAL) * (size_t)(L + 64));
    REAL *Vcol = (REAL *)p, *dV = Vcol + KMAX_FAST * KMAX_FAST, *G = dV + KMAX_FAST * KMAX_FAST;
    p += align64(sizeof(REAL) * (size_t)(KMAX_FAST * KMAX_FAST * 3));
    REAL *tmp = (REAL *)p;
    REAL alpha[KMAX_FAST], bq;
    if (x->masks)
        masks = (MASK *)x->masks + r * nblk * L * K;
    else
        SFX(build_masks)(n, L, K, tok, masks);
    memset(psiT, 0, sizeof(REAL) * (size_t)((nblk * LANES + 1) * PSTRIDE));
    memset(Vcol, 0, sizeof(REAL) * KMAX_FAST * KMAX_FAST);
    x->bad_step[r] = -1;
    for (int64_t t = 0; t < T; t++) {
        SFX(prologue)(K, L, a, c, x->nu_tok, x->nu_pos, x->nu_q, alpha, beta, &bq);
        VEC alphav[KMAX_FAST], Gacc[KMAX_FAST], DNacc = VZERO(), Lacc = VZERO();
#pragma GCC unroll 8
        for (int k = 0; k < K; k++) {
            alphav[k] = VSET1(alpha[k]);
            Gacc[k] = VZERO();
            for (int i = 0; i < K; i++) Vcol[k * PSTRIDE + i] = V[i * K + k];
        }
        memset(dV, 0, sizeof(REAL) * K * K);
        const VEC vbq = VSET1(bq), veps = VSET1(eps), vw = VSET1(w);
        double lsum = 0;
        VEC H[2 * KMAX_FAST];
        int64_t blk = 0;
        for (; blk + 1 < nblk; blk += 2) {
            SFX(hist)(K, 2, L, masks + blk * L * K, beta, H);
            SFX(train_chain)(K, blk * LANES, n, H, yy, alphav, Vcol, vbq, veps, vw, Gacc, &DNacc, &Lacc, &lsum,
                             psiT, dV, tmp);
            SFX(train_chain)(K, (blk + 1) * LANES, n, H + KMAX_FAST, yy, alphav, Vcol, vbq, veps, vw, Gacc, &DNacc,
                             &Lacc, &lsum, psiT, dV, tmp);
        }
        if (blk < nblk) {
            SFX(hist)(K, 1, L, masks + blk * L * K, beta, H);
            SFX(train_chain)(K, blk * LANES, n, H, yy, alphav, Vcol, vbq, veps, vw, Gacc, &DNacc, &Lacc, &lsum,
                             psiT, dV, tmp);
        }
        SFX(gather_all)(n, L, tok, psiT, E);
#ifdef VLOG
        lsum = (double)VRED_ADD(Lacc);
#endif
        for (int k = 0; k < K; k++) G[k] = VRED_ADD(Gacc[k]);
        x->loss[r * T + t] = (REAL)(-lsum / (double)n);
        SFX(update)(K, L, lr, x->kappa, x->pp, x->nu_tok, x->nu_pos, x->nu_q, V, a, c, dV, G, beta, E,
                    VRED_ADD(DNacc));
        if (x->bad_step[r] < 0 && !(isfinite(x->loss[r * T + t]) && SFX(all_finite)(V, K * K) &&
                                    SFX(all_finite)(a, K) && SFX(all_finite)(c, L + 1)))
            x->bad_step[r] = (int32_t)t;
    }
}

#define RW_INST_TRAIN(KK) \
    static void SFX(train_avx_##KK)(const void *x, int64_t r, char *s) { SFX(train_avx_body)(KK, (const SFX(tctx) *)x, r, s); }
RW_INST_TRAIN(3)
RW_INST_TRAIN(4)
RW_INST_TRAIN(5)
RW_INST_TRAIN(6)
RW_INST_TRAIN(7)
RW_INST_TRAIN(8)
/* config.py requires K ≥ 3; K < 3 takes the generic path */
static const run_fn SFX(train_avx_fns)[9] = {NULL, NULL, NULL, SFX(train_avx_3),
                                            SFX(train_avx_4), SFX(train_avx_5), SFX(train_avx_6),
                                            SFX(train_avx_7), SFX(train_avx_8)};

/* ---- evaluation ---- */
static size_t SFX(eval_avx_scratch)(int64_t n, int64_t L, int64_t K) {
    int64_t nblk = (n + LANES - 1) / LANES;
    return align64(sizeof(MASK) * (size_t)(nblk * L * K)) +
           align64(sizeof(REAL) * (size_t)((nblk * LANES + 1) * PSTRIDE)) * 2 +
           align64(sizeof(REAL) * (size_t)(nblk * LANES)) * 4 + align64(sizeof(REAL) * (size_t)(L + 64)) * 2 +
           align64(sizeof(int32_t) * (size_t)(L + 64)) * 2 + align64(sizeof(REAL) * (size_t)(KMAX_FAST * KMAX_FAST)) +
           4096;
}

typedef struct {
    VEC L, A, KL, PD, SQ, G; /* G: the least top-2 gap of f per lane */
} SFX(eacc);

ALWAYS_INLINE void SFX(eval_chain)(const int K, int64_t b0, int64_t n, const VEC *H, const uint8_t *yy,
                                   const REAL *Pr, const VEC *alphav, const REAL *V, VEC vbq, VEC veps,
                                   SFX(eacc) *acc, REAL *azT, REAL *hT, REAL *Zb, REAL *Zr, int full,
                                   const REAL *PBr, int S, uint8_t *pred) {
    const MASK vm = SFX(valid)(b0, n);
    const __m512i yi = VIDX(yy + b0, vm);
    const VEC tiny = VSET1(TINY), one = VSET1((REAL)1), zero = VZERO();
    VEC h[KMAX_FAST], f[KMAX_FAST], P[KMAX_FAST];
    VEC Z = VMUL(alphav[0], H[0]);
#pragma GCC unroll 8
    for (int k = 1; k < K; k++) Z = VADD(Z, VMUL(alphav[k], H[k]));
    Z = VADD(Z, vbq);
    /* h = α∘H/Z exactly as torch (f = V h decides argmax ties); the outputs that feed nothing back
       (α/Z, S_q, f/‖f‖, P/‖P‖, q/Σq) multiply by one reciprocal each: ≤ 1 ulp, a third of the divisions */
    const VEC rZ = VDIV(one, Z);
#pragma GCC unroll 8
    for (int k = 0; k < K; k++) h[k] = VDIV(VMUL(alphav[k], H[k]), Z);
#pragma GCC unroll 8
    for (int o = 0; o < K; o++) {
        VEC s = VMUL(h[0], VSET1(V[o * K]));
#pragma GCC unroll 8
        for (int i = 1; i < K; i++) s = VADD(s, VMUL(h[i], VSET1(V[o * K + i])));
        f[o] = s;
    }
    /* F = f[y]; argmax with ties → first, NaN counts as the maximum (torch.argmax) */
    VEC F = f[0], best = f[0];
    __m512i bi = VISET1(0);
#pragma GCC unroll 8
    for (int o = 1; o < K; o++) {
        F = VMASK_MOV(F, VIEQ(yi, VISET1(o)), f[o]);
        MASK gt = VCMP(f[o], best, _CMP_GT_OQ) | (VCMP(f[o], f[o], _CMP_UNORD_Q) & VCMP(best, best, _CMP_ORD_Q));
        best = VMASK_MOV(best, gt, f[o]);
#if LANES == 8
        bi = _mm512_mask_mov_epi64(bi, gt, VISET1(o));
#else
        bi = _mm512_mask_mov_epi32(bi, gt, VISET1(o));
#endif
    }
    MASK hit = VIEQ(bi, yi) & vm;
    acc->A = VMASK_ADD(acc->A, hit, acc->A, one);
    /* the gap to the next f (0 on a tie or a non-finite f): where it is small, rounding may decide the argmax */
    {
        VEC next = VSET1(-INFINITY);
#pragma GCC unroll 8
        for (int o = 0; o < K; o++) next = VMASK_MAX(next, (MASK)~VIEQ(bi, VISET1(o)), next, f[o]);
        const VEC inf = VSET1(INFINITY), ninf = VSET1(-INFINITY), g = VSUB(best, next);
        const MASK ok = VCMP(best, inf, _CMP_LT_OQ) & VCMP(best, ninf, _CMP_GT_OQ) & VCMP(next, inf, _CMP_LT_OQ) &
                        VCMP(next, ninf, _CMP_GT_OQ) & VCMP(g, zero, _CMP_GT_OQ) & VCMP(Z, VSET1(ZSURE), _CMP_GE_OQ);
        acc->G = VMASK_MIN(acc->G, vm, acc->G, VMASK_MOV(zero, ok, g));
#if LANES == 8
        int64_t bs[LANES];
#else
        int32_t bs[LANES];
#endif
        _mm512_storeu_si512((void *)bs, bi);
        const int nb = (int)(n - b0 < LANES ? n - b0 : LANES);
        for (int l = 0; l < nb; l++) pred[b0 + l] = (uint8_t)bs[l];
    }
    /* true conditionals of the block's samples: P[k] lane l = Pr[(b0 + l)·K + k], from the blocked copy
       (rows P_0 … P_{K−1}, Σ_k P log P, 1/‖P‖ per block: data, so computed once per data set) or gathered */
    const REAL *pb = PBr ? PBr + (b0 / LANES) * (K + 2 + 2 * S) * LANES : NULL;
    if (pb) {
#pragma GCC unroll 8
        for (int k = 0; k < K; k++) P[k] = VLOADU(pb + k * LANES);
    } else {
        const __m512i base = _mm512_mullo_epi32(VIOTA(), _mm512_set1_epi32(K));
#pragma GCC unroll 8
        for (int k = 0; k < K; k++)
            P[k] = VGATHER(zero, vm, _mm512_add_epi32(base, _mm512_set1_epi32(k)), Pr + b0 * K);
    }
    /* KL(P ‖ q), q = max(f, tiny) / Σ; pred_dist = ‖f/max(‖f‖, tiny) − P/‖P‖‖ */
    VEC q[KMAX_FAST], qs = zero, fn2 = zero, P2 = zero;
#pragma GCC unroll 8
    for (int k = 0; k < K; k++) {
        q[k] = VMAX(tiny, f[k]); /* = f unless f < tiny; NaN stays NaN (clamp_min) */
        qs = (k == 0) ? q[0] : VADD(qs, q[k]);
        fn2 = (k == 0) ? VMUL(f[0], f[0]) : VADD(fn2, VMUL(f[k], f[k]));
        P2 = (k == 0) ? VMUL(P[0], P[0]) : VADD(P2, VMUL(P[k], P[k]));
    }
    VEC kl = zero;
    const VEC rqs = VDIV(one, qs);
#ifdef VLOG
    acc->L = VMASK_ADD(acc->L, vm, acc->L, VLOG(VADD(F, veps)));
    if (pb) { /* KL = Σ P log P − Σ_{P>0} P log q over each sample's support (k ascending): S logs, not 2K */
        VEC cross = zero;
        for (int i = 0; i < S; i++) {
            const VEC idx = VLOADU(pb + (K + 2 + 2 * i) * LANES), Pi = VLOADU(pb + (K + 3 + 2 * i) * LANES);
            VEC qi = q[0];
#pragma GCC unroll 8
            for (int k = 1; k < K; k++) qi = VMASK_MOV(qi, VCMP(idx, VSET1((REAL)k), _CMP_EQ_OQ), q[k]);
            cross = VMASK_ADD(cross, VCMP(Pi, zero, _CMP_GT_OQ), cross, VMUL(Pi, VLOG(VMUL(qi, rqs))));
        }
        kl = VSUB(VLOADU(pb + K * LANES), cross);
    } else {
#pragma GCC unroll 8
        for (int k = 0; k < K; k++) {
            MASK pos = VCMP(P[k], zero, _CMP_GT_OQ);
            VEC term = VMUL(P[k], VSUB(VLOG(VMAX(tiny, P[k])), VLOG(VMUL(q[k], rqs))));
            term = VMASK_MOV(zero, pos, term);
            kl = (k == 0) ? term : VADD(kl, term);
        }
    }
#else
    {
        REAL xs[LANES], Ps[LANES], qq[LANES], ss[LANES], ks[LANES] = {0};
        (void)rqs;
        VSTOREU(xs, VADD(F, veps));
        VEC lv = zero;
        REAL ls[LANES] = {0};
        for (int l = 0; l < LANES; l++)
            if (vm & (1u << l)) ls[l] = LOG(xs[l]);
        lv = VLOADU(ls);
        acc->L = VMASK_ADD(acc->L, vm, acc->L, lv);
        VSTOREU(ss, qs);
        for (int k = 0; k < K; k++) {
            VSTOREU(Ps, P[k]);
            VSTOREU(qq, q[k]);
            for (int l = 0; l < LANES; l++) {
                REAL term = 0;
                if ((vm & (1u << l)) && Ps[l] > 0)
                    term = Ps[l] * (LOG(Ps[l] > TINY ? Ps[l] : TINY) - LOG(qq[l] / ss[l]));
                ks[l] = (k == 0) ? term : ks[l] + term;
            }
        }
        kl = VLOADU(ks);
    }
#endif
    acc->KL = VMASK_ADD(acc->KL, vm, acc->KL, kl);
    const VEC rfn = VDIV(one, VMAX(tiny, VSQRT(fn2))), rPn = pb ? VLOADU(pb + (K + 1) * LANES) : VDIV(one, VSQRT(P2));
    VEC d2 = zero;
#pragma GCC unroll 8
    for (int k = 0; k < K; k++) {
        VEC d = VSUB(VMUL(f[k], rfn), VMUL(P[k], rPn));
        d2 = (k == 0) ? VMUL(d, d) : VADD(d2, VMUL(d, d));
    }
    acc->PD = VMASK_ADD(acc->PD, vm, acc->PD, VSQRT(d2));
    acc->SQ = VMASK_ADD(acc->SQ, vm, acc->SQ, VMUL(vbq, rZ));
    /* per-sample rows for the gather pass (α/Z), the spread (Z) and h's mean and variance */
    VSTOREU(Zb + b0, Z);
    VSTOREU(Zr + b0, rZ);
    if (!full) return; /* α/Z and h per sample feed the snapshot's attention, X·S and its variance only */
    REAL tmp[2 * KMAX_FAST * LANES];
#pragma GCC unroll 8
    for (int k = 0; k < K; k++) {
        VSTOREU(tmp + k * LANES, VMUL(alphav[k], rZ));
        VSTOREU(tmp + (KMAX_FAST + k) * LANES, h[k]);
    }
    const int nv = (int)(n - b0 < LANES ? n - b0 : LANES);
    for (int l = 0; l < nv; l++)
        for (int k = 0; k < K; k++) azT[(b0 + l) * PSTRIDE + k] = tmp[k * LANES + l];
    for (int l = 0; l < nv; l++)
        for (int k = 0; k < K; k++) hT[(b0 + l) * PSTRIDE + k] = tmp[(KMAX_FAST + k) * LANES + l];
}

/* one copy with a run-time K: the evaluation chain is not hot, and six unrolled copies per dtype would
   double the compile time; only the histogram (the hot part) is specialised on K */
static __attribute__((noinline)) void SFX(eval_chain_rt)(int K, int64_t b0, int64_t n, const VEC *H,
                                                         const uint8_t *yy, const REAL *Pr, const VEC *alphav,
                                                         const REAL *V, VEC vbq, VEC veps, SFX(eacc) *acc,
                                                         REAL *azT, REAL *hT, REAL *Zb, REAL *Zr, int full,
                                                         const REAL *PBr, int S, uint8_t *pred) {
    SFX(eval_chain)(K, b0, n, H, yy, Pr, alphav, V, vbq, veps, acc, azT, hT, Zb, Zr, full, PBr, S, pred);
}

/* the eval gather pass: E_j = Σ_b (α/Z_b)[s_bj]; per sample the max and min over j of α[s_bj]·β_j */
ALWAYS_INLINE void SFX(eval_tile)(const int NV, int64_t n, int64_t L, int64_t v0, const uint8_t *tok,
                                  const REAL *azT, const VEC atab, const REAL *beta, REAL *E, REAL *mx, REAL *mn) {
    VEC acc[TILE_V], bv[TILE_V];
    uint32_t lm[TILE_V];
#pragma GCC unroll 8
    for (int v = 0; v < NV; v++) {
        acc[v] = VZERO();
        int64_t rem = L - (v0 + v) * LANES;
        lm[v] = rem >= LANES ? (uint32_t)((1u << LANES) - 1u) : (uint32_t)((1u << rem) - 1u);
        bv[v] = VLOADU(beta + (v0 + v) * LANES); /* beta is padded: lanes past L are never used */
    }
    for (int64_t b = 0; b < n; b++) {
        const VEC tab = VTAB(azT + b * PSTRIDE);
        const uint8_t *s = tok + b * L + v0 * LANES;
        VEC vmax = VSET1(-INFINITY), vmin = VSET1(INFINITY);
#pragma GCC unroll 8
        for (int v = 0; v < NV; v++) {
            const __m512i idx = VIDX(s + v * LANES, lm[v]);
            acc[v] = VADD(acc[v], VPERM(idx, tab));
            const VEC xa = VMUL(VPERM(idx, atab), bv[v]);
            vmax = VMASK_MAX(vmax, (MASK)lm[v], vmax, xa);
            vmin = VMASK_MIN(vmin, (MASK)lm[v], vmin, xa);
        }
        const REAL tmx = VRED_MAX(vmax), tmn = VRED_MIN(vmin);
        if (v0 == 0 || tmx > mx[b]) mx[b] = tmx;
        if (v0 == 0 || tmn < mn[b]) mn[b] = tmn;
    }
#pragma GCC unroll 8
    for (int v = 0; v < NV; v++) VMASK_STOREU(E + (v0 + v) * LANES, (MASK)lm[v], acc[v]);
}

static __attribute__((noinline)) void SFX(eval_tiles)(int K, int64_t n, int64_t L, const uint8_t *tok, const REAL *azT,
                                                     const REAL *alpha, const REAL *beta, REAL *E, REAL *mx, REAL *mn) {
    REAL atab_s[PSTRIDE] = {0};
    for (int k = 0; k < K; k++) atab_s[k] = alpha[k];
    const VEC atab = VTAB(atab_s);
    int64_t G = (L + LANES - 1) / LANES;
    for (int64_t v0 = 0; v0 < G; v0 += TILE_V) {
        int64_t nv = G - v0 < TILE_V ? G - v0 : TILE_V;
        switch (nv) {
        case 1: SFX(eval_tile)(1, n, L, v0, tok, azT, atab, beta, E, mx, mn); break;
        case 2: SFX(eval_tile)(2, n, L, v0, tok, azT, atab, beta, E, mx, mn); break;
        case 3: SFX(eval_tile)(3, n, L, v0, tok, azT, atab, beta, E, mx, mn); break;
        case 4: SFX(eval_tile)(4, n, L, v0, tok, azT, atab, beta, E, mx, mn); break;
        case 5: SFX(eval_tile)(5, n, L, v0, tok, azT, atab, beta, E, mx, mn); break;
        case 6: SFX(eval_tile)(6, n, L, v0, tok, azT, atab, beta, E, mx, mn); break;
        case 7: SFX(eval_tile)(7, n, L, v0, tok, azT, atab, beta, E, mx, mn); break;
        default: SFX(eval_tile)(8, n, L, v0, tok, azT, atab, beta, E, mx, mn); break;
        }
    }
}

ALWAYS_INLINE void SFX(eval_avx_body)(const int K, const SFX(ectx) *x, int64_t r, char *scratch) {
    const int64_t n = x->n, L = x->L;
    const int64_t nblk = (n + LANES - 1) / LANES;
    const uint8_t *tok = x->tok + r * n * L, *yy = x->y + r * n;
    const REAL *V = x->V + r * K * K, *a = x->a + r * K, *c = x->c + r * (L + 1), *Pr = x->P + r * n * K;
    char *p = scratch;
    MASK *masks = (MASK *)p;
    p += align64(sizeof(MASK) * (size_t)(nblk * L * K));
    REAL *azT = (REAL *)p;
    p += align64(sizeof(REAL) * (size_t)((nblk * LANES + 1) * PSTRIDE));
    REAL *hT = (REAL *)p;
    p += align64(sizeof(REAL) * (size_t)((nblk * LANES + 1) * PSTRIDE));
    REAL *Zb = (REAL *)p;
    p += align64(sizeof(REAL) * (size_t)(nblk * LANES));
    REAL *mx = (REAL *)p;
    p += align64(sizeof(REAL) * (size_t)(nblk * LANES));
    REAL *mn = (REAL *)p;
    p += align64(sizeof(REAL) * (size_t)(nblk * LANES));
    REAL *beta = (REAL *)p;
    p += align64(sizeof(REAL) * (size_t)(L + 64));
    REAL *E = (REAL *)p;
    p += align64(sizeof(REAL) * (size_t)(L + 64));
    REAL *Zr = (REAL *)p;
    p += align64(sizeof(REAL) * (size_t)(nblk * LANES));
    int32_t *cmax = (int32_t *)p;
    p += align64(sizeof(int32_t) * (size_t)(L + 64));
    int32_t *cmin = (int32_t *)p;
    REAL alpha[KMAX_FAST] = {0}, bq;
    if (x->masks)
        masks = (MASK *)x->masks + r * nblk * L * K;
    else
        SFX(build_masks)(n, L, K, tok, masks);
    const uint8_t *tT = x->tokT ? x->tokT + r * nblk * L * LANES : NULL;
    const int S = x->S;
    const REAL *PBr = x->PB ? x->PB + r * nblk * (K + 2 + 2 * S) * LANES : NULL;
    const int full = x->full || tT == NULL;
    if (full) memset(azT, 0, sizeof(REAL) * (size_t)((nblk * LANES + 1) * PSTRIDE));
    memset(beta, 0, sizeof(REAL) * (size_t)(L + 64));
    SFX(prologue)(K, L, a, c, x->nu_tok, x->nu_pos, x->nu_q, alpha, beta, &bq);
    REAL atab_s[PSTRIDE] = {0};
    for (int k = 0; k < K; k++) atab_s[k] = alpha[k];
    const VEC atab = VTAB(atab_s);
    VEC alphav[KMAX_FAST];
#pragma GCC unroll 8
    for (int k = 0; k < K; k++) alphav[k] = VSET1(alpha[k]);
    const VEC vbq = VSET1(bq), veps = VSET1(x->eps[r]);
    SFX(eacc) acc = {VZERO(), VZERO(), VZERO(), VZERO(), VZERO(), VSET1(INFINITY)};
    uint8_t *pred = x->pred + r * n;
    /* The spread's max_j and min_j of α[s_bj]·β_j per sample, exactly, at the least cost:
       - α uniform (Thm 4.1's trap, zero init on a constant histogram): α·max β and α·min β, for every sample;
       - else only positions that can win: j with α_max·β_j < α_min·β_max is beaten at argmax β by every
         sample (rounding is monotone), and likewise for the min; when few positions can, one short pass each;
       - else inside the histogram pass (non-finite α or β too, so NaN spreads as it would). */
    int mode = 2, nmax = 0, nmin = 0; /* 0 uniform α, 1 candidates, 2 in the histogram pass */
    REAL amax = alpha[0], amin = alpha[0], bmax = beta[0], bmin = beta[0];
    if (tT) {
        int finite = 1;
        for (int k = 0; k < K; k++) {
            finite &= isfinite(alpha[k]) != 0;
            amax = alpha[k] > amax ? alpha[k] : amax, amin = alpha[k] < amin ? alpha[k] : amin;
        }
        for (int64_t j = 0; j < L; j++) {
            finite &= isfinite(beta[j]) != 0;
            bmax = beta[j] > bmax ? beta[j] : bmax, bmin = beta[j] < bmin ? beta[j] : bmin;
        }
        if (finite && amax == amin) {
            mode = 0;
        } else if (finite) {
            const REAL top = amin * bmax, bottom = amax * bmin;
            for (int64_t j = 0; j < L; j++) {
                if (amax * beta[j] >= top) cmax[nmax++] = (int32_t)j;
                if (amin * beta[j] <= bottom) cmin[nmin++] = (int32_t)j;
            }
            mode = nmax + nmin < L ? 1 : 2;
        }
    }
    if (mode == 0) {
        const REAL hi = amax * bmax, lo = amax * bmin;
        for (int64_t b = 0; b < nblk * LANES; b++) mx[b] = hi, mn[b] = lo;
    }
    /* the histogram accumulates in H, which stays in registers; the out-of-line chain gets a copy (an
       array whose address escapes would be stored back to memory on every masked add: 2.5× slower).
       With the tokens by block, the same pass gives every sample's spread (no gather pass but at the
       snapshot steps, whose full attention needs it). */
    VEC H[2 * KMAX_FAST], Hc[2 * KMAX_FAST], MX[2], MN[2];
    int64_t blk = 0;
    for (; blk + 1 < nblk; blk += 2) {
        if (mode == 2 && tT) {
            SFX(hist_spread)(K, 2, 1, L, masks + blk * L * K, beta, tT + blk * L * LANES, atab, H, MX, MN);
            VSTOREU(mx + blk * LANES, MX[0]), VSTOREU(mx + (blk + 1) * LANES, MX[1]);
            VSTOREU(mn + blk * LANES, MN[0]), VSTOREU(mn + (blk + 1) * LANES, MN[1]);
        } else {
            SFX(hist)(K, 2, L, masks + blk * L * K, beta, H);
            if (mode == 1)
                for (int64_t b = blk; b < blk + 2; b++)
                    SFX(spread_candidates)(K, L, masks + b * L * K, alphav, beta, cmax, nmax, cmin, nmin,
                                           mx + b * LANES, mn + b * LANES);
        }
#pragma GCC unroll 16
        for (int i = 0; i < 2 * KMAX_FAST; i++) Hc[i] = H[i];
        SFX(eval_chain_rt)(K, blk * LANES, n, Hc, yy, Pr, alphav, V, vbq, veps, &acc, azT, hT, Zb, Zr, full, PBr, S,
                           pred);
        SFX(eval_chain_rt)(K, (blk + 1) * LANES, n, Hc + KMAX_FAST, yy, Pr, alphav, V, vbq, veps, &acc, azT, hT,
                           Zb, Zr, full, PBr, S, pred);
    }
    if (blk < nblk) {
        if (mode == 2 && tT) {
            SFX(hist_spread)(K, 1, 1, L, masks + blk * L * K, beta, tT + blk * L * LANES, atab, H, MX, MN);
            VSTOREU(mx + blk * LANES, MX[0]), VSTOREU(mn + blk * LANES, MN[0]);
        } else {
            SFX(hist)(K, 1, L, masks + blk * L * K, beta, H);
            if (mode == 1)
                SFX(spread_candidates)(K, L, masks + blk * L * K, alphav, beta, cmax, nmax, cmin, nmin,
                                       mx + blk * LANES, mn + blk * LANES);
        }
#pragma GCC unroll 16
        for (int i = 0; i < KMAX_FAST; i++) Hc[i] = H[i];
        SFX(eval_chain_rt)(K, blk * LANES, n, Hc, yy, Pr, alphav, V, vbq, veps, &acc, azT, hT, Zb, Zr, full, PBr, S,
                           pred);
    }
    if (full) {
        SFX(eval_tiles)(K, n, L, tok, azT, alpha, beta, E, mx, mn);
    } else { /* (α/Z_b)[s_b,L−1] of every sample, a block at a time, for the parent column (below) */
        for (int64_t b = 0; b < nblk; b++)
            VSTOREU(Zr + b * LANES, VMUL(VPERM(VIDX(tT + (b * L + L - 1) * LANES, (MASK)~(MASK)0), atab),
                                         VLOADU(Zr + b * LANES)));
    }
    /* max_b (mx_b/Z_b − mn_b/Z_b): the divisions (torch's S = αβ/Z, then amax − amin) a vector at a time */
    REAL spread = 0;
    {
        VEC vs = VSET1(-INFINITY);
        int64_t b = 0;
        for (; b + LANES <= n; b += LANES) {
            const VEC z = VLOADU(Zb + b);
            vs = VMAX(vs, VSUB(VDIV(VLOADU(mx + b), z), VDIV(VLOADU(mn + b), z)));
        }
        spread = n >= LANES ? VRED_MAX(vs) : 0;
        for (; b < n; b++) {
            REAL sp = mx[b] / Zb[b] - mn[b] / Zb[b];
            spread = (b == 0 || sp > spread) ? sp : spread;
        }
    }
    const REAL nn = (REAL)n;
    x->loss[r] = -VRED_ADD(acc.L) / nn;
    x->acc[r] = VRED_ADD(acc.A) / nn;
    x->kl[r] = VRED_ADD(acc.KL) / nn;
    x->pred_dist[r] = VRED_ADD(acc.PD) / nn;
    x->spread[r] = spread;
    x->gap[r] = VRED_MIN(acc.G);
    REAL *att = x->attention + r * (L + 1);
    if (full) {
        for (int64_t j = 0; j < L; j++) att[j] = beta[j] * E[j] / nn;
    } else { /* the parent column alone: E_{L−1} = Σ_b (α/Z_b)[s_b,L−1], summed in the gather pass's order */
        REAL e = 0;
        for (int64_t b = 0; b < n; b++) e += Zr[b];
        for (int64_t j = 0; j < L - 1; j++) att[j] = NAN;
        att[L - 1] = beta[L - 1] * e / nn;
    }
    att[L] = VRED_ADD(acc.SQ) / nn;
    /* h's mean and variance over samples, every k at once (k innermost: the same sums, in the same order,
       as one k at a time, without a strided dependency chain per k) */
    if (!full) {
        for (int k = 0; k < K; k++) x->h_example[r * K + k] = x->h_var[r * K + k] = NAN;
        return;
    }
    REAL mu[PSTRIDE] = {0}, var[PSTRIDE] = {0};
    for (int64_t b = 0; b < n; b++)
        for (int k = 0; k < K; k++) mu[k] += hT[b * PSTRIDE + k];
    for (int k = 0; k < K; k++) mu[k] = mu[k] / nn;
    for (int64_t b = 0; b < n; b++)
        for (int k = 0; k < K; k++) {
            const REAL d = hT[b * PSTRIDE + k] - mu[k];
            var[k] += d * d;
        }
    for (int k = 0; k < K; k++) {
        x->h_example[r * K + k] = hT[k];
        x->h_var[r * K + k] = var[k] / nn;
    }
}

#define RW_INST_EVAL(KK) \
    static void SFX(eval_avx_##KK)(const void *x, int64_t r, char *s) { SFX(eval_avx_body)(KK, (const SFX(ectx) *)x, r, s); }
RW_INST_EVAL(3)
RW_INST_EVAL(4)
RW_INST_EVAL(5)
RW_INST_EVAL(6)
RW_INST_EVAL(7)
RW_INST_EVAL(8)
static const run_fn SFX(eval_avx_fns)[9] = {NULL, NULL, NULL, SFX(eval_avx_3),
                                           SFX(eval_avx_4), SFX(eval_avx_5), SFX(eval_avx_6),
                                           SFX(eval_avx_7), SFX(eval_avx_8)};
typedef struct {
    int64_t n, L, K;
    const uint8_t *tok;
    MASK *out;
} SFX(mctx);

static void SFX(masks_run)(const void *vctx, int64_t r, char *scratch) {
    const SFX(mctx) *x = (const SFX(mctx) *)vctx;
    int64_t nblk = (x->n + LANES - 1) / LANES;
    (void)scratch;
    SFX(build_masks)(x->n, x->L, x->K, x->tok + r * x->n * x->L, x->out + r * nblk * x->L * x->K);
}
#undef PSTRIDE
#undef ALWAYS_INLINE
#endif /* RW_AVX512 */

/* Bytes of the histogram masks of one run for the AVX-512 path, 0 where that path does not apply. */
int64_t SFX(rw_masks_bytes)(int64_t n, int64_t L, int64_t K) {
#if RW_AVX512
    if (K >= 3 && K <= KMAX_FAST) return (int64_t)sizeof(MASK) * ((n + LANES - 1) / LANES) * L * K;
#endif
    (void)n, (void)L, (void)K;
    return 0;
}

/* The masks of R runs (to reuse across calls that see the same tokens: one step at a time, evaluations). */
int SFX(rw_masks)(int64_t R, int64_t n, int64_t L, int64_t K, const uint8_t *tok, void *out, int nthreads) {
    if (SFX(rw_masks_bytes)(n, L, K) == 0 || R < 0) return 2;
#if RW_AVX512
    SFX(mctx) x = {n, L, K, tok, (MASK *)out};
    return parallel_runs(SFX(masks_run), &x, R, 64, nthreads);
#else
    (void)tok, (void)out, (void)nthreads;
    return 2;
#endif
}

/* ============================================ entry points ============================================ */

/* impl: 0 = the fastest available, 1 = generic. Returns 0 on success, 2 on bad arguments, 1 on failure. */
int SFX(rw_train)(const rw_train_args *A) {
    const int64_t R = A->R, n = A->n, L = A->L, K = A->K, T = A->T;
    int32_t *bad_step = A->bad_step;
    const int nthreads = A->nthreads, impl = A->impl;
    if (R < 0 || n < 1 || L < 1 || K < 1 || K > 127 || T < 0) return 2;
    if (R == 0 || T == 0) {
        for (int64_t r = 0; r < R; r++) bad_step[r] = -1;
        return 0;
    }
    SFX(tctx) x = {R, n, L, K, T, A->tok, A->y, (REAL *)A->V, (REAL *)A->a, (REAL *)A->c, (const REAL *)A->lr,
                   (const REAL *)A->eps, (const REAL *)A->w, (REAL)A->kappa, (REAL)A->pp, (REAL)A->nu_tok,
                   (REAL)A->nu_pos, (REAL)A->nu_q, (REAL *)A->loss, bad_step, A->masks};
#if RW_AVX512
    if (impl == 0 && K >= 3 && K <= KMAX_FAST)
        return parallel_runs(SFX(train_avx_fns)[K], &x, R, SFX(train_avx_scratch)(n, L, K), nthreads);
#endif
    (void)impl;
    return parallel_runs(SFX(train_generic), &x, R, SFX(train_generic_scratch)(n, L, K), nthreads);
}

int SFX(rw_eval)(const rw_eval_args *A) {
    const int64_t R = A->R, n = A->n, L = A->L, K = A->K;
    const int nthreads = A->nthreads, impl = A->impl;
    if (R < 0 || n < 1 || L < 1 || K < 1 || K > 127) return 2;
    if (R == 0) return 0;
    SFX(ectx) x = {R, n, L, K, A->tok, A->y, (const REAL *)A->P, (const REAL *)A->V, (const REAL *)A->a,
                   (const REAL *)A->c, (const REAL *)A->eps, (REAL)A->nu_tok, (REAL)A->nu_pos, (REAL)A->nu_q,
                   (REAL *)A->loss, (REAL *)A->acc, (REAL *)A->kl, (REAL *)A->pred_dist, (REAL *)A->attention,
                   (REAL *)A->spread, (REAL *)A->h_example, (REAL *)A->h_var, A->pred, (REAL *)A->gap, A->masks,
                   A->tokT, A->full, (const REAL *)A->PB, A->S};
#if RW_AVX512
    if (impl == 0 && K >= 3 && K <= KMAX_FAST)
        return parallel_runs(SFX(eval_avx_fns)[K], &x, R, SFX(eval_avx_scratch)(n, L, K), nthreads);
#endif
    (void)impl;
    return parallel_runs(SFX(eval_generic), &x, R, SFX(eval_generic_scratch)(n, L, K), nthreads);
}

#endif /* RW_PASS */
