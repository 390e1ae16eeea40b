/* Causal softmax attention, forward and backward, for model=gpt on a CPU (attention.py is its Python side).
 *
 *   S_ij = scale·q_i·k_j (j <= i),  P_i = softmax_j(S_i),  y_i = Σ_j P_ij v_j,  lse_i = log Σ_j exp(S_ij)
 *
 * over n independent (T, dh) sequences (a run's batch × heads). The forward keeps only lse (T a sequence); the
 * backward recomputes P from it, as flash attention does, so no T×T map is ever held, whatever T:
 *
 *   D_i = dy_i·y_i,  G_ij = P_ij (dy_i·v_j − D_i)·scale,  dq_i = Σ_j G_ij k_j,  dk_j = Σ_i G_ij q_i,
 *   dv_j = Σ_i P_ij dy_i.
 *
 * Why it is fast at the sizes model=gpt trains (T ~ 64 to 1,024, heads 8 wide): LANES sequences run side by side,
 * one per vector lane, laid out [position][feature][lane]. Every loop has the same trip count in every lane
 * (causal masks are the same), so the innermost loop — over the lanes — vectorises fully whatever T and dh,
 * with no horizontal sums; torch's fused kernel vectorises along dh = 8. exp is a polynomial in plain
 * arithmetic (vexp) so that it vectorises too. Lanes never mix: a non-finite sequence leaves every other one as
 * it was. The lane groups are split over the threads; with fewer groups than threads (one run's batch of long
 * sequences) each group's row blocks are, dq by query rows and dk, dv by keys, each sum taken in the same order
 * as by one thread: the thread count changes no bit (tests/test_gpt_attention.py).
 *
 * The inputs are read where the model's one q/k/v product left them, and y written with the heads side by side
 * (`layout` below), so that nothing is copied on the way in or out.
 *
 * RW_ONLY=64 or 32 compiles one dtype (the build compiles both side by side and links them, as fused.c). */
#ifndef ATT_REAL
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define LANES 16
#define ROWS 4 /* query rows a backward pass takes together */
#define MAX_THREADS 256

/* exp(x) for x <= 0 (shifted logits): x = n·ln2 + r, |r| <= ln2/2, e^r by its Taylor series (truncation below
 * the dtype's rounding: degree 13 for double, 7 for float), 2^n from the exponent bits. Below the smallest
 * normal exponent the result is clamped there (e^-708, e^-87), nothing next to a softmax sum, which is >= 1. */
static inline double vexp_f64(double x) {
  x = x < -708.0 ? -708.0 : x;
  const double shift = 0x1.8p52;
  double t = x * 1.4426950408889634 + shift, n = t - shift;
  double r = (x - n * 6.93147180369123816490e-01) - n * 1.90821492927058770002e-10;
  double p = 1.0 / 6227020800.0;
  p = p * r + 1.0 / 479001600.0; p = p * r + 1.0 / 39916800.0; p = p * r + 1.0 / 3628800.0;
  p = p * r + 1.0 / 362880.0; p = p * r + 1.0 / 40320.0; p = p * r + 1.0 / 5040.0; p = p * r + 1.0 / 720.0;
  p = p * r + 1.0 / 120.0; p = p * r + 1.0 / 24.0; p = p * r + 1.0 / 6.0; p = p * r + 0.5; p = p * r + 1.0;
  p = p * r + 1.0;
  union { double d; int64_t i; } u = {t}, s;
  s.i = (u.i + 1023) << 52; /* the low bits of t hold n */
  return p * s.d;
}
static inline float vexp_f32(float x) {
  x = x < -87.0f ? -87.0f : x;
  const float shift = 0x1.8p23f;
  float t = x * 1.44269504f + shift, n = t - shift;
  float r = (x - n * 0.693145752f) - n * 1.42860677e-06f;
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f; p = p * r + 1.0f / 120.0f; p = p * r + 1.0f / 24.0f; p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f; p = p * r + 1.0f; p = p * r + 1.0f;
  union { float d; int32_t i; } u = {t}, s;
  s.i = (u.i + 127) << 23;
  return p * s.d;
}

#if !defined(RW_ONLY) || RW_ONLY == 64
#define ATT_REAL double
#define ATT_SFX(name) name##_f64
#define VEXP vexp_f64
#include "attention.c" /* itself, once per dtype */
#undef ATT_REAL
#undef ATT_SFX
#undef VEXP
#endif
#if !defined(RW_ONLY) || RW_ONLY == 32
#define ATT_REAL float
#define ATT_SFX(name) name##_f32
#define VEXP vexp_f32
#include "attention.c"
#endif

#else /* ------------------------------------------------------------------------------ one dtype: ATT_REAL */
#define L LANES
typedef ATT_REAL ATT_SFX(real);
#define real ATT_SFX(real)

/* MINE: whether the ROWS-block of row (or key) t is this part's, of `parts` splitting one group's rows */
#define MINE(t) (((t) / ROWS) % parts == part)

static inline __attribute__((always_inline)) void ATT_SFX(fwd_group)(int T, int dh, const real *restrict Q, const real *restrict K,
                               const real *restrict V, real *restrict Y, real *restrict lse, real scale,
                               real *restrict s, real *restrict acc, int part, int parts) {
  for (int i = 0; i < T; i++) {
    if (!MINE(i)) continue;
    const real *qi = Q + (size_t)i * dh * L;
    real m[L], sum[L];
    for (int l = 0; l < L; l++) { m[l] = -INFINITY; sum[l] = 0; }
    for (int j = 0; j <= i; j++) {
      const real *kj = K + (size_t)j * dh * L;
      real a[L];
      for (int l = 0; l < L; l++) a[l] = 0;
      for (int d = 0; d < dh; d++)
        for (int l = 0; l < L; l++) a[l] += qi[d * L + l] * kj[d * L + l];
      for (int l = 0; l < L; l++) { real x = a[l] * scale; s[j * L + l] = x; m[l] = x > m[l] ? x : m[l]; }
    }
    for (int e = 0; e < dh * L; e++) acc[e] = 0;
    for (int j = 0; j <= i; j++) {
      const real *vj = V + (size_t)j * dh * L;
      real p[L];
      for (int l = 0; l < L; l++) { p[l] = VEXP(s[j * L + l] - m[l]); sum[l] += p[l]; }
      for (int d = 0; d < dh; d++)
        for (int l = 0; l < L; l++) acc[d * L + l] += p[l] * vj[d * L + l];
    }
    real *yi = Y + (size_t)i * dh * L;
    for (int d = 0; d < dh; d++)
      for (int l = 0; l < L; l++) yi[d * L + l] = acc[d * L + l] / sum[l];
    for (int l = 0; l < L; l++) lse[i * L + l] = m[l] + log(sum[l]);
  }
}

/* One (query row i, key j) pair of the backward, for every lane: p = P_ij (from i's log-sum-exp) and
   g = G_ij = p·(dy_i·v_j − D_i)·scale. Both passes below take every pair through here, so they agree bit for bit. */
static inline __attribute__((always_inline)) void ATT_SFX(pair)(int dh, const real *restrict qi,
    const real *restrict dyi, const real *restrict kj, const real *restrict vj, const real *restrict li,
    const real *restrict Di, real scale, real *restrict p, real *restrict g) {
  real a[L], b[L];
  for (int l = 0; l < L; l++) { a[l] = 0; b[l] = 0; }
  for (int d = 0; d < dh; d++)
    for (int l = 0; l < L; l++) { a[l] += qi[d * L + l] * kj[d * L + l]; b[l] += dyi[d * L + l] * vj[d * L + l]; }
  for (int l = 0; l < L; l++) { p[l] = VEXP(a[l] * scale - li[l]); g[l] = p[l] * (b[l] - Di[l]) * scale; }
}

/* a pair's terms of dk_j and dv_j: gk += g·q_i, gv += p·dy_i */
static inline __attribute__((always_inline)) void ATT_SFX(to_key)(int dh, const real *restrict qi,
    const real *restrict dyi, const real *restrict p, const real *restrict g, real *restrict gk, real *restrict gv) {
  for (int d = 0; d < dh; d++)
    for (int l = 0; l < L; l++) { gk[d * L + l] += g[l] * qi[d * L + l]; gv[d * L + l] += p[l] * dyi[d * L + l]; }
}

/* The backward pass. Whole (parts = 1): ROWS query rows at a time, each key's k_j, v_j read and its dk_j, dv_j
   written once for all of them. Split (parts > 1, a group's rows shared by threads when there are fewer groups
   than threads): part `part` computes dq for its row blocks (bwd_rows, whole = 0) and dk, dv for its key blocks
   (bwd_keys), each sum in the same order as the whole pass, so the results are the same bits. */
static inline __attribute__((always_inline)) void ATT_SFX(bwd_rows)(int T, int dh, const real *restrict Q,
    const real *restrict K, const real *restrict V, const real *restrict dY, const real *restrict lse,
    const real *restrict Dr, real *restrict dQ, real *restrict dK, real *restrict dV, real *restrict gk,
    real *restrict gv, real scale, int part, int parts, int whole) {
  const size_t w = (size_t)dh * L; /* one position's features × lanes */
  if (whole) {
    memset(dK, 0, sizeof(real) * T * w);
    memset(dV, 0, sizeof(real) * T * w);
  }
  for (int i0 = 0; i0 < T; i0 += ROWS) {
    if (!MINE(i0)) continue;
    int nr = T - i0 < ROWS ? T - i0 : ROWS;
    memset(dQ + i0 * w, 0, sizeof(real) * nr * w);
    for (int j = 0; j < i0 + nr; j++) {
      const real *kj = K + j * w, *vj = V + j * w;
      if (whole) for (size_t e = 0; e < w; e++) { gk[e] = 0; gv[e] = 0; }
      for (int r = j > i0 ? j - i0 : 0; r < nr; r++) { /* the rows i0 + r >= j that see key j */
        const real *qi = Q + (i0 + r) * w, *dyi = dY + (i0 + r) * w, *li = lse + (i0 + r) * L, *Di = Dr + (i0 + r) * L;
        real *dqi = dQ + (i0 + r) * w;
        real p[L], g[L];
        ATT_SFX(pair)(dh, qi, dyi, kj, vj, li, Di, scale, p, g);
        for (int d = 0; d < dh; d++)
          for (int l = 0; l < L; l++) dqi[d * L + l] += g[l] * kj[d * L + l];
        if (whole) ATT_SFX(to_key)(dh, qi, dyi, p, g, gk, gv);
      }
      if (whole) {
        real *dkj = dK + j * w, *dvj = dV + j * w;
        for (size_t e = 0; e < w; e++) { dkj[e] += gk[e]; dvj[e] += gv[e]; }
      }
    }
  }
}

static inline __attribute__((always_inline)) void ATT_SFX(bwd_keys)(int T, int dh, const real *restrict Q,
    const real *restrict K, const real *restrict V, const real *restrict dY, const real *restrict lse,
    const real *restrict Dr, real *restrict dK, real *restrict dV, real *restrict gk, real *restrict gv,
    real scale, int part, int parts) {
  const size_t w = (size_t)dh * L;
  for (int j = 0; j < T; j++) {
    if (!MINE(j)) continue;
    const real *kj = K + j * w, *vj = V + j * w;
    real *dkj = dK + j * w, *dvj = dV + j * w;
    for (size_t e = 0; e < w; e++) { dkj[e] = 0; dvj[e] = 0; }
    for (int i0 = j / ROWS * ROWS; i0 < T; i0 += ROWS) { /* the blocks with a row >= j, in the whole pass's order */
      int nr = T - i0 < ROWS ? T - i0 : ROWS;
      for (size_t e = 0; e < w; e++) { gk[e] = 0; gv[e] = 0; }
      for (int r = j > i0 ? j - i0 : 0; r < nr; r++) {
        const real *qi = Q + (i0 + r) * w, *dyi = dY + (i0 + r) * w, *li = lse + (i0 + r) * L, *Di = Dr + (i0 + r) * L;
        real p[L], g[L];
        ATT_SFX(pair)(dh, qi, dyi, kj, vj, li, Di, scale, p, g);
        ATT_SFX(to_key)(dh, qi, dyi, p, g, gk, gv);
      }
      for (size_t e = 0; e < w; e++) { dkj[e] += gk[e]; dvj[e] += gv[e]; }
    }
  }
}

/* D_i = dy_i·y_i of every row (T, L) */
static void ATT_SFX(rowdots)(int T, int dh, const real *restrict Y, const real *restrict dY, real *restrict Dr) {
  for (int i = 0; i < T; i++) {
    const real *dyi = dY + (size_t)i * dh * L, *yi = Y + (size_t)i * dh * L;
    real *Di = Dr + (size_t)i * L;
    for (int l = 0; l < L; l++) Di[l] = 0;
    for (int d = 0; d < dh; d++)
      for (int l = 0; l < L; l++) Di[l] += dyi[d * L + l] * yi[d * L + l];
  }
}

static void ATT_SFX(bwd_any)(int T, int dh, const real *Q, const real *K, const real *V, const real *Y,
                             const real *dY, const real *lse, real *Dr, real *dQ, real *dK, real *dV, real *gk,
                             real *gv, real scale, int part, int parts) { /* gk, gv: dh·L each (heap, not stack) */
  ATT_SFX(rowdots)(T, dh, Y, dY, Dr);
  if (parts == 1) {
    if (dh == 8) ATT_SFX(bwd_rows)(T, 8, Q, K, V, dY, lse, Dr, dQ, dK, dV, gk, gv, scale, 0, 1, 1);
    else ATT_SFX(bwd_rows)(T, dh, Q, K, V, dY, lse, Dr, dQ, dK, dV, gk, gv, scale, 0, 1, 1);
  } else if (dh == 8) {
    ATT_SFX(bwd_rows)(T, 8, Q, K, V, dY, lse, Dr, dQ, dK, dV, gk, gv, scale, part, parts, 0);
    ATT_SFX(bwd_keys)(T, 8, Q, K, V, dY, lse, Dr, dK, dV, gk, gv, scale, part, parts);
  } else {
    ATT_SFX(bwd_rows)(T, dh, Q, K, V, dY, lse, Dr, dQ, dK, dV, gk, gv, scale, part, parts, 0);
    ATT_SFX(bwd_keys)(T, dh, Q, K, V, dY, lse, Dr, dK, dV, gk, gv, scale, part, parts);
  }
}

/* Where sequence s's position t, feature d is: (s / H)·seq + (s % H)·dh + t·row + d — head h of a (…, T, H·dh)
   stream, as the model's q, k, v sit in its one (…, T, 3·D) product and its output goes back to (…, T, D). */
typedef struct { int64_t seq, row; int H, dh; } ATT_SFX(layout);

/* sequences s0 … s0 + L − 1 (those < n) into [t][d][lane] (lanes past n: 0), and back */
static void ATT_SFX(pack)(real *restrict dst, const real *restrict src, ATT_SFX(layout) o, int64_t s0, int64_t n, int T) {
  for (int l = 0; l < L; l++) {
    int64_t s = s0 + l;
    const real *x = s < n ? src + (s / o.H) * o.seq + (s % o.H) * o.dh : NULL;
    for (int t = 0; t < T; t++)
      for (int d = 0; d < o.dh; d++) dst[((size_t)t * o.dh + d) * L + l] = x ? x[t * o.row + d] : 0;
  }
}
static void ATT_SFX(unpack)(real *restrict dst, const real *restrict src, ATT_SFX(layout) o, int64_t s0, int64_t n, int T,
                            int part, int parts) { /* the rows of this part's blocks */
  for (int l = 0; l < L && s0 + l < n; l++) {
    int64_t s = s0 + l;
    real *x = dst + (s / o.H) * o.seq + (s % o.H) * o.dh;
    for (int t = 0; t < T; t++)
      if (MINE(t))
      for (int d = 0; d < o.dh; d++) x[t * o.row + d] = src[((size_t)t * o.dh + d) * L + l];
  }
}

/* the passes for any head width, and for width 8 (model=gpt's default heads) compiled with it known, so that
   the feature loops unroll and their sums stay in registers */
static void ATT_SFX(fwd_any)(int T, int dh, const real *Q, const real *K, const real *V, real *Y, real *lse,
                             real scale, real *s, real *acc, int part, int parts) {
  if (dh == 8) ATT_SFX(fwd_group)(T, 8, Q, K, V, Y, lse, scale, s, acc, part, parts);
  else ATT_SFX(fwd_group)(T, dh, Q, K, V, Y, lse, scale, s, acc, part, parts);
}
typedef struct {
  int64_t lo, hi, n;
  int T, dh, backward, part, parts; /* groups lo … hi − 1; of each, the row blocks of this part */
  ATT_SFX(layout) in, out, per_row; /* q, k, v and their gradients; y and dy; lse */
  const real *q, *k, *v, *y, *dy, *lse_in;
  real *y_out, *lse, *dq, *dk, *dv;
  real scale;
  int failed;
} ATT_SFX(job);

static void *ATT_SFX(work)(void *arg) {
  ATT_SFX(job) *J = arg;
  int T = J->T, dh = J->dh;
  size_t st = (size_t)T * dh * L;
  size_t w = (size_t)dh * L;
  real *buf = malloc(sizeof(real) * (9 * st + 3 * (size_t)T * L + 2 * w));
  if (!buf) { J->failed = 1; return NULL; }
  real *Q = buf, *K = Q + st, *V = K + st, *Y = V + st, *dY = Y + st, *dQ = dY + st, *dK = dQ + st,
       *dV = dK + st, *acc = dV + st, *ls = acc + st, *s = ls + (size_t)T * L, *Dr = s + (size_t)T * L,
       *gk = Dr + (size_t)T * L, *gv = gk + w;
  int part = J->part, parts = J->parts;
  for (int64_t g = J->lo; g < J->hi; g++) {
    int64_t s0 = g * L, n = J->n;
    ATT_SFX(pack)(Q, J->q, J->in, s0, n, T); ATT_SFX(pack)(K, J->k, J->in, s0, n, T); ATT_SFX(pack)(V, J->v, J->in, s0, n, T);
    if (!J->backward) {
      ATT_SFX(fwd_any)(T, dh, Q, K, V, Y, ls, J->scale, s, acc, part, parts);
      ATT_SFX(unpack)(J->y_out, Y, J->out, s0, n, T, part, parts);
      ATT_SFX(unpack)(J->lse, ls, J->per_row, s0, n, T, part, parts);
    } else {
      ATT_SFX(pack)(Y, J->y, J->out, s0, n, T); ATT_SFX(pack)(dY, J->dy, J->out, s0, n, T);
      ATT_SFX(pack)(ls, J->lse_in, J->per_row, s0, n, T);
      ATT_SFX(bwd_any)(T, dh, Q, K, V, Y, dY, ls, Dr, dQ, dK, dV, gk, gv, J->scale, part, parts);
      ATT_SFX(unpack)(J->dq, dQ, J->in, s0, n, T, part, parts); ATT_SFX(unpack)(J->dk, dK, J->in, s0, n, T, part, parts);
      ATT_SFX(unpack)(J->dv, dV, J->in, s0, n, T, part, parts);
    }
  }
  free(buf);
  return NULL;
}

/* groups of L sequences split evenly over the threads, or, with fewer groups than threads (a run or two of
   long sequences), every group's row blocks split over them: the same results either way. 0 on success, 1 if
   a thread's scratch was refused */
static int ATT_SFX(run)(ATT_SFX(job) base, int threads) {
  int64_t groups = (base.n + L - 1) / L;
  if (threads > MAX_THREADS) threads = MAX_THREADS;
  if (threads < 1) threads = 1;
  ATT_SFX(job) js[MAX_THREADS];
  int failed = 0;
  int split = groups < threads && base.T > ROWS;
  if (threads > groups && !split) threads = (int)groups;
  for (int t = 0; t < threads; t++) {
    js[t] = base;
    js[t].lo = split ? 0 : groups * t / threads;
    js[t].hi = split ? groups : groups * (t + 1) / threads;
    js[t].part = split ? t : 0;
    js[t].parts = split ? threads : 1;
  }
#ifdef _OPENMP /* torch's own pool (the process's one libgomp): its workers are spinning there already */
#pragma omp parallel for num_threads(threads) schedule(static, 1)
  for (int t = 0; t < threads; t++) ATT_SFX(work)(&js[t]);
#else
  pthread_t th[MAX_THREADS];
  int started[MAX_THREADS] = {0};
  for (int t = 1; t < threads; t++) started[t] = pthread_create(&th[t], NULL, ATT_SFX(work), &js[t]) == 0;
  for (int t = 1; t < threads; t++)
    if (!started[t]) ATT_SFX(work)(&js[t]); /* no thread to be had: this one does its share */
  ATT_SFX(work)(&js[0]);
  for (int t = 1; t < threads; t++) if (started[t]) pthread_join(th[t], NULL);
#endif
  for (int t = 0; t < threads; t++) failed |= js[t].failed;
  return failed;
}

/* n = (rows of the stream)·H sequences of T positions; q, k, v (and dq, dk, dv) at in_seq, in_row (their
   layout above), y and dy at out_seq, out_row, lse (n, T) contiguous. 0 on success. */
int ATT_SFX(rw_attention_forward)(int64_t n, int H, int T, int dh, const real *q, const real *k, const real *v,
                                  int64_t in_seq, int64_t in_row, real *y, int64_t out_seq, int64_t out_row,
                                  real *lse, double scale, int threads) {
  ATT_SFX(job) j = {.n = n, .T = T, .dh = dh, .in = {in_seq, in_row, H, dh}, .out = {out_seq, out_row, H, dh},
                    .per_row = {T, 1, 1, 1}, .q = q, .k = k, .v = v, .y_out = y, .lse = lse, .scale = (real)scale};
  return ATT_SFX(run)(j, threads);
}

int ATT_SFX(rw_attention_backward)(int64_t n, int H, int T, int dh, const real *q, const real *k, const real *v,
                                   int64_t in_seq, int64_t in_row, const real *y, const real *dy, int64_t out_seq,
                                   int64_t out_row, const real *lse, real *dq, real *dk, real *dv, double scale,
                                   int threads) {
  ATT_SFX(job) j = {.n = n, .T = T, .dh = dh, .backward = 1, .in = {in_seq, in_row, H, dh},
                    .out = {out_seq, out_row, H, dh}, .per_row = {T, 1, 1, 1}, .q = q, .k = k, .v = v, .y = y,
                    .dy = dy, .lse_in = lse, .dq = dq, .dk = dk, .dv = dv, .scale = (real)scale};
  return ATT_SFX(run)(j, threads);
}
#undef MINE
#undef real
#undef L
#endif
