// Command gcswap is a Go workload whose GC metadata can be pushed to swap
// between collections: it keeps a steady live heap of small pointerful
// objects and many parked goroutines (the runtime walks every g and every
// heap arena inside the stop-the-world pause), then runs one GC per line
// read from stdin ("gc"), so a helper can page the process out first.
// Before each GC, -walkers goroutines read the whole live heap in lockstep,
// so after a page-out threads wait on reads another thread issued. On
// "quit" (or EOF) it prints, as one JSON line prefixed "GOSTW_REPORT ", its
// own pause histogram, pause list and major fault count (/proc/self/stat).
//
// Two more modes serve the memory-cgroup scenario: -spike-every allocates
// -spike-mb of garbage periodically in the background (natural GCs), and
// -neighbour-mb makes the process a neighbour that only holds a buffer and
// re-reads it every -reread, competing for the cgroup's memory.
//
// "metrics" prints, as one JSON line prefixed "METRICS ", the runtime's own
// memory classes (every /memory/classes/ metric of runtime/metrics, in
// bytes), read and printed without allocating on the heap in between, so a
// helper can freeze the process right after the line and compare. "cwork"
// makes C allocations in builds with -tags gostwcgo (cgo.go). "hist" prints,
// prefixed "HIST ", Go's GC pause histogram as it is now.
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"runtime"
	"runtime/metrics"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

type node struct {
	left, right *node
	payload     [4]int64
}

// cWork makes C allocations (cgo.go, -tags gostwcgo); nil without cgo.
var cWork func() int

var (
	live    []*node
	sink    []*node
	walkSum int64
)

// barrier holds goroutines until all n have arrived, then lets them go
// together; reusable.
type barrier struct {
	mu          sync.Mutex
	cond        *sync.Cond
	n, count, g int
}

func newBarrier(n int) *barrier {
	b := &barrier{n: n}
	b.cond = sync.NewCond(&b.mu)
	return b
}

func (b *barrier) wait() {
	b.mu.Lock()
	g := b.g
	b.count++
	if b.count == b.n {
		b.count = 0
		b.g++
		b.cond.Broadcast()
	} else {
		for g == b.g {
			b.cond.Wait()
		}
	}
	b.mu.Unlock()
}

// walk reads every live node from n goroutines in lockstep, a few pages at
// a time, so after a page-out they fault on the same pages at the same
// moment: one reads each page from swap, the others wait for its read.
func walk(n int) {
	if n == 0 {
		return
	}
	const step = 256 // nodes, about three pages
	bar := newBarrier(n)
	var wg sync.WaitGroup
	for w := 0; w < n; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var s int64
			for i := 0; i < len(live); i += step {
				bar.wait()
				end := i + step
				if end > len(live) {
					end = len(live)
				}
				for _, x := range live[i:end] {
					s += x.payload[0]
				}
			}
			atomic.AddInt64(&walkSum, s)
		}()
	}
	wg.Wait()
}

func build(n int) []*node {
	out := make([]*node, n)
	for i := range out {
		out[i] = &node{payload: [4]int64{int64(i)}}
		if i > 0 {
			out[i].left = out[i-1]
		}
	}
	return out
}

func main() {
	liveMB := flag.Int("live-mb", 64, "MiB of live heap kept throughout")
	goroutines := flag.Int("goroutines", 4000, "parked goroutines")
	garbageMB := flag.Int("garbage-mb", 16, "MiB of garbage allocated before each GC")
	walkers := flag.Int("walkers", 2, "goroutines reading the live heap before each GC")
	spikeEvery := flag.Duration("spike-every", 0, "allocate -spike-mb of garbage this often")
	spikeMB := flag.Int("spike-mb", 32, "MiB of garbage per allocation spike")
	neighbourMB := flag.Int("neighbour-mb", 0, "be a neighbour holding and re-reading this many MiB")
	reread := flag.Duration("reread", 50*time.Millisecond, "neighbour: re-read period")
	flag.Parse()

	if *neighbourMB > 0 {
		neighbour(*neighbourMB, *reread)
		return
	}

	live = build(*liveMB << 20 / 48)
	park := make(chan struct{})
	for i := 0; i < *goroutines; i++ {
		go func() { <-park }()
	}
	runtime.GC()
	if *spikeEvery > 0 {
		go func() {
			for range time.Tick(*spikeEvery) {
				spike := build(*spikeMB << 20 / 48)
				runtime.KeepAlive(spike)
			}
		}()
	}
	fmt.Println("READY")

	in := bufio.NewScanner(os.Stdin)
	gcs := 0
	for in.Scan() {
		cmd := strings.TrimSpace(in.Text())
		if cmd == "quit" {
			break
		}
		if cmd == "gc" {
			walk(*walkers)
			sink = build(*garbageMB << 20 / 48)
			sink = nil
			runtime.GC()
			gcs++
			fmt.Printf("GC %d\n", gcs)
		}
		if cmd == "metrics" {
			printMemoryClasses()
		}
		if cmd == "hist" {
			// Go's GC pause histogram now, to compare a traced stretch
			// with: the report's at exit less this one.
			b, _ := json.Marshal(gcPauseHist())
			fmt.Printf("HIST %s\n", b)
		}
		if cmd == "cwork" {
			if cWork == nil {
				fmt.Println("CWORK none")
			} else {
				fmt.Printf("CWORK %d\n", cWork())
			}
		}
	}
	runtime.KeepAlive(live)
	close(park)
	report(gcs)
}

// neighbour holds mb MiB and reads one byte of every page each period,
// until stdin closes.
func neighbour(mb int, period time.Duration) {
	buf := make([]byte, mb<<20)
	for i := range buf {
		buf[i] = byte(i)
	}
	fmt.Println("READY")
	done := make(chan struct{})
	go func() {
		bufio.NewScanner(os.Stdin).Scan()
		close(done)
	}()
	var s byte
	for {
		select {
		case <-done:
			fmt.Println("GOSTW_REPORT {}", s)
			return
		case <-time.After(period):
		}
		for i := 0; i < len(buf); i += 4096 {
			s += buf[i]
		}
	}
}

// memoryClasses are the runtime/metrics samples of every /memory/classes/
// metric this Go version has, allocated once.
var memoryClasses = func() []metrics.Sample {
	var s []metrics.Sample
	for _, d := range metrics.All() {
		if strings.HasPrefix(d.Name, "/memory/classes/") && d.Kind == metrics.KindUint64 {
			s = append(s, metrics.Sample{Name: d.Name})
		}
	}
	return s
}()

// printMemoryClasses prints "METRICS {name: bytes, ...}". The line is built
// before the samples are read, in a buffer sized up front, so nothing is
// allocated between the read and the print.
func printMemoryClasses() {
	buf := make([]byte, 0, 64*len(memoryClasses)+64)
	metrics.Read(memoryClasses)
	buf = append(buf, "METRICS {"...)
	for i, s := range memoryClasses {
		if i > 0 {
			buf = append(buf, ',')
		}
		buf = strconv.AppendQuote(buf, s.Name)
		buf = append(buf, ':')
		buf = strconv.AppendUint(buf, s.Value.Uint64(), 10)
	}
	buf = append(buf, "}\n"...)
	os.Stdout.Write(buf)
}

// majflt reads field 12 of /proc/self/stat (after the parenthesised comm).
func majflt() int64 {
	b, err := os.ReadFile("/proc/self/stat")
	if err != nil {
		return -1
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	v, _ := strconv.ParseInt(f[9], 10, 64)
	return v
}

type bucket struct {
	Ge    float64 `json:"ge"`
	Le    float64 `json:"le"`
	Count uint64  `json:"count"`
}

func histogram(name string) []bucket {
	s := []metrics.Sample{{Name: name}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindFloat64Histogram {
		return nil
	}
	h := s[0].Value.Float64Histogram()
	var out []bucket
	for i, c := range h.Counts {
		if c > 0 {
			out = append(out, bucket{Ge: h.Buckets[i], Le: h.Buckets[i+1], Count: c})
		}
	}
	return out
}

// gcPauseHist is Go's GC pause histogram: /sched/pauses/total/gc (1.22+),
// else the older /gc/pauses.
func gcPauseHist() []bucket {
	if gc := histogram("/sched/pauses/total/gc:seconds"); gc != nil {
		return gc
	}
	return histogram("/gc/pauses:seconds")
}

func report(gcs int) {
	// Read before anything else stops the world or faults.
	flt := majflt()
	gc := gcPauseHist()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	var pauses []uint64
	for i := uint32(0); i < ms.NumGC && i < 256; i++ {
		pauses = append(pauses, ms.PauseNs[(ms.NumGC-1-i)%256])
	}
	out := map[string]any{
		"go_version":     runtime.Version(),
		"pid":            os.Getpid(),
		"gcs":            gcs,
		"num_gc":         ms.NumGC,
		"majflt":         flt,
		"gc_pause_hist":  gc,
		"cycle_pause_ns": pauses,
	}
	b, _ := json.Marshal(out)
	fmt.Printf("GOSTW_REPORT %s\n", b)
}
