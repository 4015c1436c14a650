use std::sync::{
    Arc, Mutex,
    atomic::{AtomicBool, Ordering},
};

use super::*;

/// A destination that blocks each write until the test opens its gate (a
/// pipe nobody reads), and fails while `full` is set (a full disk).
#[derive(Clone, Default)]
struct Fake {
    open: Arc<(Mutex<bool>, Condvar)>,
    full: Arc<AtomicBool>,
    lines: Arc<Mutex<Vec<Vec<u8>>>>,
}

impl Fake {
    fn open(&self) {
        *self.open.0.lock().unwrap() = true;
        self.open.1.notify_all();
    }

    fn opened() -> Fake {
        let f = Fake::default();
        f.open();
        f
    }

    fn lines(&self) -> Vec<String> {
        self.lines
            .lock()
            .unwrap()
            .iter()
            .map(|l| String::from_utf8_lossy(l).into_owned())
            .collect()
    }
}

impl Destination for Fake {
    fn write_line(&mut self, line: &[u8]) -> io::Result<()> {
        let mut open = self.open.0.lock().unwrap();
        while !*open {
            open = self.open.1.wait(open).unwrap();
        }
        if self.full.load(Ordering::SeqCst) {
            return Err(io::Error::from_raw_os_error(libc::ENOSPC));
        }
        self.lines.lock().unwrap().push(line.to_vec());
        Ok(())
    }
}

const BOUNDS: Bounds = Bounds {
    lines: 3,
    bytes: 1 << 20,
};

fn line(n: usize) -> Vec<u8> {
    format!("{n}\n").into_bytes()
}

/// Wait (bounded) until `f` holds.
fn eventually(what: &str, f: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn a_stalled_destination_costs_lines_counted_never_a_wait() {
    let dest = Fake::default();
    let q = LineQueue::start("test", BOUNDS, dest.clone(), OutputCounters::default()).unwrap();
    let watch = q.watch();
    // The first line is taken by the writer, which blocks on it; three wait.
    assert!(q.try_line(line(0)));
    eventually("the writer to block", || watch.blocked_for().is_some());
    let started = Instant::now();
    let taken = (1..=10).filter(|&n| q.try_line(line(n))).count();
    assert!(started.elapsed() < Duration::from_secs(1));
    assert_eq!(taken, 3);
    let l = watch.losses();
    assert_eq!((l.queue_full, l.write_error, l.written), (7, 0, 0));
    assert!(l.first_unix_ns > 0 && l.first_unix_ns <= l.last_unix_ns);
    assert!(watch.faulted_within(Duration::from_secs(10)));
    assert_eq!(watch.queued(), 3);
    std::thread::sleep(Duration::from_millis(20));
    assert!(watch.blocked_for().unwrap() >= Duration::from_millis(20));
    // The reader comes back: what was queued is written, in order.
    dest.open();
    eventually("the queue to drain", || watch.losses().written == 4);
    assert_eq!(dest.lines(), ["0\n", "1\n", "2\n", "3\n"]);
    assert!(watch.blocked_for().is_none());
    assert!(q.try_line(line(11)));
    let unwritten = q.finish(Instant::now() + Duration::from_secs(5));
    assert_eq!(unwritten, Unwritten::default());
    assert_eq!(dest.lines().last().unwrap(), "11\n");
}

#[test]
fn finish_gives_up_at_its_deadline_and_says_what_is_left() {
    let dest = Fake::default();
    let q = LineQueue::start("test", BOUNDS, dest.clone(), OutputCounters::default()).unwrap();
    let watch = q.watch();
    for n in 0..3 {
        assert!(q.try_line(line(n)));
    }
    eventually("the writer to block", || watch.blocked_for().is_some());
    let started = Instant::now();
    let unwritten = q.finish(Instant::now() + Duration::from_millis(100));
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(100) && took < Duration::from_secs(1),
        "{took:?}"
    );
    // Two queued and the one being written.
    assert_eq!(unwritten.lines, 3);
    assert!(unwritten.blocked_for.is_some());
    // Let the thread go (it would write the rest and end).
    dest.open();
}

#[test]
fn a_full_disk_counts_errors_and_writing_resumes_once_there_is_room() {
    let dest = Fake::opened();
    let q = LineQueue::start("test", BOUNDS, dest.clone(), OutputCounters::default()).unwrap();
    let watch = q.watch();
    assert!(q.try_line(line(0)));
    eventually("line 0", || watch.losses().written == 1);
    dest.full.store(true, Ordering::SeqCst);
    for n in 1..=2 {
        assert!(q.try_line(line(n)));
    }
    eventually("two errors", || watch.losses().write_error == 2);
    let e = q.take_error().expect("the first error");
    assert_eq!(e.raw_os_error(), Some(libc::ENOSPC));
    assert!(q.take_error().is_none());
    assert!(watch.faulted_within(Duration::from_secs(10)));
    // Room again: not off for good.
    dest.full.store(false, Ordering::SeqCst);
    assert!(q.try_line(line(3)));
    eventually("line 3", || watch.losses().written == 2);
    assert_eq!(dest.lines(), ["0\n", "3\n"]);
    assert_eq!(q.finish(Instant::now()).lines, 0);
}

#[test]
fn the_counters_handed_in_count_and_a_rate_limit_is_no_fault() {
    let counters = OutputCounters {
        any_loss: Some(Counter::default()),
        ..OutputCounters::default()
    };
    let q = LineQueue::start("test", BOUNDS, Fake::opened(), counters.clone()).unwrap();
    q.lost(Reason::RateLimit, 5);
    assert!(q.try_line(line(1)));
    eventually("the line", || counters.written.get() == 1);
    assert_eq!(counters.dropped_for(Reason::RateLimit).get(), 5);
    assert_eq!(counters.any_loss.as_ref().unwrap().get(), 5);
    assert!(!q.watch().faulted_within(Duration::from_secs(10)));
    assert_eq!(q.watch().losses().total(), 5);
}

#[test]
fn a_summary_waits_for_room_until_its_deadline() {
    let dest = Fake::default();
    let q = LineQueue::start(
        "test",
        Bounds {
            lines: 1,
            bytes: 64,
        },
        dest.clone(),
        OutputCounters::default(),
    )
    .unwrap();
    let watch = q.watch();
    assert!(q.try_line(line(0)));
    eventually("the writer to block", || watch.blocked_for().is_some());
    assert!(q.try_line(line(1)));
    // No room, and nobody reads: given up at the deadline, counted.
    let started = Instant::now();
    assert!(!q.send_within(b"summary\n".to_vec(), started + Duration::from_millis(50)));
    assert!(started.elapsed() >= Duration::from_millis(50));
    assert_eq!(watch.losses().queue_full, 1);
    // The reader comes back meanwhile: the summary goes after the lines.
    let opener = {
        let dest = dest.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            dest.open();
        })
    };
    assert!(q.send_within(
        b"summary\n".to_vec(),
        Instant::now() + Duration::from_secs(5)
    ));
    opener.join().unwrap();
    assert_eq!(q.finish(Instant::now() + Duration::from_secs(5)).lines, 0);
    assert_eq!(dest.lines(), ["0\n", "1\n", "summary\n"]);
}

#[test]
fn raw_stdout_writes_a_line_whole_to_a_pipe() {
    let (mut r, w) = std::io::pipe().unwrap();
    use std::{io::Read as _, os::fd::AsRawFd as _};
    write_fd(w.as_raw_fd(), b"one line\n").unwrap();
    drop(w);
    let mut s = String::new();
    r.read_to_string(&mut s).unwrap();
    assert_eq!(s, "one line\n");
}

#[test]
fn the_last_words_wait_for_a_slow_reader_but_not_for_a_stalled_one() {
    // Slow: the reader comes back after a while, shorter than the stall.
    let dest = Fake::default();
    let q = LineQueue::start("test", BOUNDS, dest.clone(), OutputCounters::default()).unwrap();
    for n in 0..3 {
        assert!(q.try_line(line(n)));
    }
    let opener = {
        let dest = dest.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            dest.open();
        })
    };
    let u = q.finish_after(b"end\n".to_vec(), Duration::from_secs(5));
    opener.join().unwrap();
    assert_eq!(u, Unwritten::default());
    assert_eq!(dest.lines(), ["0\n", "1\n", "2\n", "end\n"]);

    // Stalled: given up after the stall, with what is left.
    let dest = Fake::default();
    let q = LineQueue::start("test", BOUNDS, dest.clone(), OutputCounters::default()).unwrap();
    let watch = q.watch();
    assert!(q.try_line(line(0)));
    eventually("the writer to block", || watch.blocked_for().is_some());
    for n in 1..4 {
        assert!(q.try_line(line(n)));
    }
    let started = Instant::now();
    let u = q.finish_after(b"end\n".to_vec(), Duration::from_millis(50));
    assert!(started.elapsed() < Duration::from_secs(1));
    // Three queued, one being written, and the last words.
    assert_eq!(u.lines, 5);
    assert_eq!(watch.losses().queue_full, 1);
    dest.open();
}
