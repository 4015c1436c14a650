//! The agent's container image: `deploy/Dockerfile` (FROM scratch, the
//! static `gostw` alone) built by buildah, with no Docker engine, into
//! storage of its own under `target/dist`, and saved as an OCI archive
//! (`podman load` / `ctr image import` take it).
//!
//! Checked before it is called done: podman starts it as the DaemonSet
//! would (`deploy/kubernetes/gostw-agent.yaml`: the host's pid namespace, a
//! read-only root, every capability dropped but the ones the manifest adds,
//! read from it, and seccomp unconfined), its `/healthz` answers, and a Go
//! program started on the host shows up in its `/metrics` with pauses.

use std::{
    fs,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail, ensure};
use gostw_scenario::loopback::{free_port, http_get, samples};

use crate::{
    arch::Arch,
    cmd::{exec, output, step, workspace_root},
    demo, go,
};

const DOCKERFILE: &str = "deploy/Dockerfile";
const DAEMONSET: &str = "deploy/kubernetes/gostw-agent.yaml";

/// buildah and podman with this build's own storage (vfs: no overlay
/// mounts needed, and nothing left in the host's /var/lib/containers).
fn tool(name: &str, dist: &Path) -> Command {
    let mut c = Command::new(name);
    c.arg("--root")
        .arg(dist.join("containers/storage"))
        .arg("--runroot")
        .arg(dist.join("containers/run"))
        .args(["--storage-driver", "vfs"]);
    c
}

/// Build the image from `binary` (built for `arch`), save it as
/// `gostw-VERSION-image.tar` (amd64) or `gostw-VERSION-arm64-image.tar`,
/// and check it: the amd64 one runs as the DaemonSet runs it; the arm64 one
/// (this host cannot run it) says arm64 and holds exactly that binary.
/// Returns the archive.
pub fn build_and_check(
    dist: &Path,
    binary: &Path,
    version: &str,
    arch: Arch,
) -> anyhow::Result<PathBuf> {
    for t in ["buildah", "podman"] {
        ensure!(
            Command::new(t)
                .arg("--version")
                .stdout(Stdio::null())
                .status()
                .is_ok_and(|s| s.success()),
            "{t} not found: `cargo xtask setup` installs Debian's buildah and podman"
        );
    }
    let suffix = match arch {
        Arch::Amd64 => String::new(),
        Arch::Arm64 => format!("-{}", arch.name()),
    };
    let tag = format!("localhost/gostw:{version}{suffix}");
    let context = dist.join("image-context");
    let _ = fs::remove_dir_all(&context);
    fs::create_dir_all(&context)?;
    fs::copy(binary, context.join("gostw"))?;
    exec(
        tool("buildah", dist)
            .args([
                "bud",
                "--quiet",
                "--arch",
                arch.name(),
                "--os",
                "linux",
                "--file",
            ])
            .arg(workspace_root().join(DOCKERFILE))
            .args(["--tag", &tag])
            .arg(&context),
    )?;
    fs::remove_dir_all(&context)?;
    let archive = dist.join(format!("gostw-{version}{suffix}-image.tar"));
    let _ = fs::remove_file(&archive);
    exec(
        tool("podman", dist)
            .args(["save", "--format", "oci-archive", "--output"])
            .arg(&archive)
            .arg(&tag),
    )?;
    match arch {
        Arch::Amd64 => {
            step("the image, run as the DaemonSet runs it");
            run_as_daemonset(dist, &tag)?;
        }
        Arch::Arm64 => {
            step("the arm64 image: its architecture and its binary");
            holds(dist, &tag, arch, binary)?;
        }
    }
    Ok(archive)
}

/// The image `tag` says it is for `arch` and its `/usr/bin/gostw` is
/// `binary`, byte for byte (read from a container created, not started).
fn holds(dist: &Path, tag: &str, arch: Arch, binary: &Path) -> anyhow::Result<()> {
    let said = output(
        tool("podman", dist)
            .args(["image", "inspect", "--format", "{{.Os}}/{{.Architecture}}"])
            .arg(tag),
    )?;
    ensure!(
        said.trim() == format!("linux/{}", arch.name()),
        "the image says {}, not linux/{}",
        said.trim(),
        arch.name()
    );
    let id = output(
        tool("podman", dist)
            .args(["create", "--arch", arch.name()])
            .arg(tag),
    )?;
    let id = id.trim();
    let copied = dist.join("image-binary");
    let _ = fs::remove_file(&copied);
    let cp = exec(
        tool("podman", dist)
            .arg("cp")
            .arg(format!("{id}:/usr/bin/gostw"))
            .arg(&copied),
    );
    let _ = tool("podman", dist)
        .args(["rm", "--force", id])
        .stdout(Stdio::null())
        .status();
    cp?;
    let same = fs::read(&copied)? == fs::read(binary)?;
    fs::remove_file(&copied)?;
    ensure!(
        same,
        "the image's /usr/bin/gostw is not {}",
        binary.display()
    );
    eprintln!(
        "linux/{}, /usr/bin/gostw = {}",
        arch.name(),
        binary.display()
    );
    Ok(())
}

/// The capabilities the DaemonSet adds (its `add:` list).
fn daemonset_capabilities() -> anyhow::Result<Vec<String>> {
    let manifest = fs::read_to_string(workspace_root().join(DAEMONSET))?;
    let mut caps = Vec::new();
    let mut in_add = false;
    for line in manifest.lines() {
        let t = line.trim();
        if t == "add:" {
            in_add = true;
            continue;
        }
        if in_add {
            match t.strip_prefix("- ") {
                Some(item) => caps.push(
                    item.split_whitespace()
                        .next()
                        .unwrap_or_default()
                        .to_owned(),
                ),
                None if t.starts_with('#') => {}
                None => break,
            }
        }
    }
    ensure!(!caps.is_empty(), "no capabilities added in {DAEMONSET}");
    ensure!(
        manifest.contains("hostPID: true") && manifest.contains("readOnlyRootFilesystem: true"),
        "{DAEMONSET} no longer runs in the host's pid namespace with a read-only root"
    );
    Ok(caps)
}

/// This process's soft and hard limit of `name` ("Max open files"), for
/// podman: runc cannot raise a container's limit past the caller's, and
/// podman's default asks more than some hosts allow.
fn own_limit(name: &str) -> anyhow::Result<String> {
    let limits = fs::read_to_string("/proc/self/limits")?;
    let line = limits
        .lines()
        .find(|l| l.starts_with(name))
        .with_context(|| format!("no {name} in /proc/self/limits"))?;
    let v: Vec<&str> = line[name.len()..].split_whitespace().collect();
    let n = |s: &str| {
        if s == "unlimited" {
            "-1".to_owned()
        } else {
            s.to_owned()
        }
    };
    Ok(format!("{}:{}", n(v[0]), n(v[1])))
}

fn run_as_daemonset(dist: &Path, tag: &str) -> anyhow::Result<()> {
    let caps = daemonset_capabilities()?;
    let port = free_port()?;
    let name = format!("gostw-dist-check-{}", std::process::id());
    let mut run = tool("podman", dist);
    run.args(["run", "--detach", "--rm", "--name", &name])
        .args(["--pid=host", "--network=host", "--read-only"])
        .args(["--cap-drop=ALL", &format!("--cap-add={}", caps.join(","))])
        .args(["--security-opt", "seccomp=unconfined"])
        .args([
            "--ulimit",
            &format!("nofile={}", own_limit("Max open files")?),
        ])
        // podman's default process limit is refused here ("error setting
        // rlimit type 6"), as is this process's own; the agent runs a few
        // threads.
        .args(["--ulimit", "nproc=1024:1024"]);
    for dir in ["/sys/kernel/tracing", "/sys/kernel/debug"] {
        if Path::new(dir).is_dir() {
            run.args(["--volume", &format!("{dir}:{dir}:ro")]);
        }
    }
    run.arg(tag)
        .args(["agent", &format!("--listen=127.0.0.1:{port}")])
        .args(["--poll-interval", "200ms"]);
    exec(&mut run)?;
    let result = check_agent(port);
    let logs = tool("podman", dist).args(["logs", &name]).output();
    let _ = tool("podman", dist)
        .args(["rm", "--force", &name])
        .stdout(Stdio::null())
        .status();
    if result.is_err()
        && let Ok(l) = logs
    {
        eprintln!(
            "the image's agent said:\n{}{}",
            String::from_utf8_lossy(&l.stdout),
            String::from_utf8_lossy(&l.stderr)
        );
    }
    result
}

/// `/healthz` answers, and a Go program started now is traced with pauses.
fn check_agent(port: u16) -> anyhow::Result<()> {
    wait("the image's agent to answer /healthz", || {
        http_get(port, "/healthz").filter(|(s, _)| *s == 200)
    })?;
    eprintln!("/healthz: 200");
    let toolchain = go::toolchain(go::DEFAULT).context("the default Go is in the matrix")?;
    let stw = demo::build_stw_workload(toolchain, go::DEFAULT)?;
    let mut program = Command::new(&stw)
        .args(["-duration", "5s", "-gc", "5", "-alloc-mb", "8"])
        .stdout(Stdio::null())
        .spawn()
        .context("starting the stw workload")?;
    let pid = program.id();
    let traced = wait("the image's agent to count the program's pauses", || {
        let (_, body) = http_get(port, "/metrics")?;
        let entries: f64 = samples(&body, "gostw_stop_the_world_entries_total")
            .iter()
            .filter(|(labels, _)| labels.contains("executable=\"stw\""))
            .map(|(_, v)| v)
            .sum();
        (entries > 0.0).then_some(entries)
    });
    let _ = program.kill();
    let _ = program.wait();
    let entries = traced?;
    eprintln!(
        "the image's agent counted {entries} stops of pid {pid} (stw, Go {})",
        go::DEFAULT
    );
    Ok(())
}

fn wait<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> anyhow::Result<T> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(v) = f() {
            return Ok(v);
        }
        if Instant::now() > deadline {
            bail!("timed out after 30s waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}
