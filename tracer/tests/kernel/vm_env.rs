//! What the VM (`cargo xtask vm-test`) must give the kprobe fault backend's
//! tests: a Go process squeezed by a memory cgroup really swaps pages in, and
//! a kprobe on `do_swap_page` sees it. VM only (the host kernel has neither
//! kprobes nor swap): the host's kernel test step skips this module.

use std::{fs, path::Path, process::Stdio};

use tracer::targets::child::StoppedChild;

use crate::support::{build_workload, newest_go, require_root, vm_kernel};

const TRACEFS: &str = "/sys/kernel/tracing";
const CGROUP: &str = "/sys/fs/cgroup/gostw-vm-swap";

/// A kprobe registered through tracefs for as long as the value lives.
struct TraceKprobe {
    event: &'static str,
}

impl TraceKprobe {
    /// `p:gostw_test/<event> <function>`, enabled.
    fn new(event: &'static str, function: &str) -> Self {
        let probe = format!("p:gostw_test/{event} {function}");
        append(&format!("{TRACEFS}/kprobe_events"), &probe)
            .unwrap_or_else(|e| panic!("registering kprobe {probe:?}: {e}"));
        fs::write(format!("{TRACEFS}/events/gostw_test/{event}/enable"), "1")
            .unwrap_or_else(|e| panic!("enabling kprobe {event}: {e}"));
        TraceKprobe { event }
    }

    /// Hits so far (`kprobe_profile`).
    fn hits(&self) -> u64 {
        let profile = fs::read_to_string(format!("{TRACEFS}/kprobe_profile")).unwrap();
        profile
            .lines()
            .find_map(|l| {
                let mut f = l.split_whitespace();
                (f.next() == Some(self.event)).then(|| f.next()?.parse().ok())?
            })
            .unwrap_or_else(|| panic!("{} not in kprobe_profile:\n{profile}", self.event))
    }
}

impl Drop for TraceKprobe {
    fn drop(&mut self) {
        let event = self.event;
        let _ = fs::write(format!("{TRACEFS}/events/gostw_test/{event}/enable"), "0");
        let _ = append(
            &format!("{TRACEFS}/kprobe_events"),
            &format!("-:gostw_test/{event}"),
        );
    }
}

/// Append one line to a tracefs control file (appending keeps the probes
/// other tests or init.sh registered).
fn append(path: &str, line: &str) -> std::io::Result<()> {
    use std::io::Write as _;
    let mut f = fs::OpenOptions::new().append(true).open(path)?;
    writeln!(f, "{line}")
}

/// `pswpin` of /proc/vmstat: pages swapped in since boot.
fn pages_swapped_in() -> u64 {
    fs::read_to_string("/proc/vmstat")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("pswpin ")?.parse().ok())
        .expect("pswpin in /proc/vmstat")
}

#[test]
fn squeezed_go_process_swaps_in_and_do_swap_page_kprobe_fires() {
    require_root();
    let kernel = vm_kernel().unwrap_or_else(|| {
        panic!("VM only (kprobes, swap, cgroup v2 memory): run `cargo xtask vm-test`")
    });
    let swaps = fs::read_to_string("/proc/swaps").unwrap();
    assert!(
        swaps.lines().count() > 1,
        "{kernel}: no swap in the VM (init.sh sets it up on /dev/vda):\n{swaps}"
    );
    let go = newest_go();
    let workload = build_workload("stw", &go, "", &[]);

    // A 24 MiB memory cgroup: the workload's heap (16 MiB live, as much again
    // of garbage between GCs) does not fit, so reclaim swaps its pages out and
    // the next sweep or mark swaps them back in; for 2 s at least (the
    // rounds repeat until then), as 128 MiB alone can take well under a
    // second, and one such run swapped nothing in.
    fs::write("/sys/fs/cgroup/cgroup.subtree_control", "+memory")
        .expect("enabling the cgroup v2 memory controller");
    let _ = fs::remove_dir(CGROUP);
    fs::create_dir(CGROUP).expect("creating the test cgroup");
    fs::write(Path::new(CGROUP).join("memory.max"), "24M").unwrap();

    let kprobe = TraceKprobe::new("do_swap_page", "do_swap_page");
    let (hits_before, swapped_before) = (kprobe.hits(), pages_swapped_in());
    let stopped = StoppedChild::spawn(
        workload.as_os_str(),
        &[
            "-gc",
            "4",
            "-alloc-mb",
            "128",
            "-live-mb",
            "16",
            "-duration",
            "2s",
        ]
        .map(std::ffi::OsStr::new),
        |cmd| {
            cmd.stdout(Stdio::null());
        },
    )
    .expect("starting the workload");
    fs::write(
        Path::new(CGROUP).join("cgroup.procs"),
        stopped.pid().to_string(),
    )
    .expect("moving the workload into the cgroup");
    let status = stopped.resume().unwrap().wait().unwrap();
    let (hits, swapped) = (
        kprobe.hits() - hits_before,
        pages_swapped_in() - swapped_before,
    );
    drop(kprobe);
    let _ = fs::remove_dir(CGROUP);
    eprintln!("{kernel}: {swapped} pages swapped in, {hits} do_swap_page hits");
    assert!(status.success(), "workload failed: {status:?}");
    assert!(swapped > 0, "{kernel}: nothing was swapped in");
    assert!(hits > 0, "{kernel}: the do_swap_page kprobe never fired");
}

/// The guest's `gostw` (where the tests find theirs) is the static release
/// binary `cargo xtask dist` ships: no program interpreter, and no C library
/// of its own build in the guest's busybox root beside it; every test of the
/// VM list runs it there.
#[test]
fn the_guests_gostw_is_the_static_release_binary() {
    let kernel = vm_kernel().unwrap_or_else(|| {
        panic!("VM only (the payload puts the static release gostw in the guest): run `cargo xtask vm-test`")
    });
    let gostw = env!("CARGO_BIN_EXE_gostw");
    let data = fs::read(gostw).unwrap();
    let elf = object::read::elf::ElfFile64::<object::Endianness>::parse(&*data).unwrap();
    let endian = elf.endian();
    let interp = elf
        .elf_program_headers()
        .iter()
        .any(|ph| ph.p_type.get(endian) == object::elf::PT_INTERP);
    assert!(
        !interp,
        "{kernel}: {gostw} asks for a program interpreter: not the static build"
    );
    let version = std::process::Command::new(gostw)
        .arg("--version")
        .output()
        .unwrap();
    assert!(
        version.status.success(),
        "{kernel}: {gostw} --version failed"
    );
    eprintln!(
        "{kernel}: {} ({} bytes, static)",
        String::from_utf8_lossy(&version.stdout).trim(),
        data.len()
    );
}

/// A guest stall made on purpose, to show what the suite does with one: it
/// prints nothing for twice the guest's quiet limit (`GOSTW_VM_QUIET_SECS`),
/// so the guest's watchdog takes it as stalled, the host boots the guest
/// once more, and the second stall fails the run, with the test and the
/// console's last lines in the summary. Run by hand:
/// `cargo xtask vm-test --quiet-limit-secs 45 -- --ignored vm_env::a_guest_stall_on_purpose`.
#[test]
#[ignore = "a guest stall on purpose: run with cargo xtask vm-test --quiet-limit-secs 45 -- --ignored"]
fn a_guest_stall_on_purpose() {
    let quiet: u64 = std::env::var("GOSTW_VM_QUIET_SECS")
        .expect("GOSTW_VM_QUIET_SECS is not set: this test runs in the VM only")
        .parse()
        .expect("GOSTW_VM_QUIET_SECS is a number of seconds");
    std::thread::sleep(std::time::Duration::from_secs(2 * quiet));
}
