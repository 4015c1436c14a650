// Command inspect is the Go workload of gostw's binary-analysis tests. Built
// plain, PIE, stripped, and (with cgo.go) externally linked, it gives every
// variant the same code. Run, it prints one JSON line prefixed "GOSTW_PCS ":
// the runtime addresses of a few functions and a call stack through inlined
// calls, with the frames the Go runtime itself gives for it, so a test can
// compare gostw's symbolization of a live process (load bias included).
// With -wait it then blocks until its standard input closes.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"reflect"
	"runtime"
)

// cgoAdd calls into C when the program is built with cgo (cgo.go).
var cgoAdd func(a, b int) int

type frame struct {
	Function string `json:"function"`
	File     string `json:"file"`
	Line     int    `json:"line"`
}

type report struct {
	Leaf   uintptr   `json:"leaf"`
	Main   uintptr   `json:"main"`
	Stack  []uintptr `json:"stack"`
	Frames []frame   `json:"frames"`
	Cgo    int       `json:"cgo"`
}

// capture returns the return addresses of its callers.
//
//go:noinline
func capture() []uintptr {
	pcs := make([]uintptr, 64)
	return pcs[:runtime.Callers(1, pcs)]
}

// inlinedOuter and inlinedInner are small enough to be inlined into main,
// so the stack holds PCs whose symbolization has inlined frames.
func inlinedOuter() []uintptr { return inlinedInner() }

func inlinedInner() []uintptr { return capture() }

//go:noinline
func leaf(n int) int { return n*2 + 1 }

func main() {
	wait := flag.Bool("wait", false, "block until standard input closes")
	flag.Parse()
	r := report{
		Leaf:  reflect.ValueOf(leaf).Pointer(),
		Main:  reflect.ValueOf(main).Pointer(),
		Stack: inlinedOuter(),
		Cgo:   -1,
	}
	if cgoAdd != nil {
		r.Cgo = cgoAdd(leaf(1), 2)
	}
	frames := runtime.CallersFrames(r.Stack)
	for {
		f, more := frames.Next()
		r.Frames = append(r.Frames, frame{f.Function, f.File, f.Line})
		if !more {
			break
		}
	}
	b, _ := json.Marshal(r)
	fmt.Printf("GOSTW_PCS %s\n", b)
	if *wait {
		io.Copy(io.Discard, os.Stdin)
	}
}
