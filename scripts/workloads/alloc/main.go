// Command alloc is an allocation-heavy Go workload with a fixed amount of
// work, for overhead measurements: -workers goroutines handle -ops requests
// between them, each building short-lived objects (a map of headers, a body
// buffer, a chain of small records) and keeping the result in a bounded live
// set that ages out old entries, as a service's request path and cache do.
// The GC runs at its own pace (GOGC as set by the environment).
//
// It times its own work, start-up and a warm-up that fills the live set
// excluded, and at exit prints, as one JSON
// line prefixed "GOSTW_REPORT ", the work's wall and CPU time, its page
// faults, and the stop-the-world pauses of the whole run as the runtime
// counts them. With -idle it only prints "GOSTW_IDLE ready" and waits for
// its standard input to close: a Go process to trace while another program
// runs.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/metrics"
	"strconv"
	"sync"
	"syscall"
	"time"
)

var headerNames = [8]string{"host", "user-agent", "accept", "cookie", "x-request-id", "x-trace", "content-type", "referer"}

type record struct {
	id   int64
	name string
	tags []string
	next *record
}

type entry struct {
	headers map[string]string
	body    []byte
	records *record
}

// request builds one request's objects and returns them with a checksum.
func request(i int) (*entry, int) {
	h := make(map[string]string, len(headerNames))
	for k, name := range headerNames {
		h[name] = strconv.Itoa(i*31 + k)
	}
	body := make([]byte, 512+(i*7919)%3584)
	for j := 0; j < len(body); j += 64 {
		body[j] = byte(i + j)
	}
	var head *record
	for j := 0; j < 16; j++ {
		head = &record{id: int64(i*16 + j), name: h[headerNames[j%8]], tags: []string{"a", "b"}, next: head}
	}
	sum := len(body)
	for r := head; r != nil; r = r.next {
		sum += len(r.name)
	}
	return &entry{headers: h, body: body, records: head}, sum
}

func histCount(name string) int64 {
	s := []metrics.Sample{{Name: name}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindFloat64Histogram {
		return -1 // not in this Go version
	}
	var n uint64
	for _, c := range s[0].Value.Float64Histogram().Counts {
		n += c
	}
	return int64(n)
}

func usage() syscall.Rusage {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return ru
}

func cpuNs(ru syscall.Rusage) int64 { return ru.Utime.Nano() + ru.Stime.Nano() }

func main() {
	ops := flag.Int("ops", 400000, "requests to handle in all")
	workers := flag.Int("workers", 4, "goroutines handling requests")
	liveMB := flag.Int("live-mb", 64, "approximate size of the live set, MiB")
	idle := flag.Bool("idle", false, "print GOSTW_IDLE ready, then wait for standard input to close")
	marks := flag.Bool("marks", false, "print GOSTW_WORK begin/end lines around the timed work (for benchmarks)")
	flag.Parse()
	if *idle {
		fmt.Println("GOSTW_IDLE ready")
		_, _ = io.Copy(io.Discard, os.Stdin)
		return
	}

	// About 3.5 KiB per entry; each worker owns one shard of the live set.
	slots := *liveMB << 20 / 3584 / *workers
	if slots < 1 {
		slots = 1
	}
	sums := make([]int, *workers)
	shards := make([][]*entry, *workers)
	// Warm-up, not timed: fill the live set once, so the heap has grown to
	// its working size (the first touch of fresh memory faults once per
	// page, then the heap is reused).
	run(*workers, func(w int) {
		shards[w] = make([]*entry, slots)
		for i := range shards[w] {
			shards[w][i], _ = request(i)
		}
	})
	gcBefore := readGCs()
	if *marks {
		fmt.Println("GOSTW_WORK begin")
	}
	before := usage()
	start := time.Now()
	run(*workers, func(w int) {
		n := *ops / *workers
		if w < *ops%*workers {
			n++
		}
		live := shards[w]
		for i := 0; i < n; i++ {
			e, s := request(w*n + i)
			live[i%slots] = e
			sums[w] += s
		}
	})
	elapsed := time.Since(start)
	after := usage()
	if *marks {
		fmt.Println("GOSTW_WORK end")
	}
	gcs := readGCs() - gcBefore
	runtime.KeepAlive(shards)

	// Finish any GC cycle in progress so no pause is half counted.
	runtime.GC()
	total := 0
	for _, s := range sums {
		total += s
	}
	cpu := cpuNs(after) - cpuNs(before)
	out := map[string]any{
		"go_version":      runtime.Version(),
		"pid":             os.Getpid(),
		"ops":             *ops,
		"workers":         *workers,
		"gomaxprocs":      runtime.GOMAXPROCS(0),
		"live_mb":         *liveMB,
		"work_ns":         elapsed.Nanoseconds(),
		"work_cpu_ns":     cpu,
		"ops_per_cpu_sec": float64(*ops) / (float64(cpu) / 1e9),
		"work_gcs":        gcs,
		"work_minflt":     after.Minflt - before.Minflt,
		"work_majflt":     after.Majflt - before.Majflt,
		"stw_gc":          histCount("/sched/pauses/total/gc:seconds"),
		"stw_other":       histCount("/sched/pauses/total/other:seconds"),
		"gc_pauses":       histCount("/gc/pauses:seconds"),
		"checksum":        total,
	}
	b, _ := json.Marshal(out)
	fmt.Printf("GOSTW_REPORT %s\n", b)
}

// run calls f(0) ... f(n-1) on n goroutines and waits for them.
func run(n int, f func(w int)) {
	var wg sync.WaitGroup
	wg.Add(n)
	for w := 0; w < n; w++ {
		go func(w int) {
			defer wg.Done()
			f(w)
		}(w)
	}
	wg.Wait()
}

func readGCs() uint32 {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.NumGC
}
