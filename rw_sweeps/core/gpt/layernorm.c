/* LayerNorm, forward and backward, for model=gpt on a CPU (layernorm.py is its Python side): torch.nn.LayerNorm's
 * arithmetic with run r's gain g_r (and bias b_r) on the rows of run r,
 *
 *   mean = Σ_d x_d / D,  var = Σ_d (x_d − mean)² / D,  rstd = 1/√(var + eps),  x̂ = (x − mean)·rstd,  y = x̂·g (+ b)
 *   dx = rstd·(dx̂ − mean_d(dx̂) − x̂·mean_d(dx̂·x̂)) with dx̂ = dy·g,  dg = Σ_rows dy·x̂,  db = Σ_rows dy.
 *
 * Why it is fast at model=gpt's widths (d_model 8): LANES rows run side by side, one per vector lane, so the sums
 * over a row's few features are plain vector adds across rows; torch's kernel vectorises along the 8 features.
 * The work is pieces of CHUNK rows of one run, split over the threads (torch's OpenMP threads where built with
 * -fopenmp, as attention.c); a run's dg and db are its pieces' sums added in piece order, so neither the thread
 * count nor the other runs change a bit: a packed run is the same run alone.
 *
 * RW_ONLY=64 or 32 compiles one dtype (the build compiles both side by side and links them, as fused.c). */
#ifndef LN_REAL
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define LANES 16
#define CHUNK 256 /* rows a piece of work: a run's rows are shared by threads in these */
#define MAX_THREADS 256

#if !defined(RW_ONLY) || RW_ONLY == 64
#define LN_REAL double
#define LN_SFX(name) name##_f64
#include "layernorm.c" /* itself, once per dtype */
#undef LN_REAL
#undef LN_SFX
#endif
#if !defined(RW_ONLY) || RW_ONLY == 32
#define LN_REAL float
#define LN_SFX(name) name##_f32
#include "layernorm.c"
#endif

#else /* ------------------------------------------------------------------------------- one dtype: LN_REAL */
#define L LANES
typedef LN_REAL LN_SFX(real);
#define real LN_SFX(real)

typedef struct {
  int64_t runs, per_run, chunks; /* chunks: a run's rows in pieces of CHUNK, the unit of work */
  int D, backward, failed;
  const real *x, *g, *b, *dy;
  real *y, *mean, *rstd, *dx, *part; /* part: each piece's sums of dy·x̂ and dy (pieces, 2, D) */
  real eps;
} LN_SFX(job);

/* rows i0 … i0 + n − 1 (n <= L) of x (row-major, D wide) into X[d][lane], lanes past n zero */
static inline void LN_SFX(pack)(real *restrict X, const real *restrict x, int64_t i0, int n, int D) {
  for (int l = 0; l < L; l++)
    for (int d = 0; d < D; d++) X[d * L + l] = l < n ? x[(i0 + l) * D + d] : 0;
}
static inline void LN_SFX(unpack)(real *restrict x, const real *restrict X, int64_t i0, int n, int D) {
  for (int l = 0; l < n; l++)
    for (int d = 0; d < D; d++) x[(i0 + l) * D + d] = X[d * L + l];
}

/* rows lo … hi − 1, all of run r */
static inline __attribute__((always_inline)) void LN_SFX(forward_rows)(const LN_SFX(job) *J, int64_t r, int64_t lo,
                                                                       int64_t hi, int D, real *X) {
  const real *g = J->g + r * D, *b = J->b ? J->b + r * D : NULL;
  for (int64_t i0 = lo; i0 < hi; i0 += L) {
    int n = hi - i0 < L ? (int)(hi - i0) : L;
    LN_SFX(pack)(X, J->x, i0, n, D);
    real mean[L], var[L], rstd[L];
    for (int l = 0; l < L; l++) { mean[l] = 0; var[l] = 0; }
    for (int d = 0; d < D; d++)
      for (int l = 0; l < L; l++) mean[l] += X[d * L + l];
    for (int l = 0; l < L; l++) mean[l] /= D;
    for (int d = 0; d < D; d++)
      for (int l = 0; l < L; l++) { real c = X[d * L + l] - mean[l]; var[l] += c * c; }
    for (int l = 0; l < L; l++) {
      real v = var[l] / D;
      /* a row too large for its variance to be finite cannot be normalised: NaN (as torch's LayerNorm gives
         for most such rows), not 0, so that a run that overflowed reads as diverged */
      rstd[l] = v - v == 0 ? 1 / sqrt(v + J->eps) : NAN;
    }
    for (int d = 0; d < D; d++)
      for (int l = 0; l < L; l++) {
        real y = (X[d * L + l] - mean[l]) * rstd[l] * g[d];
        X[d * L + l] = b ? y + b[d] : y;
      }
    LN_SFX(unpack)(J->y, X, i0, n, D);
    for (int l = 0; l < n; l++) { J->mean[i0 + l] = mean[l]; J->rstd[i0 + l] = rstd[l]; }
  }
}

/* rows lo … hi − 1, all of run r: dx, and their sums of dy·x̂ and dy into sums (2, D) */
static inline __attribute__((always_inline)) void LN_SFX(backward_rows)(const LN_SFX(job) *J, int64_t r, int64_t lo,
    int64_t hi, int D, real *X, real *dY, real *G, real *B, real *sums) {
  const real *g = J->g + r * D;
  for (int e = 0; e < D * L; e++) { G[e] = 0; B[e] = 0; }
  for (int64_t i0 = lo; i0 < hi; i0 += L) {
    int n = hi - i0 < L ? (int)(hi - i0) : L;
    LN_SFX(pack)(X, J->x, i0, n, D);
    LN_SFX(pack)(dY, J->dy, i0, n, D);
    real mean[L], rstd[L], c1[L], c2[L];
    for (int l = 0; l < L; l++) {
      mean[l] = l < n ? J->mean[i0 + l] : 0;
      rstd[l] = l < n ? J->rstd[i0 + l] : 0;
      c1[l] = 0;
      c2[l] = 0;
    }
    for (int d = 0; d < D; d++)
      for (int l = 0; l < L; l++) {
        real xh = (X[d * L + l] - mean[l]) * rstd[l], dxh = dY[d * L + l] * g[d];
        X[d * L + l] = xh;
        G[d * L + l] += dY[d * L + l] * xh;
        B[d * L + l] += dY[d * L + l];
        c1[l] += dxh;
        c2[l] += dxh * xh;
      }
    for (int l = 0; l < L; l++) { c1[l] /= D; c2[l] /= D; }
    for (int d = 0; d < D; d++)
      for (int l = 0; l < L; l++) dY[d * L + l] = rstd[l] * (dY[d * L + l] * g[d] - c1[l] - X[d * L + l] * c2[l]);
    LN_SFX(unpack)(J->dx, dY, i0, n, D);
  }
  for (int d = 0; d < D; d++) { /* the piece's sums: its lanes', lane by lane */
    real sg = 0, sb = 0;
    for (int l = 0; l < L; l++) { sg += G[d * L + l]; sb += B[d * L + l]; }
    sums[d] = sg;
    sums[D + d] = sb;
  }
}

/* pieces lo … hi − 1 (piece k: run k / chunks, its (k % chunks)-th CHUNK rows); width 8 compiled with it known */
static void LN_SFX(work)(LN_SFX(job) *J, int64_t lo, int64_t hi) {
  int D = J->D;
  real *buf = malloc(sizeof(real) * 4 * (size_t)D * L);
  if (!buf) { J->failed = 1; return; }
  for (int64_t k = lo; k < hi; k++) {
    int64_t r = k / J->chunks, first = r * J->per_run + (k % J->chunks) * CHUNK;
    int64_t last = first + CHUNK < (r + 1) * J->per_run ? first + CHUNK : (r + 1) * J->per_run;
    if (!J->backward) {
      if (D == 8) LN_SFX(forward_rows)(J, r, first, last, 8, buf);
      else LN_SFX(forward_rows)(J, r, first, last, D, buf);
    } else {
      real *X = buf, *dY = X + D * L, *G = dY + D * L, *B = G + D * L, *sums = J->part + k * 2 * D;
      if (D == 8) LN_SFX(backward_rows)(J, r, first, last, 8, X, dY, G, B, sums);
      else LN_SFX(backward_rows)(J, r, first, last, D, X, dY, G, B, sums);
    }
  }
  free(buf);
}

typedef struct { LN_SFX(job) *J; int64_t lo, hi; } LN_SFX(share);
static void *LN_SFX(thread)(void *arg) {
  LN_SFX(share) *s = arg;
  LN_SFX(work)(s->J, s->lo, s->hi);
  return NULL;
}

/* the pieces split evenly over the threads (which pieces a thread takes changes no bit: each piece's sums are
   its own, added up run by run in piece order after) */
static int LN_SFX(run)(LN_SFX(job) *J, int threads) {
  int64_t pieces = J->runs * J->chunks;
  if (threads > MAX_THREADS) threads = MAX_THREADS;
  if (threads > pieces) threads = (int)pieces;
  if (threads < 1) threads = 1;
  LN_SFX(share) sh[MAX_THREADS];
  for (int t = 0; t < threads; t++) sh[t] = (LN_SFX(share)){J, pieces * t / threads, pieces * (t + 1) / threads};
#ifdef _OPENMP
#pragma omp parallel for num_threads(threads) schedule(static, 1)
  for (int t = 0; t < threads; t++) LN_SFX(thread)(&sh[t]);
#else
  pthread_t th[MAX_THREADS];
  int started[MAX_THREADS] = {0};
  for (int t = 1; t < threads; t++) started[t] = pthread_create(&th[t], NULL, LN_SFX(thread), &sh[t]) == 0;
  for (int t = 1; t < threads; t++)
    if (!started[t]) LN_SFX(thread)(&sh[t]);
  LN_SFX(thread)(&sh[0]);
  for (int t = 1; t < threads; t++) if (started[t]) pthread_join(th[t], NULL);
#endif
  return J->failed;
}

/* rows = runs·per_run rows of D, row-major; g, b (b may be NULL): (runs, D); mean, rstd: (rows). 0 on success. */
int LN_SFX(rw_layernorm_forward)(int64_t runs, int64_t per_run, int D, const real *x, const real *g, const real *b,
                                 double eps, real *y, real *mean, real *rstd, int threads) {
  LN_SFX(job) J = {.runs = runs, .per_run = per_run, .chunks = (per_run + CHUNK - 1) / CHUNK, .D = D, .x = x,
                   .g = g, .b = b, .y = y, .mean = mean, .rstd = rstd, .eps = (real)eps};
  return LN_SFX(run)(&J, threads);
}

/* dg, db (db may be NULL): (runs, D), overwritten with the sums over each run's rows, piece by piece in order */
int LN_SFX(rw_layernorm_backward)(int64_t runs, int64_t per_run, int D, const real *x, const real *g,
                                  const real *mean, const real *rstd, const real *dy, real *dx, real *dg, real *db,
                                  int threads) {
  int64_t chunks = (per_run + CHUNK - 1) / CHUNK;
  real *part = malloc(sizeof(real) * 2 * (size_t)D * runs * chunks);
  if (!part) return 1;
  LN_SFX(job) J = {.runs = runs, .per_run = per_run, .chunks = chunks, .D = D, .backward = 1, .x = x, .g = g,
                   .mean = mean, .rstd = rstd, .dy = dy, .dx = dx, .part = part};
  int failed = LN_SFX(run)(&J, threads);
  for (int64_t r = 0; r < runs && !failed; r++)
    for (int d = 0; d < D; d++) {
      real sg = 0, sb = 0;
      for (int64_t c = 0; c < chunks; c++) {
        sg += part[((r * chunks + c) * 2) * D + d];
        sb += part[((r * chunks + c) * 2 + 1) * D + d];
      }
      dg[r * D + d] = sg;
      if (db) db[r * D + d] = sb;
    }
  free(part);
  return failed;
}
#undef real
#undef L
#endif
