//! Processes in containers of a real containerd (Debian's package, started
//! here with its own socket, root and state): the agent labels their series
//! and slow-pause records with the Kubernetes names that CRI puts on every
//! container (`io.kubernetes.pod.name`, `...pod.namespace`,
//! `...container.name`), here set by `ctr run --label` as CRI would; a
//! container without them keeps its id; a container started in its place
//! (as Kubernetes does at a restart or a rollout, under a new id) gets its
//! own names and the old series go.

use std::{
    fs,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Duration,
};

use crate::{
    agent::{Procs, start_agent, sum_series},
    loopback::{free_port, http_get, wait_until},
    support::{build_workload_env, newest_go, require_root},
};

/// A containerd of this test's own, its containers removed on drop.
struct Containerd {
    socket: PathBuf,
    dir: PathBuf,
    containers: Vec<String>,
}

impl Containerd {
    fn start(procs: &mut Procs) -> Containerd {
        for tool in ["containerd", "ctr", "runc", "containerd-shim-runc-v2"] {
            assert!(
                Command::new("sh")
                    .args(["-c", &format!("command -v {tool}")])
                    .stdout(Stdio::null())
                    .status()
                    .unwrap()
                    .success(),
                "{tool} not found: `cargo xtask setup` installs Debian's containerd and runc"
            );
        }
        let dir = procs.dir().join("containerd");
        fs::create_dir_all(&dir).unwrap();
        let socket = dir.join("containerd.sock");
        let config = dir.join("config.toml");
        // No CRI plugin (it would want CNI): containers are made with ctr.
        fs::write(
            &config,
            format!(
                "version = 2\nroot = \"{0}/root\"\nstate = \"{0}/state\"\n\
                 disabled_plugins = [\"io.containerd.grpc.v1.cri\"]\n\
                 [grpc]\n  address = \"{1}\"\n[ttrpc]\n  address = \"{1}.ttrpc\"\n",
                dir.display(),
                socket.display()
            ),
        )
        .unwrap();
        let log = fs::File::create(dir.join("containerd.log")).unwrap();
        procs.spawn(
            "containerd",
            Command::new("containerd")
                .arg("--config")
                .arg(&config)
                .stdout(Stdio::null())
                .stderr(log),
        );
        let c = Containerd {
            socket,
            dir,
            containers: Vec::new(),
        };
        wait_until("containerd to answer", Duration::from_secs(30), || {
            c.ctr(&["version"]).then_some(())
        });
        c
    }

    fn ctr(&self, args: &[&str]) -> bool {
        Command::new("ctr")
            .arg("--address")
            .arg(&self.socket)
            .args(["--namespace", "k8s.io"])
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .unwrap()
            .success()
    }

    /// Run `program` (with `args`) as `/<its file name>` in a container of
    /// its own rootfs, with `labels`; returns the 64-hex container id.
    fn run(&mut self, program: &Path, args: &[&str], labels: &[(&str, &str)]) -> String {
        let id = random_id();
        let rootfs = self.dir.join(format!("rootfs-{}", &id[..12]));
        fs::create_dir_all(&rootfs).unwrap();
        let name = program.file_name().unwrap().to_str().unwrap();
        fs::copy(program, rootfs.join(name)).unwrap();
        let mut cmd: Vec<String> = vec!["run".into(), "--rootfs".into(), "--detach".into()];
        for (k, v) in labels {
            cmd.extend(["--label".into(), format!("{k}={v}")]);
        }
        cmd.extend([rootfs.display().to_string(), id.clone(), format!("/{name}")]);
        cmd.extend(args.iter().map(|a| a.to_string()));
        let cmd: Vec<&str> = cmd.iter().map(String::as_str).collect();
        assert!(self.ctr(&cmd), "ctr {cmd:?} failed");
        self.containers.push(id.clone());
        id
    }

    /// Kill and delete container `id`.
    fn remove(&mut self, id: &str) {
        self.ctr(&["task", "kill", "--signal", "SIGKILL", id]);
        wait_until("the task to stop", Duration::from_secs(10), || {
            self.ctr(&["task", "delete", id]).then_some(())
        });
        assert!(self.ctr(&["container", "delete", id]), "deleting {id}");
        self.containers.retain(|c| c != id);
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        for id in std::mem::take(&mut self.containers) {
            self.ctr(&["task", "kill", "--signal", "SIGKILL", &id]);
            for _ in 0..50 {
                if self.ctr(&["task", "delete", &id]) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            self.ctr(&["container", "delete", &id]);
        }
    }
}

/// A fresh 64-hex container id, as runtimes make them.
fn random_id() -> String {
    let bytes = fs::read("/proc/sys/kernel/random/uuid").unwrap();
    let more = fs::read("/proc/sys/kernel/random/uuid").unwrap();
    let hex: String = [bytes, more]
        .concat()
        .into_iter()
        .filter(u8::is_ascii_hexdigit)
        .map(char::from)
        .collect();
    hex[..64].to_owned()
}

/// `labels` as `Containerd::run` takes them.
fn pairs<'a>(labels: &'a [(&'static str, String)]) -> Vec<(&'static str, &'a str)> {
    labels.iter().map(|(k, v)| (*k, v.as_str())).collect()
}

/// The stop-the-world entries the agent on `port` counts for executable
/// `exe` in the series that carry every one of `labels` (`name="value"`).
fn entries(port: u16, exe: &str, labels: &[&str]) -> f64 {
    let (_, body) = http_get(port, "/metrics").unwrap_or_default();
    let exe = format!("executable=\"{exe}\"");
    let mut all = vec![exe.as_str()];
    all.extend(labels);
    sum_series(&body, "gostw_stop_the_world_entries_total", &all)
}

/// Stop the agent started last in `procs`.
fn stop_newest_agent(procs: &mut Procs) {
    let (_, mut agent) = procs.children.pop().unwrap();
    let _ = agent.kill();
    let _ = agent.wait();
}

/// The slow-pause records the agent serves for `query` (JSON lines).
fn records(port: u16, query: &str) -> Vec<serde_json::Value> {
    let (status, body) = http_get(port, &format!("/debug/pauses?format=json&{query}"))
        .expect("the agent answers /debug/pauses");
    assert_eq!(status, 200, "{body}");
    body.lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn agent_names_pods_namespaces_and_containers_from_containerd() {
    require_root();
    let go = newest_go();
    // Static: the container's root holds nothing but the program.
    let bin = build_workload_env("stw", &go, "-static", &[], &[("CGO_ENABLED", "0")]);
    let mut procs = Procs::new("containers");
    let mut containerd = Containerd::start(&mut procs);
    // Named for this run, so the agent traces this test's containers only.
    let program = procs
        .dir()
        .join(format!("gostw-ctr-{}", std::process::id()));
    fs::copy(&bin, &program).unwrap();
    let exe = program.file_name().unwrap().to_str().unwrap().to_owned();
    let port = free_port();
    let socket = containerd.socket.display().to_string();
    let log = start_agent(
        &mut procs,
        port,
        &format!("^/{exe}$"),
        &["--containerd-socket", &socket, "--slow-pause", "0"],
    );
    let workload = ["-duration", "60s", "-gc", "1", "-alloc-mb", "4"];
    let k8s = |pod: &str| {
        vec![
            ("io.kubernetes.pod.name", pod.to_owned()),
            ("io.kubernetes.pod.namespace", "shop".to_owned()),
            ("io.kubernetes.container.name", "app".to_owned()),
        ]
    };
    let web0 = k8s("web-0");
    let named = containerd.run(&program, &workload, &pairs(&web0));
    let plain = containerd.run(&program, &workload, &[]);
    let counted = |filters: &[&str]| entries(port, &exe, filters);
    let series = |filters: &[&str]| {
        wait_until(
            &format!("a series with {filters:?}"),
            Duration::from_secs(30),
            || (counted(filters) > 0.0).then_some(()),
        )
    };
    series(&[
        r#"container="app""#,
        r#"namespace="shop""#,
        r#"pod="web-0""#,
    ]);
    let plain_labels = [
        format!("container=\"{}\"", &plain[..12]),
        r#"namespace="""#.to_owned(),
        r#"pod="""#.to_owned(),
    ];
    series(&plain_labels.iter().map(String::as_str).collect::<Vec<_>>());
    // Nothing labelled wrongly: every series of the program is one of the two.
    let all = counted(&[]);
    let web0_now = counted(&[r#"pod="web-0""#]);
    let plain_now = counted(&plain_labels.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(
        (all - web0_now - plain_now).abs() < 1e-9,
        "series other than the two containers' ({all} entries, {web0_now} + {plain_now})"
    );

    // The records carry the same names, and the query selects by them.
    let by_pod = records(port, "pod=web-0&limit=100000");
    assert!(!by_pod.is_empty(), "no slow-pause record of pod web-0");
    for r in &by_pod {
        assert_eq!(
            (
                &r["labels"]["namespace"],
                &r["labels"]["pod"],
                &r["labels"]["container"]
            ),
            (
                &serde_json::json!("shop"),
                &serde_json::json!("web-0"),
                &serde_json::json!("app")
            ),
            "{r}"
        );
    }
    // Series come from the kernel's counts, read on the agent's tick;
    // records from the ring buffer's events, drained after it: a series can
    // be there before any record of its process (one run in three here read
    // the records once, found none of the unlabelled container, and
    // failed). Wait for them as for the series.
    let everything = wait_until(
        "a record of the unlabelled container",
        Duration::from_secs(30),
        || {
            let all = records(port, &format!("executable={exe}&limit=100000"));
            all.iter().any(|r| r["labels"]["pod"] == "").then_some(all)
        },
    );
    let unnamed: Vec<&serde_json::Value> = everything
        .iter()
        .filter(|r| r["labels"]["pod"] == "")
        .collect();
    for r in &unnamed {
        assert_eq!(r["labels"]["container"], plain[..12], "{r}");
        assert_eq!(r["labels"]["namespace"], "", "{r}");
    }
    assert!(
        everything.len() >= by_pod.len() + unnamed.len(),
        "{} records, {} of web-0, {} unnamed",
        everything.len(),
        by_pod.len(),
        unnamed.len()
    );

    // A new pod in the old one's place (a rollout: new id, new names): its
    // own series appear and the old pod's go with its process.
    containerd.remove(&named);
    let web1 = k8s("web-1");
    containerd.run(&program, &workload, &pairs(&web1));
    series(&[
        r#"container="app""#,
        r#"namespace="shop""#,
        r#"pod="web-1""#,
    ]);
    wait_until(
        "the old pod's series to go",
        Duration::from_secs(30),
        || (counted(&[r#"pod="web-0""#]) == 0.0).then_some(()),
    );
    let agent_log = fs::read_to_string(&log).unwrap();
    assert!(
        !agent_log.contains("container names unavailable"),
        "the agent could not ask containerd:\n{agent_log}"
    );
    eprintln!(
        "records: {} of pod web-0, {} of the unlabelled container, {} in all",
        by_pod.len(),
        unnamed.len(),
        everything.len()
    );
}

/// Podman (Debian's package, storage of this test's own): a container's
/// name, read from Podman's storage, becomes its `container` label; with
/// `--podman-root off` the same container is labelled by id.
#[test]
fn agent_names_podman_containers_from_their_storage() {
    require_root();
    let go = newest_go();
    let bin = build_workload_env("stw", &go, "-static", &[], &[("CGO_ENABLED", "0")]);
    let mut procs = Procs::new("podman");
    let root = procs.dir().join("storage");
    let podman = |args: &[&str]| {
        let mut c = Command::new("podman");
        c.arg("--root")
            .arg(&root)
            .arg("--runroot")
            .arg(procs_dir_run(&root))
            .args(["--storage-driver", "vfs"])
            .args(args);
        c
    };
    let exe = format!("gostw-pod-{}", std::process::id());
    let context = procs.dir().join("image");
    fs::create_dir_all(&context).unwrap();
    fs::copy(&bin, context.join(&exe)).unwrap();
    fs::write(
        context.join("Containerfile"),
        format!("FROM scratch\nCOPY {exe} /{exe}\nENTRYPOINT [\"/{exe}\"]\n"),
    )
    .unwrap();
    let built = podman(&["build", "--quiet", "--tag", "localhost/gostw-stw-test"])
        .arg(&context)
        .stdout(Stdio::null())
        .status()
        .expect("podman not found: `cargo xtask setup` installs Debian's podman");
    assert!(built.success(), "podman build failed");
    let name = format!("stw-web-{}", std::process::id());
    let run = |name: &str| {
        let out = podman(&["run", "--detach", "--rm", "--network=host"])
            // podman's default limits are more than runc may set on some hosts.
            .args([
                "--ulimit",
                "nproc=1024:1024",
                "--ulimit",
                "nofile=1024:1024",
            ])
            .args(["--name", name])
            .args([
                "localhost/gostw-stw-test",
                "-duration",
                "60s",
                "-gc",
                "1",
                "-alloc-mb",
                "4",
            ])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "podman run: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    };
    let id = run(&name);
    let _stop = Stop(Box::new({
        let root = root.clone();
        let name = name.clone();
        move || {
            let _ = Command::new("podman")
                .arg("--root")
                .arg(&root)
                .arg("--runroot")
                .arg(procs_dir_run(&root))
                .args(["--storage-driver", "vfs", "rm", "--force", &name])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
    }));
    for (podman_root, label) in [
        (root.display().to_string(), format!("container=\"{name}\"")),
        ("off".to_owned(), format!("container=\"{}\"", &id[..12])),
    ] {
        let port = free_port();
        start_agent(
            &mut procs,
            port,
            &format!("^/{exe}$"),
            &["--containerd-socket", "off", "--podman-root", &podman_root],
        );
        wait_until(
            &format!("a series with {label} (--podman-root {podman_root})"),
            Duration::from_secs(30),
            || (entries(port, &exe, &[&label]) > 0.0).then_some(()),
        );
        stop_newest_agent(&mut procs);
    }
}

/// Podman's run root beside its storage root.
fn procs_dir_run(root: &Path) -> PathBuf {
    root.with_file_name("run")
}

/// Runs its closure on drop (also when the test panics).
struct Stop(Box<dyn FnMut()>);

impl Drop for Stop {
    fn drop(&mut self) {
        (self.0)();
    }
}

/// A Docker daemon of this test's own (Debian's docker.io; its own socket,
/// data and exec roots, no network set-up), its containers removed and the
/// daemon stopped on drop.
struct Dockerd {
    socket: PathBuf,
    daemon: std::process::Child,
    containers: Vec<String>,
}

impl Dockerd {
    fn start(dir: &Path) -> Dockerd {
        assert!(
            Path::new("/usr/sbin/dockerd").exists(),
            "dockerd not found: `cargo xtask setup` installs Debian's docker.io"
        );
        fs::create_dir_all(dir).unwrap();
        let socket = dir.join("docker.sock");
        let daemon = Command::new("/usr/sbin/dockerd")
            .arg(format!("--host=unix://{}", socket.display()))
            .arg(format!("--data-root={}", dir.join("data").display()))
            .arg(format!("--exec-root={}", dir.join("exec").display()))
            .arg(format!("--pidfile={}", dir.join("docker.pid").display()))
            .args(["--iptables=false", "--ip6tables=false", "--bridge=none"])
            .args(["--storage-driver", "vfs"])
            .stdout(Stdio::null())
            .stderr(fs::File::create(dir.join("dockerd.log")).unwrap())
            .spawn()
            .unwrap();
        let d = Dockerd {
            socket,
            daemon,
            containers: Vec::new(),
        };
        wait_until("dockerd to answer", Duration::from_secs(30), || {
            d.docker(&["version"]).status.success().then_some(())
        });
        d
    }

    fn docker(&self, args: &[&str]) -> std::process::Output {
        // Debian's client, the daemon's own version.
        Command::new("/usr/bin/docker")
            .arg(format!("--host=unix://{}", self.socket.display()))
            .args(args)
            .output()
            .unwrap()
    }

    /// Run `image` (with `args`) as container `name` with `labels`; returns
    /// its 64-hex id.
    fn run(&mut self, name: &str, image: &str, args: &[&str], labels: &[(&str, &str)]) -> String {
        let mut cmd = vec![
            "run".to_owned(),
            "--detach".into(),
            "--network=none".into(),
            format!("--name={name}"),
        ];
        cmd.extend(labels.iter().map(|(k, v)| format!("--label={k}={v}")));
        cmd.push(image.into());
        cmd.extend(args.iter().map(|a| a.to_string()));
        let out = self.docker(&cmd.iter().map(String::as_str).collect::<Vec<_>>());
        assert!(
            out.status.success(),
            "docker run: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        self.containers.push(name.to_owned());
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }
}

impl Drop for Dockerd {
    fn drop(&mut self) {
        for name in std::mem::take(&mut self.containers) {
            self.docker(&["rm", "--force", &name]);
        }
        // SIGTERM: dockerd stops the containerd it started.
        let _ = Command::new("kill")
            .arg(self.daemon.id().to_string())
            .status();
        for _ in 0..100 {
            if self.daemon.try_wait().ok().flatten().is_some() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.daemon.kill();
        let _ = self.daemon.wait();
    }
}

/// Docker (Debian's docker.io, a daemon of this test's own): a container
/// with Kubernetes' labels (as cri-dockerd makes them) is labelled with its
/// pod, namespace and container name; one without them by its Docker name;
/// with `--docker-socket off` the same container is labelled by its id.
#[test]
fn agent_names_docker_containers_from_the_engine_api() {
    require_root();
    let go = newest_go();
    let bin = build_workload_env("stw", &go, "-static", &[], &[("CGO_ENABLED", "0")]);
    let mut procs = Procs::new("docker");
    let exe = format!("gostw-dock-{}", std::process::id());
    let rootfs = procs.dir().join("rootfs");
    fs::create_dir_all(&rootfs).unwrap();
    fs::copy(&bin, rootfs.join(&exe)).unwrap();
    let tar = procs.dir().join("rootfs.tar");
    assert!(
        Command::new("tar")
            .arg("-C")
            .arg(&rootfs)
            .arg("-cf")
            .arg(&tar)
            .arg(".")
            .status()
            .unwrap()
            .success()
    );
    let mut docker = Dockerd::start(&procs.dir().join("dockerd"));
    let image = "gostw-stw-test";
    let out = docker.docker(&["import", &tar.display().to_string(), image]);
    assert!(
        out.status.success(),
        "docker import: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let program = format!("/{exe}");
    let workload = [&program, "-duration", "60s", "-gc", "1", "-alloc-mb", "4"];
    let suffix = std::process::id();
    let plain = format!("stw-plain-{suffix}");
    let plain_id = docker.run(&plain, image, &workload, &[("team", "payments")]);
    docker.run(
        &format!("k8s_app_web-0_shop-{suffix}"),
        image,
        &workload,
        &[
            ("io.kubernetes.pod.name", "web-0"),
            ("io.kubernetes.pod.namespace", "shop"),
            ("io.kubernetes.container.name", "app"),
        ],
    );
    let socket = docker.socket.display().to_string();
    let by_name = format!("container=\"{plain}\"");
    let by_id = format!("container=\"{}\"", &plain_id[..12]);
    for (docker_socket, expected) in [
        (
            socket.as_str(),
            vec![
                vec![by_name.as_str(), r#"pod="""#, r#"namespace="""#],
                vec![
                    r#"container="app""#,
                    r#"pod="web-0""#,
                    r#"namespace="shop""#,
                ],
            ],
        ),
        ("off", vec![vec![by_id.as_str(), r#"pod="""#]]),
    ] {
        let port = free_port();
        let log = start_agent(
            &mut procs,
            port,
            &format!("^/{exe}$"),
            &[
                "--containerd-socket",
                "off",
                "--podman-root",
                "off",
                "--docker-socket",
                docker_socket,
            ],
        );
        for labels in &expected {
            wait_until(
                &format!("a series with {labels:?} (--docker-socket {docker_socket})"),
                Duration::from_secs(30),
                || (entries(port, &exe, labels) > 0.0).then_some(()),
            );
        }
        if docker_socket != "off" {
            // Every series of the program is one of the two containers'.
            let all = entries(port, &exe, &[]);
            let named: f64 = expected.iter().map(|l| entries(port, &exe, l)).sum();
            assert!(
                (all - named).abs() < 1e-9,
                "series other than the two containers' ({all} entries, {named} named)"
            );
            let agent_log = fs::read_to_string(&log).unwrap();
            assert!(
                !agent_log.contains("container names unavailable"),
                "the agent could not ask Docker:\n{agent_log}"
            );
        }
        stop_newest_agent(&mut procs);
    }
}
