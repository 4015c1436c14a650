//! A pause timeline as Chrome trace-event JSON (the "Trace Event Format"
//! that Perfetto UI, chrome://tracing and speedscope load), written as
//! events arrive.
//!
//! Layout: one process per traced pid (named with `process`); in it one
//! track for the process's stop-the-world pauses (complete events named by
//! reason, category "pause") above one track per thread (`thread`), where
//! fault slices (`slice`) and stack-growth instants (`instant`) go. Times
//! are CLOCK_MONOTONIC (Go's `nanotime`, `bpf_ktime_get_ns`), written in
//! microseconds with the nanoseconds kept as three decimals.
//!
//! ```
//! use tracer::formats::timeline::{TimelineWriter, Track};
//!
//! let mut t = TimelineWriter::new(Vec::new())?;
//! t.process(4242, "server")?;
//! t.pause(4242, "GC sweep termination", 1_000_000, 40_500, &serde_json::json!({"faults": 3}))?;
//! t.slice(Track::thread(4242, 4250), "fault", "major fault (swap)", 1_001_000, 20_000, &serde_json::Value::Null)?;
//! let json = t.finish()?;
//! let v: serde_json::Value = serde_json::from_slice(&json).unwrap();
//! assert_eq!(v["traceEvents"][3]["dur"], 40.5); // after 3 metadata events
//! # Ok::<(), std::io::Error>(())
//! ```
//!
//! Complete events on one track must nest: one process's pauses never
//! overlap, nor do one thread's faults.

use std::{
    collections::{HashMap, HashSet},
    fmt,
    io::{self, Write},
};

use serde_json::Value;

/// The thread id of each process's pause track: above Linux's largest pid
/// (`PID_MAX_LIMIT`, 2^22), so it is no real thread's.
pub const PAUSE_TRACK_TID: u32 = 1 << 30;

/// Name of the pause track of each process.
pub const PAUSE_TRACK_NAME: &str = "stop-the-world pauses";

/// A row of the timeline: a thread of a process (or its pause track).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Track {
    pub pid: u32,
    pub tid: u32,
}

impl Track {
    /// The track of thread `tid` of process `pid`.
    pub fn thread(pid: u32, tid: u32) -> Track {
        Track { pid, tid }
    }

    /// The pause track of process `pid`.
    pub fn pauses(pid: u32) -> Track {
        Track {
            pid,
            tid: PAUSE_TRACK_TID,
        }
    }
}

/// Nanoseconds shown as microseconds with up to three exact decimals
/// (no float rounding, whatever the clock's magnitude).
struct Micros(u64);

impl fmt::Display for Micros {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (us, ns) = (self.0 / 1000, self.0 % 1000);
        match ns {
            0 => write!(f, "{us}"),
            _ if ns % 100 == 0 => write!(f, "{us}.{}", ns / 100),
            _ if ns % 10 == 0 => write!(f, "{us}.{:02}", ns / 10),
            _ => write!(f, "{us}.{ns:03}"),
        }
    }
}

/// A JSON string literal.
fn quoted(s: &str) -> String {
    Value::from(s).to_string()
}

/// Writes a trace-event JSON object to `W`, one event per line.
pub struct TimelineWriter<W: Write> {
    out: W,
    events: u64,
    /// Names already written: (pid, tid or none for the process).
    names: HashMap<(u32, Option<u32>), String>,
    /// Processes whose pause track is named.
    pause_tracks: HashSet<u32>,
    other_data: serde_json::Map<String, Value>,
}

impl<W: Write> TimelineWriter<W> {
    /// Starts the JSON object on `out` (which a caller may want buffered).
    pub fn new(mut out: W) -> io::Result<TimelineWriter<W>> {
        out.write_all(b"{\"traceEvents\":[")?;
        let mut other_data = serde_json::Map::new();
        other_data.insert("clock".into(), "CLOCK_MONOTONIC".into());
        Ok(TimelineWriter {
            out,
            events: 0,
            names: HashMap::new(),
            pause_tracks: HashSet::new(),
            other_data,
        })
    }

    /// Events written so far (metadata included).
    pub fn events(&self) -> u64 {
        self.events
    }

    /// Starts the next event: a separator and a new line.
    fn next(&mut self) -> io::Result<&mut W> {
        self.out
            .write_all(if self.events == 0 { b"\n" } else { b",\n" })?;
        self.events += 1;
        Ok(&mut self.out)
    }

    fn metadata(&mut self, track: Track, kind: &str, args: &Value) -> io::Result<()> {
        let (pid, tid) = (track.pid, track.tid);
        let out = self.next()?;
        write!(
            out,
            r#"{{"name":{},"ph":"M","pid":{pid},"tid":{tid},"args":{args}}}"#,
            quoted(kind)
        )
    }

    /// Names process `pid` (written again only if the name changes).
    pub fn process(&mut self, pid: u32, name: &str) -> io::Result<()> {
        if self.names.get(&(pid, None)).is_some_and(|n| n == name) {
            return Ok(());
        }
        self.names.insert((pid, None), name.to_owned());
        self.metadata(
            Track::thread(pid, 0),
            "process_name",
            &serde_json::json!({ "name": name }),
        )
    }

    /// Names thread `tid` of process `pid` (written again only if the name
    /// changes).
    pub fn thread(&mut self, pid: u32, tid: u32, name: &str) -> io::Result<()> {
        if self.names.get(&(pid, Some(tid))).is_some_and(|n| n == name) {
            return Ok(());
        }
        self.names.insert((pid, Some(tid)), name.to_owned());
        self.metadata(
            Track::thread(pid, tid),
            "thread_name",
            &serde_json::json!({ "name": name }),
        )
    }

    /// One stop-the-world pause of `pid`: a complete event named `reason`
    /// on the process's pause track, `args` shown when it is selected
    /// (breakdown, faults, caller). The track is named on first use.
    pub fn pause(
        &mut self,
        pid: u32,
        reason: &str,
        start_ns: u64,
        dur_ns: u64,
        args: &Value,
    ) -> io::Result<()> {
        if self.pause_tracks.insert(pid) {
            let track = Track::pauses(pid);
            self.thread(pid, track.tid, PAUSE_TRACK_NAME)?;
            // Above the thread tracks.
            self.metadata(
                track,
                "thread_sort_index",
                &serde_json::json!({ "sort_index": -1 }),
            )?;
        }
        self.slice(Track::pauses(pid), "pause", reason, start_ns, dur_ns, args)
    }

    /// A complete event ("ph":"X") of `dur_ns` on `track`, e.g. a major
    /// fault on the faulting thread. `Value::Null` args are left out.
    pub fn slice(
        &mut self,
        track: Track,
        category: &str,
        name: &str,
        start_ns: u64,
        dur_ns: u64,
        args: &Value,
    ) -> io::Result<()> {
        let kind = format_args!(r#""ph":"X","dur":{}"#, Micros(dur_ns));
        self.timed(track, category, name, start_ns, kind, args)
    }

    /// An instant event ("ph":"i", thread scope) at `ts_ns` on `track`,
    /// e.g. a goroutine stack growth.
    pub fn instant(
        &mut self,
        track: Track,
        category: &str,
        name: &str,
        ts_ns: u64,
        args: &Value,
    ) -> io::Result<()> {
        self.timed(
            track,
            category,
            name,
            ts_ns,
            format_args!(r#""ph":"i","s":"t""#),
            args,
        )
    }

    /// An event at `ts_ns` on `track`; `kind` is its `"ph"` and what goes
    /// with it (a duration, a scope).
    fn timed(
        &mut self,
        track: Track,
        category: &str,
        name: &str,
        ts_ns: u64,
        kind: fmt::Arguments<'_>,
        args: &Value,
    ) -> io::Result<()> {
        let (pid, tid) = (track.pid, track.tid);
        let (name, category) = (quoted(name), quoted(category));
        let out = self.next()?;
        write!(
            out,
            r#"{{"name":{name},"cat":{category},{kind},"ts":{},"pid":{pid},"tid":{tid}"#,
            Micros(ts_ns)
        )?;
        write_args(out, args)
    }

    /// A key of the trailing `otherData` object (e.g. the gostw version,
    /// the command line); "clock" is set already.
    pub fn other_data(&mut self, key: &str, value: Value) {
        self.other_data.insert(key.to_owned(), value);
    }

    /// Closes the JSON object and hands back the writer, flushed.
    pub fn finish(mut self) -> io::Result<W> {
        let other = Value::Object(std::mem::take(&mut self.other_data));
        write!(
            self.out,
            "\n],\"displayTimeUnit\":\"ns\",\"otherData\":{other}}}\n"
        )?;
        self.out.flush()?;
        Ok(self.out)
    }
}

/// `,"args":{...}}` (or just `}` for null args): the end of an event.
fn write_args(out: &mut impl Write, args: &Value) -> io::Result<()> {
    if args.is_null() {
        out.write_all(b"}")
    } else {
        write!(out, r#","args":{args}}}"#)
    }
}

#[cfg(test)]
#[path = "timeline_tests.rs"]
mod tests;
