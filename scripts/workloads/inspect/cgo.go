//go:build cgo

package main

/*
static int gostw_add(int a, int b) { return a + b; }
*/
import "C"

func init() {
	cgoAdd = func(a, b int) int { return int(C.gostw_add(C.int(a), C.int(b))) }
}
