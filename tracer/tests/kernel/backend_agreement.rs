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
    binary::GoBinary,
    events::EventReader,
    faults::{FaultSource, FaultTracer, PauseWindow, backend::KernelSupport},
    pauses::WallClock,
    pipeline::{Pipeline, Record},
    session::Session,
};

use crate::{
    scenario::{GcSwap, MemCgroup, SwapFile, swap_out},
    support::{build_workload, newest_go, require_root},
};

/// One tracing session with its own backend.
struct Tracer {
    session: Session,
    faults: FaultTracer,
    pipeline: Pipeline,
    reader: EventReader,
}

impl Tracer {
    fn new(binary: &GoBinary, source: FaultSource) -> Tracer {
        let mut session = Session::new().unwrap();
        let faults = FaultTracer::attach(session.programs(), source)
            .unwrap_or_else(|e| panic!("attaching the {source:?} backend: {e:#}"));
        session.attach_binary(binary).unwrap();
        let reader = EventReader::new(session.programs().take_events().unwrap()).unwrap();
        Tracer {
            session,
            faults,
            pipeline: Pipeline::new(WallClock::now()),
            reader,
        }
    }

    fn drain(&mut self) {
        let Tracer {
            faults,
            pipeline,
            reader,
            ..
        } = self;
        reader.drain(|bytes| {
            if let Some(Record::Pause(p)) = pipeline.feed(bytes) {
                faults.add_window(PauseWindow::from(&p));
            }
            faults.handle_event(bytes);
        });
    }

    /// Faults per pause of `pid`, keyed by Go's pause start time.
    fn faults_per_pause(&self, pid: u32) -> BTreeMap<u64, u64> {
        self.faults
            .summary()
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
    if let Err(why) = KernelSupport::detect().kprobes {
        panic!(
            "this test needs kprobes ({why}); it runs in the VM suite (`cargo xtask vm-test`) \
             and the host's kernel test step skips it by name"
        );
    }
    let _swap = SwapFile::create("backends-agree", 1);
    let cgroup = MemCgroup::create("gostw-backends");
    let go = newest_go();
    let path = build_workload("gcswap", &go, "", &[]);
    let binary = GoBinary::open(&path).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
        .unwrap();
    let _guard = rt.enter();
    let mut kprobe = Tracer::new(&binary, FaultSource::Kprobe);
    let mut tracepoint = Tracer::new(&binary, FaultSource::Tracepoint);

    // Async preemption off, as in the kprobe page-out test: its signals make
    // the kernel leave retried faults out of majflt, which the kprobe backend
    // reports at the retry; here we compare backends, not that effect.
    let env = [("GOMAXPROCS", "8"), ("GODEBUG", "asyncpreemptoff=1")];
    let args = ["-live-mb", "64", "-goroutines", "4000", "-walkers", "8"];
    let mut workload = GcSwap::start(&path, &args, &env, |pid| {
        cgroup.add(pid);
        kprobe.session.trace_process(pid, &binary).unwrap();
        tracepoint.session.trace_process(pid, &binary).unwrap();
    });
    let pid = workload.pid;
    kprobe.faults.add_process(pid).unwrap();
    tracepoint.faults.add_process(pid).unwrap();
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
