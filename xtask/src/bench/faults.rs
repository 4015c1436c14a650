//! Overhead of the fault backend on processes that are NOT traced: every
//! page fault and context switch on the machine runs gostw's tracepoint
//! programs, which must stop at the traced-process lookup.
//!
//! The worker (this binary, hidden subcommand) does anonymous minor faults
//! (touching fresh pages) and file major faults (pages of a file evicted
//! with `posix_fadvise(DONTNEED)`, readahead off with `MADV_RANDOM`); runs
//! alternate without and with `gostw faults` attached to an idle process.

use std::{
    fs,
    io::{BufRead as _, BufReader, Write as _},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};

use crate::{cmd::step, setup};

/// What to run.
pub struct Options {
    /// Runs of each kind (without / with gostw), interleaved.
    pub runs: usize,
    /// MiB of anonymous memory touched per run (minor faults).
    pub anon_mb: usize,
    /// MiB of file read through page faults per run (major faults).
    pub file_mb: usize,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            runs: 7,
            anon_mb: 512,
            file_mb: 64,
        }
    }
}

#[derive(clap::Args)]
pub struct WorkerOptions {
    #[arg(long)]
    pub anon_mb: usize,
    #[arg(long)]
    pub file: PathBuf,
    /// Print `GOSTW_WORK begin` / `GOSTW_WORK end` lines around the work.
    #[arg(long)]
    pub marks: bool,
}

const PAGE: usize = 4096;

/// CPU time (user + system) of this process so far, in seconds: the cost
/// of the fault path itself, less disturbed by other load than wall time.
fn cpu_s() -> f64 {
    // SAFETY: getrusage fills the struct we pass.
    let ru = unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut ru);
        ru
    };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// Touch `anon_mb` of fresh anonymous memory, then every page of `file`
/// after evicting it; print "minor_wall minor_cpu major_wall major_cpu majflt".
pub fn worker(o: &WorkerOptions) -> anyhow::Result<()> {
    if o.marks {
        println!("GOSTW_WORK begin");
    }
    let c = cpu_s();
    let t = Instant::now();
    let len = o.anon_mb << 20;
    // SAFETY: anonymous private mapping, unmapped below; writes stay inside it.
    unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        if p == libc::MAP_FAILED {
            bail!("mmap: {}", std::io::Error::last_os_error());
        }
        for off in (0..len).step_by(PAGE) {
            p.cast::<u8>().add(off).write_volatile(1);
        }
        libc::munmap(p, len);
    }
    let minor = t.elapsed();
    let minor_cpu = cpu_s() - c;

    let f = fs::File::open(&o.file)?;
    let len = f.metadata()?.len() as usize;
    let before = majflt();
    let c = cpu_s();
    let t = Instant::now();
    use std::os::fd::AsRawFd as _;
    // SAFETY: read-only shared mapping of a file we keep open; reads stay inside it.
    let sum = unsafe {
        libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED);
        let p = libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            0,
        );
        if p == libc::MAP_FAILED {
            bail!("mmap: {}", std::io::Error::last_os_error());
        }
        libc::madvise(p, len, libc::MADV_RANDOM);
        let mut sum = 0u64;
        for off in (0..len).step_by(PAGE) {
            sum += u64::from(p.cast::<u8>().add(off).read_volatile());
        }
        libc::munmap(p, len);
        sum
    };
    let major = t.elapsed();
    let major_cpu = cpu_s() - c;
    if o.marks {
        println!("GOSTW_WORK end");
    }
    println!(
        "{:.6} {minor_cpu:.6} {:.6} {major_cpu:.6} {} {sum}",
        minor.as_secs_f64(),
        major.as_secs_f64(),
        majflt() - before
    );
    Ok(())
}

/// Write `mb` MiB of non-zero bytes to `path` and sync them (pages the
/// worker's major faults read back).
pub fn write_file(path: &Path, mb: usize) -> anyhow::Result<()> {
    let mut f = fs::File::create(path).context("creating the bench file")?;
    let block: Vec<u8> = (0..1 << 20).map(|i| (i % 251) as u8 + 1).collect();
    for _ in 0..mb {
        f.write_all(&block)?;
    }
    f.sync_all()?;
    Ok(())
}

fn majflt() -> u64 {
    let stat = fs::read_to_string("/proc/self/stat").unwrap_or_default();
    stat.rfind(')')
        .and_then(|i| stat[i + 2..].split_whitespace().nth(9)?.parse().ok())
        .unwrap_or(0)
}

struct Sample {
    minor_s: f64,
    minor_cpu: f64,
    major_s: f64,
    major_cpu: f64,
    majflt: u64,
}

fn run_worker(o: &Options, file: &Path) -> anyhow::Result<Sample> {
    let out = Command::new(std::env::current_exe()?)
        .args([
            "bench-fault-worker",
            "--anon-mb",
            &o.anon_mb.to_string(),
            "--file",
        ])
        .arg(file)
        .output()?;
    if !out.status.success() {
        bail!(
            "fault worker failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let text = String::from_utf8(out.stdout)?;
    let v: Vec<&str> = text.split_whitespace().collect();
    Ok(Sample {
        minor_s: v[0].parse()?,
        minor_cpu: v[1].parse()?,
        major_s: v[2].parse()?,
        major_cpu: v[3].parse()?,
        majflt: v[4].parse()?,
    })
}

/// `gostw faults` tracing an idle `sleep`, attached and running until dropped.
struct Gostw {
    gostw: std::process::Child,
    idle: std::process::Child,
}

impl Gostw {
    fn start(bin: &Path) -> anyhow::Result<Gostw> {
        let idle = Command::new("sleep").arg("3600").spawn()?;
        let mut gostw = Command::new(bin)
            .args(["faults", "--fault-source", "tracepoint", "--pid"])
            .arg(idle.id().to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()?;
        let mut err = BufReader::new(gostw.stderr.take().unwrap());
        let mut line = String::new();
        // It prints the backend once everything is attached.
        while err.read_line(&mut line)? > 0 && !line.contains("fault backend") {
            line.clear();
        }
        if !line.contains("fault backend") {
            bail!("gostw faults did not start");
        }
        Ok(Gostw { gostw, idle })
    }
}

impl Drop for Gostw {
    fn drop(&mut self) {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.gostw.id() as i32, libc::SIGINT) };
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline && matches!(self.gostw.try_wait(), Ok(None)) {
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.gostw.kill();
        let _ = self.gostw.wait();
        let _ = self.idle.kill();
        let _ = self.idle.wait();
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

pub fn run(o: &Options) -> anyhow::Result<()> {
    if !setup::is_root() {
        bail!("the faults bench attaches eBPF programs: run `sudo -E cargo xtask bench faults`");
    }
    let bin = crate::build::gostw(crate::arch::Arch::Amd64)?;
    let file = PathBuf::from(format!(
        "/var/tmp/gostw-bench-faults-{}.dat",
        std::process::id()
    ));
    let result = (|| -> anyhow::Result<()> {
        write_file(&file, o.file_mb)?;
        step(&format!(
            "{} runs each, interleaved: {} MiB anonymous (minor faults), {} MiB file (major faults)",
            o.runs, o.anon_mb, o.file_mb
        ));
        let (mut base, mut traced) = (Vec::new(), Vec::new());
        for i in 0..o.runs {
            let s = run_worker(o, &file)?;
            eprintln!(
                "  run {i}: without gostw: minor {:.3}s major {:.3}s ({} majflt)",
                s.minor_s, s.major_s, s.majflt
            );
            base.push(s);
            let g = Gostw::start(&bin)?;
            let s = run_worker(o, &file)?;
            drop(g);
            eprintln!(
                "  run {i}: with gostw:    minor {:.3}s major {:.3}s ({} majflt)",
                s.minor_s, s.major_s, s.majflt
            );
            traced.push(s);
        }
        let m = |v: &[Sample], f: fn(&Sample) -> f64| median(v.iter().map(f).collect());
        println!(
            "untraced process, medians of {} runs (without gostw -> with; ratio):",
            o.runs
        );
        let pages = [(o.anon_mb << 20) / PAGE, (o.file_mb << 20) / PAGE];
        for (what, n, wall, cpu) in [
            (
                "minor faults",
                pages[0],
                (|s| s.minor_s) as fn(&Sample) -> f64,
                (|s| s.minor_cpu) as fn(&Sample) -> f64,
            ),
            ("major faults", pages[1], |s| s.major_s, |s| s.major_cpu),
        ] {
            let (bw, tw, bc, tc) = (
                m(&base, wall),
                m(&traced, wall),
                m(&base, cpu),
                m(&traced, cpu),
            );
            println!(
                "  {what} ({n} pages): wall {bw:.3}s -> {tw:.3}s ({:.3}); cpu {bc:.3}s -> {tc:.3}s ({:.3}); {:.2} -> {:.2} us/fault cpu",
                tw / bw,
                tc / bc,
                bc * 1e6 / n as f64,
                tc * 1e6 / n as f64
            );
        }
        Ok(())
    })();
    let _ = fs::remove_file(&file);
    result
}
