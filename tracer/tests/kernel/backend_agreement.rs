//! The two fault backends, side by side on one workload: two sessions (each
//! its own copy of the programs and maps), one with kprobes and one with
//! tracepoints, trace the same paged-out gcswap process at the same time.
//! Pauses are matched by Go's own start time, which both read from the same
//! registers, and their fault counts compared.
//!
//! Needs kprobes, so it runs in the VM suite (`cargo xtask vm-test`, part of
//! `cargo xtask test`); the host's kernel test step skips it by name.

use std::collections::BTreeMap;

use tracer::{
    engine::Engine,
    kernel::{CoreOptions, capabilities, capabilities::FaultSource},
    sink::report::{Output, ReportSink, View},
};

use crate::{
    scenario::{GcSwap, MemCgroup, SwapFile, swap_out},
    support::{build_workload, engine, newest_go, require_root},
};

/// One engine with its own copy of the programs, maps and backend.
struct Tracer {
    engine: Engine,
    sink: ReportSink,
}

impl Tracer {
    fn new(source: FaultSource) -> Tracer {
        Tracer {
            engine: engine(CoreOptions {
                faults: Some(source),
                stacks: None,
                ..CoreOptions::default()
            }),
            sink: ReportSink::new(
                View::Faults,
                Output::new(
                    Box::new(std::io::sink()),
                    true,
                    tracer::model::pause::SlowThreshold::NONE,
                ),
                true,
                None,
            ),
        }
    }

    fn trace(&mut self, pid: u32, path: &std::path::Path) {
        self.engine
            .trace_process(pid, path, &mut self.sink)
            .unwrap();
    }

    fn drain(&mut self) {
        self.engine.pump(&mut self.sink);
    }

    /// Faults per pause of `pid`, keyed by Go's pause start time.
    fn faults_per_pause(&mut self, pid: u32) -> BTreeMap<u64, u64> {
        self.engine.process_exited(pid, &mut self.sink);
        self.sink
            .summary(0)
            .faults
            .unwrap()
            .pauses
            .iter()
            .filter(|p| p.window.tgid == pid)
            .map(|p| (p.window.start_ns, p.all.faults))
            .collect()
    }
}

/// Per pause, the backends may differ by the faults that begin at the very
/// edge of the window: the tracepoint backend timestamps a fault at the
/// exception entry, the kprobe backend a little later in do_swap_page or
/// filemap_fault. Allowed: 10% of the larger count + 3 per pause, and 5% over
/// all pauses.
fn close(a: u64, b: u64, rel: f64, abs: u64) -> bool {
    a.abs_diff(b) as f64 <= rel * a.max(b) as f64 + abs as f64
}

#[test]
fn kprobe_and_tracepoint_backends_agree_per_pause() {
    require_root();
    let caps = capabilities::detect();
    if !caps.kprobes.available {
        let why = &caps.kprobes.detail;
        panic!(
            "this test needs kprobes ({why}); it runs in the VM suite (`cargo xtask vm-test`) \
             and the host's kernel test step skips it by name"
        );
    }
    let _swap = SwapFile::create("backends-agree", 1);
    let cgroup = MemCgroup::create("gostw-backends");
    let go = newest_go();
    let path = build_workload("gcswap", &go, "", &[]);
    let rt = crate::support::runtime();
    let _guard = rt.enter();
    let mut kprobe = Tracer::new(FaultSource::Kprobe);
    let mut tracepoint = Tracer::new(FaultSource::Tracepoint);

    // Async preemption off, as in the kprobe page-out test: its signals make
    // the kernel leave retried faults out of majflt, which the kprobe backend
    // reports at the retry; here we compare backends, not that effect.
    let env = [("GOMAXPROCS", "8"), ("GODEBUG", "asyncpreemptoff=1")];
    let args = ["-live-mb", "64", "-goroutines", "4000", "-walkers", "8"];
    let mut workload = GcSwap::start(&path, &args, &env, |pid| {
        cgroup.add(pid);
        kprobe.trace(pid, &path);
        tracepoint.trace(pid, &path);
    });
    let pid = workload.pid;
    for _ in 0..3 {
        let bytes = swap_out(pid, &cgroup);
        assert!(bytes > 32 << 20, "paged out only {bytes} bytes");
        workload.gc();
        kprobe.drain();
        tracepoint.drain();
    }
    let _ = workload.quit();
    kprobe.drain();
    tracepoint.drain();

    let by_kprobe = kprobe.faults_per_pause(pid);
    let by_tracepoint = tracepoint.faults_per_pause(pid);
    eprintln!(
        "faults per pause (Go start ns -> count)\n  kprobe     {by_kprobe:?}\n  tracepoint {by_tracepoint:?}"
    );
    assert_eq!(
        by_kprobe.keys().collect::<Vec<_>>(),
        by_tracepoint.keys().collect::<Vec<_>>(),
        "the two sessions saw different pauses"
    );
    assert!(
        by_kprobe.values().any(|&n| n > 0),
        "no pause faulted: the page-out did not take"
    );
    for (start, k) in &by_kprobe {
        let t = by_tracepoint[start];
        assert!(
            close(*k, t, 0.10, 3),
            "pause at {start}: kprobe {k} faults, tracepoint {t}"
        );
    }
    let (k, t): (u64, u64) = (by_kprobe.values().sum(), by_tracepoint.values().sum());
    assert!(
        close(k, t, 0.05, 3),
        "in all pauses: kprobe {k}, tracepoint {t}"
    );
}
