//go:build cgo && gostwcgo

// With -tags gostwcgo (and cgo on), "cwork" makes C allocations the
// memory report must not count as Go's: a large malloc glibc serves with
// its own mmap, small ones from a malloc arena, and a C thread (its stack
// above a guard page) that allocates from an arena of its own.
package main

/*
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

// Kept reachable, or the compiler drops allocations nobody reads.
void *gostw_c_kept[513];

static void gostw_c_small(int from) {
	for (int i = 0; i < 256; i++) {
		gostw_c_kept[from + i] = malloc(1024);
		memset(gostw_c_kept[from + i], 1, 1024);
	}
}

static void *gostw_c_thread(void *arg) {
	gostw_c_small(257);
	pause();
	return NULL;
}

static int gostw_c_work(void) {
	gostw_c_kept[0] = malloc(8 << 20);
	memset(gostw_c_kept[0], 1, 8 << 20);
	gostw_c_small(1);
	pthread_t t;
	return pthread_create(&t, NULL, gostw_c_thread, NULL);
}
*/
import "C"

func init() {
	cWork = func() int { return int(C.gostw_c_work()) }
}
