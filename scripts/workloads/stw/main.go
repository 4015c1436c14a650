// Command stw is a Go workload whose stop-the-world pauses are known: it runs
// forced and natural GCs, calls runtime.ReadMemStats and runtime.GOMAXPROCS
// (each a stop-the-world of its own reason), and at exit prints, as one JSON
// line prefixed "GOSTW_REPORT ", what the runtime counted of itself.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"math"
	"os"
	"os/signal"
	"runtime"
	"runtime/metrics"
	"syscall"
	"time"
)

var (
	sink         [][]byte
	allocatedMiB int
	elapsed      time.Duration
	workCPUNs    int64
)

func main() {
	gcs := flag.Int("gc", 20, "forced GCs (runtime.GC)")
	readMemStats := flag.Int("readmemstats", 5, "runtime.ReadMemStats calls")
	gomaxprocs := flag.Int("gomaxprocs", 4, "runtime.GOMAXPROCS changes")
	allocMB := flag.Int("alloc-mb", 256, "MiB of garbage to allocate (natural GCs)")
	liveMB := flag.Int("live-mb", 16, "MiB of live heap kept throughout")
	duration := flag.Duration("duration", 0, "keep allocating until this much time has passed")
	exitCode := flag.Int("exit-code", 0, "exit with this code after the report")
	marks := flag.Bool("marks", false, "print GOSTW_WORK begin/end lines around the timed work (for benchmarks)")
	spinners := flag.Int("spinners", 0, "goroutines spinning in loops with no safe point (with GODEBUG=asyncpreemptoff=1 they delay every stop)")
	spinChunk := flag.Duration("spin-chunk", 20*time.Millisecond, "how long each spinner's loop runs between safe points")
	spinIn := flag.String("spin-in", "spinner", "the spinners' code: spinner (main.spinner, main.spinLoop) or other (main.otherSpinner, main.otherSpinLoop, the same loop under other names)")
	interval := flag.Duration("interval", 0, "sleep this long between rounds")
	hold := flag.Duration("hold", 0, "after the report, stay alive (and idle) this long: a tracer can read what it counted while the process lives")
	startOnSignal := flag.Bool("start-on-signal", false, "wait for SIGUSR1 before doing anything (so a tracer can attach first and see every pause)")
	flag.Parse()
	if *startOnSignal {
		waitForSignal()
	}
	if *mmapLockMB > 0 {
		startMmapLock(*mmapLockMB, *mmapLockHolder)
	}
	if *touchMB > 0 {
		startTouchers(*touchers, *touchMB)
	}
	if *spinners > 0 {
		n := spinIterations(*spinChunk)
		spin := spinner
		switch *spinIn {
		case "spinner":
		case "other":
			spin = otherSpinner
		default:
			fmt.Fprintf(os.Stderr, "-spin-in %q: want spinner or other\n", *spinIn)
			os.Exit(2)
		}
		for i := 0; i < *spinners; i++ {
			go spin(n)
		}
	}

	live := make([][]byte, 0, *liveMB*16)
	for i := 0; i < *liveMB*16; i++ {
		live = append(live, make([]byte, 64<<10))
	}
	if *marks {
		fmt.Println("GOSTW_WORK begin")
	}
	cpuStart := cpuNs()
	start := time.Now()
	deadline := start.Add(*duration)
	for round := 0; round == 0 || time.Now().Before(deadline); round++ {
		churn(*allocMB)
		allocatedMiB += *allocMB
		for i := 0; i < *gcs; i++ {
			runtime.GC()
		}
		readStats(*readMemStats)
		resizeProcs(*gomaxprocs)
		time.Sleep(*interval)
	}
	runtime.KeepAlive(live)
	elapsed = time.Since(start)
	workCPUNs = cpuNs() - cpuStart
	if *marks {
		fmt.Println("GOSTW_WORK end")
	}
	report()
	time.Sleep(*hold)
	os.Exit(*exitCode)
}

// waitForSignal blocks until SIGUSR1 arrives, saying it waits.
func waitForSignal() {
	c := make(chan os.Signal, 1)
	signal.Notify(c, syscall.SIGUSR1)
	fmt.Println("GOSTW_WAITING")
	<-c
	signal.Stop(c)
}

// readStats calls runtime.ReadMemStats n times: the caller a tracer must
// name for those pauses.
//
//go:noinline
func readStats(n int) {
	var ms runtime.MemStats
	for i := 0; i < n; i++ {
		runtime.ReadMemStats(&ms)
	}
}

// resizeProcs changes GOMAXPROCS n times and restores it: the caller a
// tracer must name for those pauses.
//
//go:noinline
func resizeProcs(n int) {
	procs := runtime.GOMAXPROCS(0)
	for i := 0; i < n; i++ {
		// Alternate so each call really changes the value (an unchanged
		// value returns without stopping the world).
		if i%2 == 0 {
			runtime.GOMAXPROCS(procs + 1)
		} else {
			runtime.GOMAXPROCS(procs)
		}
	}
	runtime.GOMAXPROCS(procs)
}

var spun int

// spinLoop is a loop with no call in it: without asynchronous preemption a
// stop-the-world waits until it returns. A leaf with a small frame, so it
// has no stack check either.
//
//go:noinline
func spinLoop(n int) int {
	x := 0
	for i := 0; i < n; i++ {
		x += i ^ (x >> 3)
	}
	return x
}

// checkpoint is the spinner's only safe point: its stack check.
//
//go:noinline
func checkpoint(x int) {
	if x == -1 {
		checkpoint(x + 1)
	}
	spun += x & 1
}

// spinner is the goroutine that would not stop: it spins in spinLoop and
// reaches a safe point only between loops.
//
//go:noinline
func spinner(n int) {
	for {
		checkpoint(spinLoop(n))
	}
}

// otherSpinLoop is spinLoop under another name (the laggard tests'
// control: gostw must name this code, not spinLoop's).
//
//go:noinline
func otherSpinLoop(n int) int {
	x := 0
	for i := 0; i < n; i++ {
		x += i ^ (x >> 3)
	}
	return x
}

// otherSpinner is spinner under another name, spinning in otherSpinLoop.
//
//go:noinline
func otherSpinner(n int) {
	for {
		checkpoint(otherSpinLoop(n))
	}
}

// spinIterations is about how many spinLoop iterations take d.
func spinIterations(d time.Duration) int {
	n := 1 << 20
	for {
		start := time.Now()
		spinLoop(n)
		took := time.Since(start)
		if took > 5*time.Millisecond {
			return int(float64(n) * float64(d) / float64(took))
		}
		n *= 2
	}
}

// churn allocates n MiB of short-lived garbage.
func churn(mb int) {
	for i := 0; i < mb*16; i++ {
		sink = append(sink, make([]byte, 64<<10))
		if len(sink) > 64 {
			sink = sink[:0]
		}
	}
}

func histCount(s metrics.Sample) int64 {
	if s.Value.Kind() != metrics.KindFloat64Histogram {
		return -1 // not in this Go version
	}
	var n uint64
	for _, c := range s.Value.Float64Histogram().Counts {
		n += c
	}
	return int64(n)
}

// pauseHistograms are Go's own pause histograms (1.22+), reported bucket by
// bucket so a tracer's per-pause figures can be bucketed the same way.
var pauseHistograms = []string{
	"/sched/pauses/stopping/gc:seconds",
	"/sched/pauses/stopping/other:seconds",
	"/sched/pauses/total/gc:seconds",
	"/sched/pauses/total/other:seconds",
}

// boundNs is a bucket boundary in integer nanoseconds (Go's time histogram
// boundaries are whole nanoseconds divided by 1e9); the open ends become the
// extreme int64 values.
func boundNs(b float64) int64 {
	switch {
	case math.IsInf(b, -1):
		return math.MinInt64
	case math.IsInf(b, 1):
		return math.MaxInt64
	}
	return int64(math.Round(b * 1e9))
}

// histBuckets lists the non-empty buckets of a histogram as [low, high,
// count], low inclusive and high exclusive, in nanoseconds; nil when the
// metric is not in this Go version.
func histBuckets(s metrics.Sample) [][3]int64 {
	if s.Value.Kind() != metrics.KindFloat64Histogram {
		return nil
	}
	h := s.Value.Float64Histogram()
	out := [][3]int64{}
	for i, c := range h.Counts {
		if c > 0 {
			out = append(out, [3]int64{boundNs(h.Buckets[i]), boundNs(h.Buckets[i+1]), int64(c)})
		}
	}
	return out
}

// pauseNs returns MemStats.PauseNs of each GC cycle still in the ring, oldest
// first: per cycle, sweep termination plus mark termination as Go counts them.
func pauseNs(ms *runtime.MemStats) []uint64 {
	n := int(ms.NumGC)
	if n > len(ms.PauseNs) {
		n = len(ms.PauseNs)
	}
	out := make([]uint64, 0, n)
	for i := int(ms.NumGC) - n; i < int(ms.NumGC); i++ {
		out = append(out, ms.PauseNs[i%len(ms.PauseNs)])
	}
	return out
}

// cpuNs is the CPU time (user + system) the process has used, every thread.
func cpuNs() int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return -1
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}

func report() {
	// Finish any GC cycle in progress (and run one more), so no cycle is
	// half counted: its sweep termination would already be in the pause
	// metrics and in a tracer's view, but not yet in PauseTotalNs.
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms) // a stop-the-world itself, counted below
	samples := []metrics.Sample{
		{Name: "/sched/pauses/total/gc:seconds"},
		{Name: "/sched/pauses/total/other:seconds"},
		{Name: "/gc/pauses:seconds"},
	}
	for _, name := range pauseHistograms {
		samples = append(samples, metrics.Sample{Name: name})
	}
	metrics.Read(samples)
	hist := map[string][][3]int64{}
	for _, s := range samples[3:] {
		if b := histBuckets(s); b != nil {
			hist[s.Name] = b
		}
	}
	out := map[string]any{
		"go_version":     runtime.Version(),
		"pid":            os.Getpid(),
		"stw_gc":         histCount(samples[0]),
		"stw_other":      histCount(samples[1]),
		"gc_pauses":      histCount(samples[2]),
		"num_gc":         ms.NumGC,
		"num_forced_gc":  ms.NumForcedGC,
		"pause_total_ns": ms.PauseTotalNs,
		"pause_ns":       pauseNs(&ms),
		"allocated_mib":  allocatedMiB,
		"elapsed_ns":     elapsed.Nanoseconds(),
		"cpu_ns":         cpuNs(),
		"histograms":     hist,
		"work_cpu_ns":    workCPUNs,
	}
	b, _ := json.Marshal(out)
	fmt.Printf("GOSTW_REPORT %s\n", b)
}
