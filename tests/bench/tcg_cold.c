// tcg_cold.c: what code and data cost a server right after a context switch, for reading the
// VM's benchmarks (tests/bench/README.md, "Cold code after every switch"). Under QEMU's TCG a
// switch to another process empties the guest's software TLB and its translated-jump cache, so
// each distinct block of code a server runs per request, and each distinct page it touches,
// costs a lookup again on every request however often it ran before.
//
// Each round: a pipe round trip with a child process (two switches), then the work:
//   none               nothing (the round trip alone)
//   code K STRIDE      call K distinct copies of a 4-byte function (`lea eax,[rdi+1]; ret`)
//                      laid STRIDE bytes apart in an executable mapping
//   data P             read and write one byte in each of P distinct pages
// With --warm the round trip is left out (the same work in a loop: everything stays cached).
// Prints ns per round. x86-64 only (the function copies are machine code).
//
// Usage: tcg_cold ROUNDS none|code K STRIDE|data P [--warm]
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s ROUNDS none|code K STRIDE|data P [--warm]\n", argv[0]);
    return 2;
  }
  long rounds = atol(argv[1]);
  const char *mode = argv[2];
  int warm = strcmp(argv[argc - 1], "--warm") == 0;
  long k = 0, stride = 0, pages = 0;
  typedef int (*fn_t)(int);
  fn_t *fns = NULL;
  volatile uint8_t *buf = NULL;
  if (strcmp(mode, "code") == 0 && argc >= 5) {
    k = atol(argv[3]);
    stride = atol(argv[4]);
    if (k <= 0 || stride < 4 || k > 1 << 20 || stride > 1 << 16) return 2;
    size_t len = (size_t)k * (size_t)stride;
    uint8_t *code = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (code == MAP_FAILED) return perror("mmap"), 1;
    fns = calloc((size_t)k, sizeof *fns);
    if (fns == NULL) return perror("calloc"), 1;
    static const uint8_t body[] = {0x8d, 0x47, 0x01, 0xc3}; // lea eax,[rdi+1]; ret
    for (long i = 0; i < k; i++) {
      memcpy(code + i * stride, body, sizeof body);
      fns[i] = (fn_t)(void *)(code + i * stride);
    }
    if (mprotect(code, len, PROT_READ | PROT_EXEC) != 0) return perror("mprotect"), 1;
  } else if (strcmp(mode, "data") == 0 && argc >= 4) {
    pages = atol(argv[3]);
    if (pages <= 0 || pages > 1 << 18) return 2;
    buf = mmap(NULL, (size_t)pages * 4096, PROT_READ | PROT_WRITE,
               MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (buf == MAP_FAILED) return perror("mmap"), 1;
  } else if (strcmp(mode, "none") != 0) {
    fprintf(stderr, "unknown mode %s\n", mode);
    return 2;
  }
  int to[2], from[2];
  if (pipe(to) != 0 || pipe(from) != 0) return perror("pipe"), 1;
  pid_t child = fork();
  if (child < 0) return perror("fork"), 1;
  if (child == 0) {
    close(to[1]); // the parent's ends: its exit then ends our read (EOF)
    close(from[0]);
    char b;
    while (read(to[0], &b, 1) == 1 && write(from[1], &b, 1) == 1) {
    }
    _exit(0);
  }
  int acc = 0;
  double t0 = 0;
  for (long r = -100; r < rounds; r++) { // 100 rounds of warm-up
    if (r == 0) t0 = now_ns();
    if (!warm) {
      char b = 0;
      if (write(to[1], &b, 1) != 1 || read(from[0], &b, 1) != 1) return perror("pipe"), 1;
    }
    for (long i = 0; i < k; i++) acc = fns[i](acc);
    for (long p = 0; p < pages; p++) buf[p * 4096] += 1;
  }
  double ns = (now_ns() - t0) / (double)rounds;
  close(to[1]); // ends the child's loop
  waitpid(child, NULL, 0);
  printf("%s k=%ld stride=%ld pages=%ld %s: %.0f ns per round (acc %d)\n", mode, k, stride, pages,
         warm ? "warm" : "switch", ns, acc);
  return 0;
}
