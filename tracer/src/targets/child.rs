//! Starting a program under gostw: it must not run a single Go instruction
//! before its pid is in the traced set, or its first pauses would be missed.

use std::{
    ffi::OsStr,
    io,
    process::{Child, Command},
};

use anyhow::{Context as _, bail};

/// A child process held stopped just before `exec` of the real program.
pub struct StoppedChild {
    pub child: Child,
}

impl StoppedChild {
    /// Start `program args...` stopped. A shell stops itself with SIGSTOP and,
    /// once continued, execs the program in the same pid, so the pid is known
    /// before the program's first instruction. (Stopping in `pre_exec` instead
    /// would deadlock: `spawn` waits for the exec to happen.)
    pub fn spawn<S: AsRef<OsStr>>(
        program: S,
        args: &[S],
        configure: impl FnOnce(&mut Command),
    ) -> anyhow::Result<Self> {
        let mut cmd = Command::new("/bin/sh");
        cmd.arg("-c")
            .arg(r#"kill -STOP $$ && exec "$0" "$@""#)
            .arg(program.as_ref())
            .args(args.iter().map(AsRef::as_ref));
        configure(&mut cmd);
        let child = cmd
            .spawn()
            .with_context(|| format!("starting {}", program.as_ref().to_string_lossy()))?;
        let pid = child.id() as libc::pid_t;
        let mut status = 0;
        // SAFETY: waiting on our own child with a valid status pointer.
        let ret = unsafe { libc::waitpid(pid, &mut status, libc::WUNTRACED) };
        if ret != pid {
            bail!(
                "waiting for pid {pid} to stop: {}",
                io::Error::last_os_error()
            );
        }
        if !libc::WIFSTOPPED(status) {
            bail!("pid {pid} exited before it could be traced (status {status:#x})");
        }
        Ok(StoppedChild { child })
    }

    /// The pid the program will run as.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Let the program run: the shell execs it now.
    pub fn resume(self) -> anyhow::Result<Child> {
        // SAFETY: signalling our own child.
        if unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGCONT) } != 0 {
            bail!(
                "resuming pid {}: {}",
                self.child.id(),
                io::Error::last_os_error()
            );
        }
        Ok(self.child)
    }

    /// Kill and reap the stopped program (it was never resumed).
    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
