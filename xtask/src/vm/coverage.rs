//! Which kernel runs which kernel test, and why. Coverage is decided per
//! kernel feature, not per kernel: a test whose code path depends on the
//! kernel runs on the oldest CI kernel that takes that path and on the
//! newest, and on arm64 where gostw's code differs there (registers, probe
//! points, the fault tracepoints arm64 lacks); a kernel in between runs
//! what differs on it. The same table is in the book
//! (`docs/development/vm.md`, "Which kernel runs which test"), and a unit
//! test fails when the two disagree.

/// The guests `cargo xtask test` boots, in the order of the table's columns.
pub const CI_KERNELS: [&str; 5] = [
    "debian-5.10",
    "debian-6.1",
    "debian-6.12",
    "debian-7.3",
    "arm64:debian-6.1",
];

/// The newest amd64 kernel of [`CI_KERNELS`]: every amd64 row runs there.
#[cfg(test)]
const NEWEST: &str = "debian-7.3";

/// One test filter (a libtest substring filter) and the kernels it runs on.
pub struct Row {
    pub test: &'static str,
    pub kernels: &'static [&'static str],
    pub why: &'static str,
}

const OLD_NEW: &[&str] = &["debian-5.10", "debian-7.3"];
const OLD_NEW_ARM: &[&str] = &["debian-5.10", "debian-7.3", "arm64:debian-6.1"];
const OLD_HELPERS_NEW: &[&str] = &["debian-5.10", "debian-6.1", "debian-7.3"];
const OLD_HELPERS_NEW_ARM: &[&str] = &[
    "debian-5.10",
    "debian-6.1",
    "debian-7.3",
    "arm64:debian-6.1",
];
const AMD64: &[&str] = &["debian-5.10", "debian-6.1", "debian-6.12", "debian-7.3"];
const ALL: &[&str] = &CI_KERNELS;

/// The table. Kernel paths (see the book for the details): 5.10 loads the
/// program variants (no `bpf_task_pt_regs`, no `bpf_loop`) and
/// preallocated hash maps; 6.1 is the oldest to load the preferred
/// programs, lacks `filemap:mm_filemap_fault` and has `memory.reclaim`;
/// the kprobe fault backend probes `__lock_page_or_retry` (5.10),
/// `__folio_lock_or_retry` with `swap_readpage` (6.1), and from 6.12 on
/// `swap_read_folio` under per-VMA locks.
pub const COVERAGE: &[Row] = &[
    Row {
        test: "stw_probe::",
        kernels: OLD_NEW_ARM,
        why: "uprobes at stop's entry and start's RET work alike on every kernel; arm64 reads other registers",
    },
    Row {
        test: "pauses::run_reports_every_pause_as_go_counts_it",
        kernels: OLD_NEW_ARM,
        why: "the pause programs and the explanation's scheduler programs (variants on 5.10); arm64 registers",
    },
    Row {
        test: "stopping::stopping_and_total_equal_go_histograms_bucket_for_bucket",
        kernels: OLD_NEW_ARM,
        why: "the stack slot read at start's RET; arm64's frame",
    },
    Row {
        test: "callers::callers_name_the_functions_that_asked_for_the_stop",
        kernels: OLD_NEW_ARM,
        why: "the frame-pointer walk from the stopping goroutine; arm64's frame layout",
    },
    Row {
        test: "vm_env::",
        kernels: AMD64,
        why: "the guest's swap and tracefs kprobes, which every kprobe fault test stands on",
    },
    Row {
        test: "faults::kprobe_backend_",
        kernels: ALL,
        why: "the probed functions differ on each kernel (lock, swap read, per-VMA locks); arm64's argument registers",
    },
    Row {
        test: "faults::tracepoint_backend_with_explain_runs_one_switch_program",
        kernels: OLD_HELPERS_NEW_ARM,
        why: "variants on 5.10; 6.1 has no filemap:mm_filemap_fault; arm64 begins faults at the perf event",
    },
    Row {
        test: "faults::without_pageout_",
        kernels: OLD_NEW,
        why: "the control of the page-out runs: the same programs as theirs",
    },
    Row {
        test: "backend_agreement::",
        kernels: OLD_NEW,
        why: "both fault backends pause by pause, on the oldest and the newest kprobe function set (faults::kprobe_backend_ runs each set)",
    },
    Row {
        test: "stack_growth::sampled_and_exact_agree_on_the_top_site",
        kernels: OLD_HELPERS_NEW_ARM,
        why: "the sampler's user registers: variant on 5.10, bpf_task_pt_regs from 6.1, arm64's registers",
    },
    Row {
        test: "compat::",
        kernels: OLD_HELPERS_NEW,
        why: "variants against the preferred programs: needed on 5.10, optional from 6.1",
    },
    Row {
        test: "check::",
        kernels: ALL,
        why: "gostw check's answer is each kernel's row of the matrix",
    },
    Row {
        test: "memory::pageout_",
        kernels: OLD_HELPERS_NEW,
        why: "cgroup v2 page-out: memory.high on 5.10, memory.reclaim from 5.19",
    },
    Row {
        test: "memory::heap_only_",
        kernels: OLD_HELPERS_NEW,
        why: "cgroup v2 page-out: memory.high on 5.10, memory.reclaim from 5.19",
    },
    Row {
        test: "memory::a_traced_pageout_",
        kernels: OLD_HELPERS_NEW,
        why: "cgroup v2 page-out under tracing: memory.high on 5.10, memory.reclaim from 5.19",
    },
    Row {
        test: "memory::without_pageout_",
        kernels: OLD_NEW,
        why: "the control of the page-out runs",
    },
    Row {
        test: "memory::bad_gone_",
        kernels: OLD_NEW,
        why: "errors for gone and non-Go pids on cgroup v2",
    },
];

/// The test filters a guest runs: its column of [`COVERAGE`] for a CI
/// kernel; every row of its architecture for any other kernel.
pub fn tests_for(entry: &str) -> Vec<&'static Row> {
    let arm64 = entry.starts_with("arm64:");
    let listed = CI_KERNELS.contains(&entry);
    COVERAGE
        .iter()
        .filter(|row| {
            if listed {
                row.kernels.contains(&entry)
            } else {
                row.kernels.iter().any(|k| k.starts_with("arm64:") == arm64)
            }
        })
        .collect()
}

/// Rows of the book's table: (test, kernels marked, why), in its order.
#[cfg(test)]
fn book_rows(page: &str) -> Vec<(String, Vec<&'static str>, String)> {
    let table = page
        .split("## Which kernel runs which test")
        .nth(1)
        .expect("the VM page has a heading \"Which kernel runs which test\"");
    let table = table.split("\n#").next().unwrap_or(table);
    let mut rows = Vec::new();
    for line in table.lines().filter(|l| l.starts_with("| `")) {
        let cells: Vec<&str> = line.trim_matches('|').split('|').map(str::trim).collect();
        let test = cells[0].trim_matches('`').to_owned();
        let kernels = CI_KERNELS
            .iter()
            .enumerate()
            .filter(|(i, _)| cells.get(i + 1).is_some_and(|c| *c == "x"))
            .map(|(_, k)| *k)
            .collect();
        let why = cells.get(CI_KERNELS.len() + 1).unwrap_or(&"").to_string();
        rows.push((test, kernels, why));
    }
    rows
}

#[cfg(test)]
mod tests {
    use super::*;

    fn code_rows() -> Vec<(String, Vec<&'static str>, String)> {
        COVERAGE
            .iter()
            .map(|r| {
                let kernels = CI_KERNELS
                    .iter()
                    .filter(|k| r.kernels.contains(k))
                    .copied()
                    .collect();
                (r.test.to_owned(), kernels, r.why.to_owned())
            })
            .collect()
    }

    #[test]
    fn the_book_s_table_is_the_code_s() {
        let page =
            std::fs::read_to_string(crate::cmd::workspace_root().join("docs/development/vm.md"))
                .unwrap();
        assert_eq!(book_rows(&page), code_rows());
    }

    /// The control: a list that drops a kernel-dependent test (here
    /// `compat::` on 5.10) no longer matches the book.
    #[test]
    fn a_dropped_test_breaks_the_agreement() {
        let page =
            std::fs::read_to_string(crate::cmd::workspace_root().join("docs/development/vm.md"))
                .unwrap();
        let mut rows = code_rows();
        let compat = rows.iter_mut().find(|(t, _, _)| t == "compat::").unwrap();
        compat.1.retain(|k| *k != "debian-5.10");
        assert_ne!(book_rows(&page), rows);
    }

    #[test]
    fn every_amd64_row_runs_on_the_oldest_and_the_newest() {
        for row in COVERAGE {
            let amd64 = row.kernels.iter().any(|k| !k.starts_with("arm64:"));
            if amd64 {
                assert!(
                    row.kernels.contains(&NEWEST),
                    "{} not on {NEWEST}",
                    row.test
                );
                assert!(
                    row.kernels.contains(&CI_KERNELS[0]),
                    "{} not on {}",
                    row.test,
                    CI_KERNELS[0]
                );
            }
            for k in row.kernels {
                assert!(
                    CI_KERNELS.contains(k),
                    "{}: {k} is not a CI kernel",
                    row.test
                );
            }
        }
    }

    #[test]
    fn kernels_get_their_column_and_others_the_whole_list() {
        let names =
            |entry: &str| -> Vec<&str> { tests_for(entry).iter().map(|r| r.test).collect() };
        assert!(names("debian-6.12").contains(&"faults::kprobe_backend_"));
        assert!(!names("debian-6.12").contains(&"compat::"));
        assert!(names("debian-6.1").contains(&"compat::"));
        let amd64_rows = COVERAGE
            .iter()
            .filter(|r| r.kernels.iter().any(|k| !k.starts_with("arm64:")))
            .count();
        assert_eq!(tests_for("debian-6.6").len(), amd64_rows);
        assert!(
            names("arm64:debian-6.1")
                .contains(&"callers::callers_name_the_functions_that_asked_for_the_stop")
        );
        assert!(!names("arm64:debian-7.3").contains(&"vm_env::"));
    }
}
