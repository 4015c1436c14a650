// Command stackgrowth is a Go workload whose goroutine stack growth is known.
// Every task calls deep19k, whose frame needs about 19 KB of stack: a
// goroutine that starts with the default 2 KB stack grows once, straight to
// 32 KB, the first time it runs it (newstack doubles until the frame fits).
//
// Modes:
//
//	batch    one new goroutine per task, -batch at a time: one growth per task
//	pool     -workers long-lived goroutines take the same tasks from a
//	         channel: one growth per worker
//	preempt  CPU-bound goroutines with shallow stacks, preempted by the
//	         scheduler and by a stream of GCs: no growth to speak of
//	server   an HTTP server on loopback (a goroutine per connection) whose
//	         handler runs the task, and -clients goroutines requesting
//	         without keep-alive; the peak goroutine count is sampled every
//	         millisecond (GC on, as in a real server)
//
// The GC is off in batch and pool modes (debug.SetGCPercent(-1)), so the
// runtime's adaptive starting stack size stays at 2 KB and nothing shrinks:
// every growth the workload causes is one it can count. At exit it prints,
// as one JSON line prefixed "GOSTW_REPORT ", what it did.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// deepFrameBytes is the size of deep19k's local buffer.
const deepFrameBytes = 19 * 1024

var (
	deepCalls  atomic.Int64
	goroutines atomic.Int64
	// deepGoroutines counts goroutines that ran deep19k at least once: each
	// of them grew its stack from 2 KB to 32 KB exactly once, there.
	deepGoroutines atomic.Int64
	sink           atomic.Int64
	// peakGoroutines is the most goroutines seen alive at once.
	peakGoroutines atomic.Int64
)

func notePeak() {
	n := int64(runtime.NumGoroutine())
	for {
		p := peakGoroutines.Load()
		if n <= p || peakGoroutines.CompareAndSwap(p, n) {
			return
		}
	}
}

// deep19k needs about 19 KB of stack for its own frame.
//
//go:noinline
func deep19k(seed int) int {
	var buf [deepFrameBytes]byte
	for i := 0; i < len(buf); i += 64 {
		buf[i] = byte(seed + i)
	}
	s := 0
	for i := 0; i < len(buf); i += 256 {
		s += int(buf[i])
	}
	return s
}

// task is deep19k's only caller.
//
//go:noinline
func task(seed int) int {
	deepCalls.Add(1)
	return deep19k(seed) + 1
}

func runBatch(tasks, batch int) {
	var wg sync.WaitGroup
	for done := 0; done < tasks; {
		n := batch
		if tasks-done < n {
			n = tasks - done
		}
		wg.Add(n)
		for i := 0; i < n; i++ {
			seed := done + i
			goroutines.Add(1)
			go func() {
				defer wg.Done()
				deepGoroutines.Add(1)
				sink.Add(int64(task(seed)))
			}()
		}
		notePeak()
		wg.Wait()
		done += n
	}
}

func runPool(tasks, workers int) {
	ch := make(chan int, 256)
	var wg sync.WaitGroup
	wg.Add(workers)
	for w := 0; w < workers; w++ {
		goroutines.Add(1)
		go func() {
			defer wg.Done()
			first := true
			for seed := range ch {
				if first {
					deepGoroutines.Add(1)
					first = false
				}
				sink.Add(int64(task(seed)))
			}
		}()
	}
	notePeak()
	for i := 0; i < tasks; i++ {
		ch <- i
	}
	close(ch)
	wg.Wait()
}

// shallow has a stack check (not a leaf, not inlined) but a tiny frame: the
// check is where a preemption request (stackguard0 = stackPreempt) lands.
//
//go:noinline
func shallow(i int) int {
	if i < 0 {
		return shallow(i + 1)
	}
	return i*7 + 1
}

func runPreempt(spinners int, d time.Duration) {
	var stop atomic.Bool
	var wg sync.WaitGroup
	wg.Add(spinners)
	for s := 0; s < spinners; s++ {
		goroutines.Add(1)
		go func() {
			defer wg.Done()
			n := 0
			for !stop.Load() {
				n = shallow(n & 0xffff)
			}
			sink.Add(int64(n))
		}()
	}
	notePeak()
	deadline := time.Now().Add(d)
	var garbage [][]byte
	for time.Now().Before(deadline) {
		// Every GC stops the world and preempts every running goroutine.
		runtime.GC()
		garbage = append(garbage[:0], make([]byte, 1<<20))
	}
	stop.Store(true)
	wg.Wait()
	runtime.KeepAlive(garbage)
}

func runServer(clients int, d time.Duration) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	var served atomic.Int64
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// A connection per request (no keep-alive): a goroutine per request.
		deepGoroutines.Add(1)
		fmt.Fprint(w, task(int(served.Add(1))))
	})}
	go srv.Serve(ln)
	stop := make(chan struct{})
	go func() {
		t := time.NewTicker(time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				notePeak()
			}
		}
	}()
	url := "http://" + ln.Addr().String() + "/"
	deadline := time.Now().Add(d)
	var wg sync.WaitGroup
	wg.Add(clients)
	for c := 0; c < clients; c++ {
		goroutines.Add(1)
		go func() {
			defer wg.Done()
			client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
			for time.Now().Before(deadline) {
				resp, err := client.Get(url)
				if err != nil {
					continue
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}()
	}
	wg.Wait()
	close(stop)
	srv.Close()
}

func readMetric(name string) int64 {
	s := []metrics.Sample{{Name: name}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 {
		return -1 // not in this Go version
	}
	return int64(s[0].Value.Uint64())
}

func main() {
	mode := flag.String("mode", "batch", "batch, pool or preempt")
	tasks := flag.Int("tasks", 20000, "tasks (batch, pool)")
	batch := flag.Int("batch", 64, "goroutines started at a time (batch)")
	workers := flag.Int("workers", 4, "worker goroutines (pool)")
	spinners := flag.Int("spinners", 8, "CPU-bound goroutines (preempt)")
	clients := flag.Int("clients", 16, "client goroutines (server)")
	duration := flag.Duration("duration", 0, "batch/pool: repeat until this much time has passed; preempt: run this long (default 2s)")
	marks := flag.Bool("marks", false, "print GOSTW_WORK begin/end lines around the timed work (for benchmarks)")
	flag.Parse()

	if *mode == "batch" || *mode == "pool" {
		debug.SetGCPercent(-1)
	}
	if *marks {
		fmt.Println("GOSTW_WORK begin")
	}
	var ru0 syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru0)
	start := time.Now()
	deadline := start.Add(*duration)
	rounds := 0
	switch *mode {
	case "batch", "pool":
		for rounds == 0 || time.Now().Before(deadline) {
			if *mode == "batch" {
				runBatch(*tasks, *batch)
			} else {
				runPool(*tasks, *workers)
			}
			rounds++
		}
	case "preempt":
		d := *duration
		if d == 0 {
			d = 2 * time.Second
		}
		runPreempt(*spinners, d)
		rounds = 1
	case "server":
		d := *duration
		if d == 0 {
			d = 2 * time.Second
		}
		runServer(*clients, d)
		rounds = 1
	default:
		fmt.Fprintf(os.Stderr, "unknown mode %q\n", *mode)
		os.Exit(2)
	}
	elapsed := time.Since(start)
	var ru1 syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru1)
	if *marks {
		fmt.Println("GOSTW_WORK end")
	}
	workCPU := ru1.Utime.Nano() + ru1.Stime.Nano() - ru0.Utime.Nano() - ru0.Stime.Nano()
	// CPU time of the whole process (a probe's cost lands in it, as system
	// time of the thread that hit it), less sensitive than wall time to
	// other load on the machine.
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	cpu := time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	out := map[string]any{
		"go_version":        runtime.Version(),
		"pid":               os.Getpid(),
		"mode":              *mode,
		"rounds":            rounds,
		"deep_calls":        deepCalls.Load(),
		"goroutines":        goroutines.Load(),
		"peak_goroutines":   peakGoroutines.Load(),
		"deep_goroutines":   deepGoroutines.Load(),
		"deep_frame_bytes":  deepFrameBytes,
		"elapsed_ns":        elapsed.Nanoseconds(),
		"tasks_per_sec":     float64(deepCalls.Load()) / elapsed.Seconds(),
		"cpu_ns":            cpu.Nanoseconds(),
		"work_cpu_ns":       workCPU,
		"tasks_per_cpu_sec": float64(deepCalls.Load()) / cpu.Seconds(),
		"num_gc":            ms.NumGC,
		"starting_stack":    readMetric("/gc/stack/starting-size:bytes"),
		"stack_inuse":       ms.StackInuse,
	}
	b, _ := json.Marshal(out)
	fmt.Printf("GOSTW_REPORT %s\n", b)
}
