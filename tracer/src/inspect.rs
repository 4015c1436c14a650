//! `gostw inspect`: what gostw finds in a Go binary (or a running process's
//! executable) and how it would trace it on this machine. `--json` prints
//! the `InspectReport` below; docs/guide/inspect.md and docs/reference/json.md document it.

use std::{fmt::Write as _, path::PathBuf};

use crate::{
    binary::{
        Allglen, AllglenSource, BinaryError, FunctionSource, GoBinary, GoFunction, OffsetSource,
        PROBED_FUNCTIONS, PclnFormat, StructOffsets, VersionSource,
        offsets::FIELDS,
        running::{self, ProcessExe},
    },
    image::ProcessImage,
    kernel::capabilities::{self, BackendChoice, FaultBackend},
};

/// Everything `gostw inspect` reports.
#[derive(Debug, serde::Serialize)]
pub struct InspectReport {
    pub schema_version: u32,
    pub path: PathBuf,
    pub process: Option<ProcessReport>,
    pub go_version: String,
    /// Where the version was found (`.go.buildinfo`, else runtime.buildVersion).
    pub version_source: VersionSource,
    pub arch: crate::binary::Arch,
    pub pie: bool,
    pub has_symtab: bool,
    pub has_dwarf: bool,
    pub build_id: Option<String>,
    pub go_build_id: Option<String>,
    pub gnu_build_id: Option<String>,
    pub pclntab: Option<PclntabReport>,
    /// Every probed function by name; `null` if the binary lacks it.
    pub functions: std::collections::BTreeMap<String, Option<FunctionReport>>,
    pub struct_offsets: StructOffsets,
    /// `runtime.allglen` (the peak goroutine count stack growth estimates
    /// memory for); `null` if it cannot be found.
    pub allglen: Option<Allglen>,
    pub fault_backend: BackendChoice,
    /// Programs this kernel needs in their variant for older kernels, and
    /// why (`kernel::compat`); empty on 5.17 and newer.
    pub program_variants: Vec<String>,
}

/// The process an inspected executable was taken from.
#[derive(Debug, serde::Serialize)]
pub struct ProcessReport {
    #[serde(flatten)]
    pub exe: ProcessExe,
    pub load_bias: u64,
}

/// The function table's header.
#[derive(Debug, serde::Serialize)]
pub struct PclntabReport {
    pub format: PclnFormat,
    pub text_start: u64,
    pub functions: usize,
}

/// One probed function.
#[derive(Debug, serde::Serialize)]
pub struct FunctionReport {
    pub address: u64,
    pub size: u64,
    pub file_offset: u64,
    /// Where an entry probe goes (the prologue's stack-check branch).
    pub entry_probe_offset: u64,
    pub ret_file_offsets: Vec<u64>,
    pub source: FunctionSource,
}

impl From<GoFunction> for FunctionReport {
    fn from(f: GoFunction) -> Self {
        FunctionReport {
            address: f.address,
            size: f.size,
            file_offset: f.file_offset,
            entry_probe_offset: f.entry_probe_offset,
            ret_file_offsets: f.ret_file_offsets,
            source: f.source,
        }
    }
}

/// The report for the executable of process `pid`.
pub fn inspect_pid(pid: u32) -> Result<InspectReport, BinaryError> {
    let exe = running::process_exe(pid)?;
    let process = ProcessImage::of_pid(pid)?;
    let load_bias = process.bias().unwrap_or_default();
    inspect(&process.exe.binary, Some(ProcessReport { exe, load_bias }))
}

/// The report for `binary`. Fails if gostw could not trace it (no struct
/// offsets from any source).
pub fn inspect(
    binary: &GoBinary,
    process: Option<ProcessReport>,
) -> Result<InspectReport, BinaryError> {
    let struct_offsets = binary.struct_offsets()?;
    let functions = PROBED_FUNCTIONS
        .iter()
        .map(|&name| {
            let found = match binary.function(name) {
                Ok(f) => Some(f.into()),
                Err(BinaryError::MissingFunction { .. }) => None,
                Err(e) => return Err(e),
            };
            Ok((name.to_owned(), found))
        })
        .collect::<Result<_, BinaryError>>()?;
    let pclntab = binary.pclntab().ok().map(|p| PclntabReport {
        format: p.format,
        text_start: p.text_start,
        functions: p.len(),
    });
    Ok(InspectReport {
        schema_version: 1,
        path: binary.path.clone(),
        process,
        go_version: binary.version_string.clone(),
        version_source: binary.version_source,
        arch: binary.arch,
        pie: binary.pie,
        has_symtab: binary.has_symtab,
        has_dwarf: binary.has_dwarf,
        build_id: binary.build_id().map(str::to_owned),
        go_build_id: binary.go_build_id.clone(),
        gnu_build_id: binary.gnu_build_id.clone(),
        pclntab,
        functions,
        struct_offsets,
        allglen: binary.allglen(),
        fault_backend: capabilities::detect().report(),
        program_variants: crate::kernel::compat::Compat::detect().describe(),
    })
}

fn yes_no(b: bool) -> &'static str {
    if b { "yes" } else { "no" }
}

/// The report as text for a terminal.
pub fn human(r: &InspectReport) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "{}", r.path.display());
    if let Some(p) = &r.process {
        let _ = writeln!(
            s,
            "  process      pid {} runs {}{}, load bias {:#x}",
            p.exe.pid,
            p.exe.exe.display(),
            if p.exe.other_mount_namespace {
                " (another mount namespace)"
            } else {
                ""
            },
            p.load_bias
        );
    }
    let _ = writeln!(
        s,
        "  Go           {} {}, PIE {}, symtab {}, DWARF {}",
        r.go_version,
        r.arch,
        yes_no(r.pie),
        yes_no(r.has_symtab),
        yes_no(r.has_dwarf)
    );
    let _ = writeln!(s, "  version from {}", r.version_source);
    let _ = writeln!(
        s,
        "  build id     Go {} / GNU {}",
        r.go_build_id.as_deref().unwrap_or("-"),
        r.gnu_build_id.as_deref().unwrap_or("-")
    );
    if let Some(p) = &r.pclntab {
        let _ = writeln!(
            s,
            "  pclntab      {} format, {} functions, text at {:#x}",
            pcln_format(p.format),
            p.functions,
            p.text_start
        );
    }
    let _ = match &r.allglen {
        Some(a) => writeln!(
            s,
            "  goroutines   runtime.allglen at {:#x} ({})",
            a.address,
            match a.source {
                AllglenSource::Symtab => "symbol table",
                AllglenSource::AllgaddCode => "from runtime.allgadd's code",
            }
        ),
        None => writeln!(
            s,
            "  goroutines   runtime.allglen not found: stack growth memory estimates need --goroutines"
        ),
    };
    let _ = writeln!(
        s,
        "\nfunctions (address, file offset, RET file offsets, source)"
    );
    for (name, f) in &r.functions {
        match f {
            Some(f) => {
                let rets: Vec<String> = f
                    .ret_file_offsets
                    .iter()
                    .map(|o| format!("{o:#x}"))
                    .collect();
                let _ = writeln!(
                    s,
                    "  {name:<32} {:#10x}  {:#9x}  [{}]  {}",
                    f.address,
                    f.file_offset,
                    rets.join(" "),
                    match f.source {
                        FunctionSource::Symtab => "symtab",
                        FunctionSource::Pclntab => "pclntab",
                    }
                );
            }
            None => {
                let _ = writeln!(s, "  {name:<32} not found");
            }
        }
    }
    let _ = writeln!(s, "\nstruct offsets (bytes, source)");
    for name in FIELDS {
        match r.struct_offsets.fields.get(name) {
            Some(o) => {
                let _ = writeln!(
                    s,
                    "  {name:<52} {:>4}  {}",
                    o.value,
                    offset_source(o.source)
                );
            }
            None => {
                let _ = writeln!(s, "  {name:<52}    -  unknown");
            }
        }
    }
    let _ = writeln!(
        s,
        "\nfault backend: {}\n  {}",
        match r.fault_backend.backend {
            FaultBackend::Kprobe => "kprobes",
            FaultBackend::Tracepoint => "tracepoints + perf events",
            FaultBackend::None => "none",
        },
        r.fault_backend.reason
    );
    if !r.program_variants.is_empty() {
        let _ = writeln!(s, "\nolder kernel, program variants in use:");
        for v in &r.program_variants {
            let _ = writeln!(s, "  {v}");
        }
    }
    s
}

/// A function-table format for people.
fn pcln_format(f: PclnFormat) -> &'static str {
    match f {
        PclnFormat::Go116 => "Go 1.16-1.17",
        PclnFormat::Go118 => "Go 1.18-1.19",
        PclnFormat::Go120 => "Go 1.20+",
    }
}

/// Where a struct offset came from, for people.
fn offset_source(s: OffsetSource) -> &'static str {
    match s {
        OffsetSource::Dwarf => "DWARF",
        OffsetSource::TypeDescriptors => "runtime type descriptors",
        OffsetSource::VersionTable => "version table",
    }
}
