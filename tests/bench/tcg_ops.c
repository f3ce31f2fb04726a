/* tcg_ops.c: what a few operations the request path makes per ioctl cost in the VM (QEMU TCG),
 * in a tight loop: a plain increment, a locked increment (`lock xadd`), an uncontended
 * pthread mutex lock + unlock, and clock_gettime of CLOCK_MONOTONIC and
 * CLOCK_MONOTONIC_COARSE (both vDSO), malloc + free. Warm figures: what a request pays on top when its code
 * and data are cold is measured by tcg-cold.sh. Prints ns per operation.
 *
 *   gcc -O2 -o target/bench/tcg_ops tests/bench/tcg_ops.c -lpthread
 *   tests/vm/cuse-vm --smp 2 -- target/bench/tcg_ops
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static volatile long plain;
static _Atomic long counter;
static pthread_mutex_t mutex = PTHREAD_MUTEX_INITIALIZER;

static void *nothing(void *arg) { return arg; }

int main(void) {
  /* A second thread once, so that libc takes its multi-threaded paths as in the daemon. */
  pthread_t t;
  pthread_create(&t, NULL, nothing, NULL);
  pthread_join(t, NULL);
  const long n = 2000000, m = n / 10;
  struct timespec ts;
  double t0 = now();
  for (long i = 0; i < n; i++) plain++;
  double t1 = now();
  for (long i = 0; i < n; i++) atomic_fetch_add(&counter, 1);
  double t2 = now();
  for (long i = 0; i < n; i++) {
    pthread_mutex_lock(&mutex);
    plain++;
    pthread_mutex_unlock(&mutex);
  }
  double t3 = now();
  for (long i = 0; i < m; i++) clock_gettime(CLOCK_MONOTONIC, &ts);
  double t4 = now();
  for (long i = 0; i < m; i++) clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  double t5 = now();
  /* Allocations of the sizes a request makes (params, a record), each freed at once, and
   * five alive together as in a request. */
  void *volatile keep;
  for (long i = 0; i < m; i++) {
    keep = malloc(56);
    free(keep);
  }
  double t6 = now();
  for (long i = 0; i < m; i++) {
    void *p[5];
    for (int j = 0; j < 5; j++) p[j] = malloc(16 + 24 * j);
    for (int j = 0; j < 5; j++) free(p[j]);
  }
  double t7 = now();
  printf("ns per op: increment %.1f, lock xadd %.1f, mutex lock+unlock %.1f, "
         "clock_gettime MONOTONIC %.1f, MONOTONIC_COARSE %.1f, malloc+free %.1f, "
         "5 mallocs then 5 frees %.1f\n",
         (t1 - t0) / n * 1e9, (t2 - t1) / n * 1e9, (t3 - t2) / n * 1e9, (t4 - t3) / m * 1e9,
         (t5 - t4) / m * 1e9, (t6 - t5) / m * 1e9, (t7 - t6) / m * 1e9);
  return 0;
}
